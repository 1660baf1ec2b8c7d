"""Error study of low-precision state checkpoints, teacher-forced against an fp32 model.

For each model (a real-size preset with random fp32 weights, its SSM decays made slow so that the
state keeps a long memory, or a ``tiny:`` model) and weight seed: the fp32 reference decodes
``--steps`` tokens greedily from ``--batch`` random prompts; every variant is then fed the same
tokens, one step at a time through its own cache, by ``generate()`` with a logits processor that
records the step's logits and forces the reference token. Per step, against the reference:

* argmax agreement;
* mean and p99 of |logit difference| in units of the reference logits' standard deviation (over a
  fixed random subset of the vocabulary, ``--vocab-sample`` ids);

each as a function of position (bins of ``--bin`` steps) and overall. Statistics stay on the device
until a variant ends, and patched variants decode with CUDA graphs on a GPU, so 4096 steps of a
real-size model take seconds per variant.

Reference (``--reference``): ``stock`` (the stock model in fp32) or ``replay`` (ReplaySSM with an
fp32 checkpoint, the same recurrence in fp32, for long runs where the stock per-step path is slow:
run both on a shorter horizon to see that they agree). Variants (``--variants``):

* ``stock-bf16``: stock transformers with every recurrent state rounded to bf16 after each forward;
* ``perstep-bf16``: the same rounding in ReplaySSM's fused per-step kernel (``buffer_len=1``, bf16
  state), the per-step bf16-state baseline a serving engine runs, at graph speed;
* ``replay-DTYPE-ROUNDING-LN``: ReplaySSM with a DTYPE checkpoint (fp32, bf16, fp16, fp8, int8),
  nearest or stochastic rounding, buffer length N.

Writes ``OUT/state_error_study.json`` (default ``out/state_error_study``, git-ignored; rewritten after
every variant) and with ``--plot`` a PNG of mean |diff| against position. ``--smoke``: two tiny
models, a few steps, CPU, seconds.

    python examples/benchmarks/state_error_study.py --presets nemotron3-nano-like,qwen3.5-4b-like \\
        --reference replay --steps 4096 --batch 8 --seeds 0 --plot
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
BASELINES = ("stock-bf16", "perstep-bf16")
FULL_VARIANTS = ["perstep-bf16"] + [f"replay-{d}-{r}-L16" for d in DTYPES[1:] for r in ("nearest", "stochastic")] \
    + [f"replay-{v}-L{L}" for v in ("bf16-stochastic", "fp8-stochastic", "int8-nearest") for L in (4, 64)]
SMOKE_VARIANTS = ["stock-bf16", "perstep-bf16", "replay-int8-nearest-L4", "replay-fp8-stochastic-L4",
                  "replay-bf16-stochastic-L4"]


class UsageError(Exception):
    """Bad command-line input (one line, exit status 2)."""


def parse_variant(name: str) -> dict | None:
    """``replay-int8-stochastic-L16`` -> patch options; ``perstep-bf16`` -> its patch options;
    ``stock-bf16`` -> None (the stock model, states rounded after each forward)."""
    if name == "stock-bf16":
        return None
    if name == "perstep-bf16":
        return dict(state_dtype="bf16", state_rounding="nearest", buffer_len=1)
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "replay" or parts[1] not in DTYPES or parts[2] not in ("nearest", "stochastic") \
            or not parts[3].startswith("L") or not parts[3][1:].isdigit():
        raise UsageError(f"unknown variant {name!r}; expected {' or '.join(BASELINES)} or replay-DTYPE-ROUNDING-LN "
                         f"(DTYPE one of {', '.join(DTYPES)}, ROUNDING nearest or stochastic)")
    return dict(state_dtype=parts[1], state_rounding=parts[2], buffer_len=int(parts[3][1:]))


def slow_decays(model, seed: int) -> None:
    """Make every SSM layer remember long: decay rates exp(A_log) in [0.005, 0.05], dt_bias -3
    (softplus 0.05), so that a step decays the state by 2.5e-4 .. 2.5e-3."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                u = torch.rand(p.shape, generator=g)
                p.copy_(torch.log(0.005 + 0.045 * u).to(p.dtype))
            elif name.endswith("dt_bias"):
                p.fill_(-3.0)


