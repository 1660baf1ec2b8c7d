"""Error study of low-precision state checkpoints, teacher-forced against the fp32 stock model.

For each model (a real-size preset with random weights, its SSM decays made slow so that the state
keeps a long memory, or a ``tiny:`` model) and seed: the fp32 stock model decodes ``--steps`` tokens
greedily from a random prompt; every variant is then fed the same tokens one at a time through its
own cache, and its per-step logits are compared with the fp32 model's:

* argmax agreement;
* mean and p99 of |logit difference| in units of the fp32 logits' standard deviation (over a fixed
  random subset of the vocabulary, ``--vocab-sample`` ids, so that 4096 steps of a 150k vocabulary fit
  in memory);

each as a function of position (bins of ``--bin`` steps) and overall. Variants (``--variants``):
``stock-bf16`` (stock transformers with its recurrent state rounded to bf16 after every step: the
per-step baseline a serving engine would otherwise run) and ``replay-DTYPE-ROUNDING-LN`` (ReplaySSM
with a DTYPE checkpoint, nearest or stochastic rounding, buffer length N). Writes
``OUT/state_error_study.json`` (default ``out/state_error_study``, git-ignored) and with ``--plot`` a
PNG of mean |diff| against position. ``--smoke``: two tiny models, a few steps, CPU, seconds.

    python examples/benchmarks/state_error_study.py --presets nemotron3-nano-like,qwen3.5-4b-like \\
        --steps 4096 --seeds 0,1,2 --plot
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

DTYPES = ("bf16", "fp16", "fp8", "int8")
FULL_VARIANTS = ["stock-bf16"] + [f"replay-{d}-{r}-L{L}" for d in DTYPES for r in ("nearest", "stochastic")
                                  for L in (4, 16, 64)]
SMOKE_VARIANTS = ["stock-bf16", "replay-int8-nearest-L4", "replay-fp8-stochastic-L4", "replay-bf16-stochastic-L4"]


class UsageError(Exception):
    """Bad command-line input (one line, exit status 2)."""


def parse_variant(name: str) -> dict | None:
    """``replay-int8-stochastic-L16`` -> patch options; ``stock-bf16`` -> None."""
    if name == "stock-bf16":
        return None
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "replay" or parts[1] not in DTYPES or parts[2] not in ("nearest", "stochastic") \
            or not parts[3].startswith("L") or not parts[3][1:].isdigit():
        raise UsageError(f"unknown variant {name!r}; expected stock-bf16 or replay-DTYPE-ROUNDING-LN "
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
    return model.eval()


@torch.no_grad()
def forced(model, ids, tokens, on_logits, round_state=None) -> None:
    """Feed the prompt, then ``tokens`` one at a time through the model's cache; ``on_logits(t, logits)``
    (B, V) fp32 before token t is fed. ``round_state(cache)`` runs after every forward."""
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    if round_state is not None:
        round_state(cache)
    on_logits(0, out.logits[:, -1].float())
    for t in range(tokens.shape[1] - 1):
        out = model(input_ids=tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        if round_state is not None:
            round_state(cache)
        on_logits(t + 1, out.logits[:, -1].float())


def round_states_bf16(cache) -> None:
    """The per-step bf16-state baseline: every recurrent state rounded to bf16 (kept in its dtype)."""
    from replayssm.patches import compat

    for layer in getattr(cache, "layers", []):
        state = compat.recurrent_state(layer) if hasattr(layer, "recurrent_states") else None
        if state is not None and state.is_floating_point():
            state.copy_(state.to(torch.bfloat16).to(state.dtype))


def study_one(model_name, seed, args, device) -> dict:
    import replayssm

    model = build(model_name, device, seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (args.batch, args.prompt_len), generator=g).to(device)
    with torch.no_grad():
        seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.steps,
                             min_new_tokens=args.steps, do_sample=False, pad_token_id=0)
    tokens = seq[:, args.prompt_len:]
    sample = torch.randperm(vocab, generator=g)[:min(vocab, args.vocab_sample)].to(device)
    ref = {"argmax": [], "std": [], "sub": []}

    def keep_ref(t, logits):
        ref["argmax"].append(logits.argmax(-1).cpu())
        ref["std"].append(logits.std(-1).cpu())
        ref["sub"].append(logits[:, sample].cpu())

    forced(model, ids, tokens, keep_ref)
    results = {}
    for name in args.variants:
        opts = parse_variant(name)
        agree, mean, p99 = [], [], []

        def measure(t, logits):
            agree.append((logits.argmax(-1).cpu() == ref["argmax"][t]).float().mean().item())
            d = (logits[:, sample].cpu() - ref["sub"][t]).abs() / ref["std"][t][:, None]
            mean.append(d.mean().item())
            p99.append(torch.quantile(d.flatten(), 0.99).item())

        if opts is None:
            forced(model, ids, tokens, measure, round_state=round_states_bf16)
        else:
            replayssm.patch(model, backend=args.backend, **opts)
            try:
                forced(model, ids, tokens, measure)
            finally:
                replayssm.unpatch(model)
        results[name] = summarise(agree, mean, p99, args.bin)
        print(json.dumps({"model": model_name, "seed": seed, "variant": name, **results[name]["overall"]}),
              flush=True)
    del model
    return results


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
        for variant in report["variants"]:
            rows = [seeds[s][variant]["by_position"] for s in seeds]
            xs = [b["start"] for b in rows[0]]
            ys = [sum(r[i]["mean_std"] for r in rows) / len(rows) for i in range(len(xs))]
            ax.plot(xs, ys, label=variant, lw=2 if variant == "stock-bf16" else 1)
        ax.set_title(m)
        ax.set_xlabel("position")
        ax.set_ylabel("mean |Δlogit| / std(fp32 logits)")
        ax.set_yscale("log")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="nemotron3-nano-like,qwen3.5-4b-like,kimi-linear-like",
                    help="comma-separated preset names or tiny:FAMILY specs")
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--variants", default=",".join(FULL_VARIANTS))
    ap.add_argument("--vocab-sample", type=int, default=8192)
    ap.add_argument("--bin", type=int, default=256, help="positions per bin of the by-position curves")
    ap.add_argument("--backend", default="auto")
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
    results = {}
    for name in args.presets:
        results[name] = {str(seed): study_one(name, seed, args, device) for seed in args.seeds}
    report = dict(steps=args.steps, seeds=args.seeds, batch=args.batch, variants=args.variants,
                  vocab_sample=args.vocab_sample, device=str(device), results=results,
                  command="python examples/benchmarks/state_error_study.py " + " ".join(argv or sys.argv[1:]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "state_error_study.json").write_text(json.dumps(report, indent=1))
    if args.plot and not plot(report, out / "state_error_study.png"):
        print("state_error_study: matplotlib is not installed; no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