def build(model_name: str, device, seed: int):
    if model_name.startswith("tiny:"):
        from replayssm.tiny import build_tiny_model

        model = build_tiny_model(model_name, dtype=torch.float32).to(device)
    else:
        from replayssm.presets import build_preset

        model = build_preset(model_name, torch.float32, device, seed=seed)
    slow_decays(model, seed)
    model.generation_config.eos_token_id = None  # every row decodes every step: no early stop, no EOS masking
    return model.eval()


def round_states_bf16(module, args, kwargs, output) -> None:
    """Forward hook of the ``stock-bf16`` baseline: every recurrent state rounded to bf16 (kept in its dtype)."""
    from replayssm.patches import compat

    for layer in getattr(compat.output_cache(output), "layers", []):
        state = compat.recurrent_state(layer) if hasattr(layer, "recurrent_states") else None
        if state is not None and state.is_floating_point():
            state.copy_(state.to(torch.bfloat16).to(state.dtype))


class TeacherForcing(LogitsProcessor):
    """Logits processor: hands step t's fp32 logits (B, V) to ``on_step(t, logits)``, then, with
    ``tokens`` (B, S), forces token t (every other logit -inf) so that greedy decoding feeds it."""

    def __init__(self, prompt_len: int, on_step, tokens: torch.Tensor | None = None):
        self.prompt_len, self.on_step, self.tokens = prompt_len, on_step, tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len
        self.on_step(t, scores)
        if self.tokens is None:
            return scores
        forced = torch.full_like(scores, -math.inf)
        return forced.scatter_(1, self.tokens[:, t:t + 1], 0.0)


def run_generate(model, ids, steps: int, forcing: TeacherForcing) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                              pad_token_id=0, logits_processor=LogitsProcessorList([forcing]))


def study_one(model_name, seed, args, device, on_variant) -> dict:
    model = build(model_name, device, seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (args.batch, args.prompt_len), generator=g).to(device)
    sample = torch.randperm(vocab, generator=g)[:min(vocab, args.vocab_sample)].to(device)
    S, B = args.steps, args.batch
    ref_argmax = torch.empty(S, B, dtype=torch.long, device=device)
    ref_std = torch.empty(S, B, device=device)
    ref_sub = torch.empty(S, B, sample.numel(), device=device)

    def progress(name, t, start):  # a line per bin on stderr: where a long run spends its time
        if (t + 1) % args.bin == 0:
            print(f"{model_name} seed {seed} {name}: {t + 1}/{S} steps, {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)

    def keep_ref(t, logits):
        ref_argmax[t], ref_std[t], ref_sub[t] = logits.argmax(-1), logits.std(-1), logits[:, sample]
        progress("reference", t, ref_start)

    ref_start = time.perf_counter()
    with VariantModel(model, args.reference, args.backend):
        tokens = run_generate(model, ids, S, TeacherForcing(args.prompt_len, keep_ref))[:, args.prompt_len:]
    results = {}
    for name in args.variants:
        agree, mean, p99 = (torch.full((S,), math.nan, device=device) for _ in range(3))

        def measure(t, logits):
            agree[t] = (logits.argmax(-1) == ref_argmax[t]).float().mean()
            d = (logits[:, sample] - ref_sub[t]).abs() / ref_std[t][:, None]
            mean[t] = d.mean()
            p99[t] = torch.quantile(d.flatten(), 0.99)
            progress(name, t, start)

        start = time.perf_counter()
        with VariantModel(model, name, args.backend) as graphs:
            run_generate(model, ids, S, TeacherForcing(args.prompt_len, measure, tokens))
            captured = any(r.get("captured") for r in graphs())
        results[name] = summarise(agree.tolist(), mean.tolist(), p99.tolist(), args.bin)
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
        results[name]["cuda_graphs"] = captured
        print(json.dumps({"model": model_name, "seed": seed, "variant": name, **results[name]["overall"],
                          "seconds": results[name]["seconds"], "cuda_graphs": captured}), flush=True)
        on_variant(model_name, seed, name, results[name])
    del model
    return results


class VariantModel:
    """Context: ``model`` as the named variant (``stock``/``replay`` references, ``stock-bf16``, a
    patched variant with CUDA graphs where the device has them); yields a ``graph_report`` callable."""

    def __init__(self, model, name: str, backend: str):
        self.model, self.name, self.backend, self.hook, self.patched = model, name, backend, None, False

    def __enter__(self):
        import replayssm

        if self.name == "stock":
            return lambda: []
        if self.name == "stock-bf16":
            self.hook = self.model.register_forward_hook(round_states_bf16, with_kwargs=True)
            return lambda: []
        opts = dict(state_dtype="fp32", buffer_len=16) if self.name == "replay" else parse_variant(self.name)
        replayssm.patch(self.model, backend=self.backend, cuda_graphs=self.model.device.type == "cuda", **opts)
        self.patched = True
        return lambda: replayssm.graph_report(self.model)

    def __exit__(self, *exc):
        import replayssm

        if self.hook is not None:
            self.hook.remove()
        if self.patched:
            replayssm.unpatch(self.model)
        return False


def summarise(agree, mean, p99, bin_size) -> dict:
    n = len(agree)
    bins = []
    for start in range(0, n, bin_size):
        sl = slice(start, min(n, start + bin_size))
        bins.append(dict(start=start, argmax_agreement=_avg(agree[sl]), mean_std=_avg(mean[sl]),
                         p99_std=max(p99[sl])))
    return dict(overall=dict(argmax_agreement=_avg(agree), mean_std=_avg(mean), p99_std=_avg(p99), steps=n),
                by_position=bins)


def _avg(v) -> float:
    return float(sum(v) / len(v)) if v else math.nan


def plot(report, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    models = list(report["results"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        seeds = report["results"][m]
        for variant in [v for v in report["variants"] if all(v in runs for runs in seeds.values())]:
            rows = [seeds[s][variant]["by_position"] for s in seeds]
            xs = [b["start"] for b in rows[0]]
            ys = [sum(r[i]["mean_std"] for r in rows) / len(rows) for i in range(len(xs))]
            ax.plot(xs, ys, label=variant, lw=2 if variant in BASELINES else 1)
        ax.set_title(m)
        ax.set_xlabel("position")
        ax.set_ylabel("mean |Δlogit| / std(fp32 logits)")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="nemotron3-nano-like,qwen3.5-4b-like,kimi-linear-like",
                    help="comma-separated preset names or tiny:FAMILY specs")
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--batch", type=int, default=4, help="prompts per seed (rows decoded together)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--variants", default=",".join(FULL_VARIANTS))
    ap.add_argument("--vocab-sample", type=int, default=8192)
    ap.add_argument("--bin", type=int, default=256, help="positions per bin of the by-position curves")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--reference", choices=("stock", "replay"), default="stock",
                    help="the fp32 reference: the stock model, or ReplaySSM with an fp32 checkpoint (L=16)")
    ap.add_argument("--out", default="out/state_error_study")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny models, a few steps, CPU")
    args = ap.parse_args(argv)
    if args.smoke:
        args.presets, args.steps, args.seeds, args.bin = "tiny:nemotron_h,tiny:qwen3_5", 12, "0", 4
        args.variants, args.backend = ",".join(SMOKE_VARIANTS), "torch"
    args.presets = args.presets.split(",")
    args.variants = args.variants.split(",")
    for v in args.variants:
        parse_variant(v)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise UsageError(f"--seeds takes comma-separated integers; got {args.seeds!r}") from None
    if args.steps < 2 or args.batch < 1 or args.bin < 1:
        raise UsageError("--steps must be at least 2, --batch and --bin positive")
    return args


def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"state_error_study: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = dict(steps=args.steps, seeds=args.seeds, batch=args.batch, variants=args.variants,
                  reference=args.reference, vocab_sample=args.vocab_sample, device=str(device),
                  device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  versions=versions(), results={},
                  command="python examples/benchmarks/state_error_study.py " + " ".join(
                      sys.argv[1:] if argv is None else argv))

    def write(model_name, seed, variant, result):  # after every variant: a cut-short run keeps what it has
        report["results"].setdefault(model_name, {}).setdefault(str(seed), {})[variant] = result
        tmp = out / "state_error_study.json.tmp"
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, out / "state_error_study.json")

    for name in args.presets:
        for seed in args.seeds:
            study_one(name, seed, args, device, write)
    if args.plot and not plot(report, out / "state_error_study.png"):
        print("state_error_study: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


def versions() -> dict:
    import transformers
    import triton

    return dict(torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__)


if __name__ == "__main__":
    sys.exit(main())
