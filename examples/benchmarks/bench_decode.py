"""Whole-model decode step: a model with ReplaySSM layers against the same model with its stock ones.

Builds a model with the layer sizes of transformers' default config for the family and random
weights (no download), prefills a random prompt for each batch size, then runs greedy decode
steps (one token per row, teacher-forced from a fixed random stream, so both variants see the
same tokens; no host synchronisation), first with the stock SSM layers and then, in a second
child process, with ``replayssm.patch``:

* ``wall``: CUDA-event time per step of eager transformers forward calls. The Python of an
  eager forward is part of it, and at small batches it is most of it;
* ``device``: the sum of the GPU kernel and copy durations per step, from the torch profiler's
  trace: what a serving engine that replays the step as a CUDA graph would pay;
* ``argmax``: the fraction of (row, step) whose argmax token the two variants agree on, and
  ``dlogit``: the largest difference of 256 sampled logits of rows 0-1 over every step, in units
  of the logits' standard deviation. A random-weight model's top logits are near ties among a
  large vocabulary, so in bf16 a rounding-level difference flips some argmaxes; ``dlogit`` says
  how large the differences are. With ``--reference`` a third child runs the stock model with
  fp32 weights (the same random weights) as the oracle, and each variant's distance from it is
  reported too: ReplaySSM should be no further from it than the stock model in the same dtype.

Timed and profiled steps are whole L-step cycles, so every row flushes the same number of times
whatever cursor it starts from. Each variant runs in its own child process, so that memory, kernel
caches and a fault in a kernel that is not this project's stay apart.

    python examples/benchmarks/bench_decode.py --out DIR [--models qwen3.5,kimi-linear,mamba2] [--batches 1,32,256]
        [--reference] [--dtype bfloat16|float16|float32] [--L 16] [--state-dtype fp32|bf16|fp16]
    python examples/benchmarks/bench_decode.py --smoke --out DIR    # tiny model on CPU: checks the script
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_LIN3FULL = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]

# name: (config class, keyword arguments, description). Sizes are transformers' defaults for the
# family, written out so that a newer transformers with other defaults builds the same model.
MODELS = {
    "qwen3.5": ("Qwen3_5TextConfig",
                dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                     num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                     linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_conv_kernel_dim=4, layer_types=_LIN3FULL * 8, tie_word_embeddings=False),
                "Qwen3.5 text model: hidden 4096, 32 layers (24 Gated DeltaNet (16, 32, 128, 128), 8 attention)"),
    "kimi-linear": ("KimiLinearConfig",
                    dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216, num_hidden_layers=27,
                         num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, qk_rope_head_dim=64,
                         qk_nope_head_dim=128, v_head_dim=128, linear_num_heads=32, linear_head_dim=128,
                         layer_types=(_LIN3FULL * 7)[:27], mlp_layer_types=["dense"] * 27, tie_word_embeddings=False),
                    "Kimi-Linear: hidden 2304, 27 layers (21 KDA (32 heads, 128), 6 MLA); dense MLPs in every "
                    "layer instead of 256-expert MoE"),
    "mamba2": ("Mamba2Config",
               dict(vocab_size=32768, hidden_size=4096, state_size=128, num_heads=128, head_dim=64, expand=2,
                    n_groups=8, num_hidden_layers=64, conv_kernel=4, tie_word_embeddings=False,
                    # prefill runs transformers' PyTorch chunk scan (mamba_ssm's needs its CUDA build), which
                    # holds batch x chunk x heads x head dim x state in fp32: 137 GB at batch 256 with
                    # chunks of 256, 8.6 GB with 16; decode does not use chunks
                    chunk_size=16),
               "Mamba-2: hidden 4096, 64 Mamba-2 layers (128 heads, 64, state 128, 8 groups: the Nemotron-3-Super "
               "layer shape)"),
}
SMOKE_MODELS = {"smoke-qwen3.5": "tiny:qwen3_5", "smoke-kimi-linear": "tiny:kimi_linear", "smoke-mamba2": "tiny:mamba2"}


def describe(name: str) -> str:
    """One line on what model ``name`` is."""
    return MODELS[name][2] if name in MODELS else f"built-in {SMOKE_MODELS[name]}"


def build_model(name: str, dtype, device: str):
    """The model ``name`` with random weights (seed 0, drawn in fp32 and then cast to ``dtype``,
    so every dtype holds the same weights up to rounding), built on ``device``."""
    import torch
    import transformers
    from replayssm.tiny import build_tiny_model, model_class_for

    if name in SMOKE_MODELS:
        return build_tiny_model(SMOKE_MODELS[name], dtype).to(device)
    cls_name, kwargs, _ = MODELS[name]
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(0)
    cls = model_class_for(config)
    with torch.device(device):
        model = cls._from_config(config, dtype=torch.float32)
    return model.to(dtype).eval()


def use_stock_kernel(model, device: str) -> str:
    """What the stock SSM layers of ``model`` run, as a phrase for the table.

    On CUDA, Mamba-2 layers first get mamba_ssm's per-step kernel where its vendored source is
    present (what transformers runs when mamba_ssm is installed; its package needs a CUDA build,
    so ``bench_mamba2.load_mamba_ssm`` loads the one Triton file by path): in this benchmark's
    child process only, by replacing the module-level function that the stock mixer calls."""
    import importlib.util

    import transformers

    fallback = f"transformers {transformers.__version__} PyTorch path"
    if not device.startswith("cuda"):
        return fallback
    if model.config.model_type != "mamba2":
        return "flash-linear-attention" if importlib.util.find_spec("fla") else fallback
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_mamba2 import load_mamba_ssm
    from transformers.models.mamba2 import modeling_mamba2

    ssu, what = load_mamba_ssm()
    if ssu is None:
        return fallback

    def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, **_):
        return ssu(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)

    modeling_mamba2.mamba2_selective_state_update = selective_state_update
    return what


def cache_kwarg(model) -> str:
    """The name under which ``model.forward`` takes and returns its cache (Mamba-2: ``cache_params``
    in transformers 5.17-5.23, ``cache`` from 5.24; the others ``past_key_values``)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return next(n for n in ("past_key_values", "cache", "cache_params") if n in params)


def device_time(trace_path: str, steps: int, top: int = 12) -> tuple[float, list]:
    """(µs per step of GPU kernels, copies and sets; the ``top`` largest by name as
    [name, µs per step, launches per step]) from a chrome trace of the torch profiler."""
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    by_name: dict[str, list] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            acc = by_name.setdefault(str(e.get("name", "?"))[:100], [0.0, 0])
            acc[0] += e.get("dur", 0)
            acc[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    total = sum(us for us, _ in by_name.values())
    return total / steps, [[name, us / steps, n / steps] for name, (us, n) in ranked]


def run_batch(model, Bt: int, spec: dict, kw: str, sample) -> dict:
    """Prefill and decode one batch of ``Bt`` rows; timings, argmax tokens and sampled logits."""
    import torch

    device, L, cycles = spec["device"], spec["L"], spec["cycles"]
    cuda = device.startswith("cuda")
    vocab = model.config.get_text_config().vocab_size
    n_steps = L * (cycles + 2)  # warm-up, timed and profiled cycles
    gen = torch.Generator().manual_seed(Bt)
    ids = torch.randint(3, vocab, (Bt, spec["prompt"] + n_steps), generator=gen).to(device)
    argmax, sampled = [], []
    pos = spec["prompt"]
    with torch.inference_mode():
        out = model(input_ids=ids[:, :pos], use_cache=True, logits_to_keep=1)
        cache = getattr(out, kw)

        def steps(n):
            nonlocal pos
            for _ in range(n):
                logits = model(input_ids=ids[:, pos:pos + 1], use_cache=True, **{kw: cache}).logits[:, -1]
                argmax.append(logits.argmax(-1))
                sampled.append(logits[:2, sample].float())
                pos += 1

        steps(L)  # warm-up: one cycle (kernel compiles, autotuning)
        if cuda:
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            steps(L * cycles)
            t1.record()
            torch.cuda.synchronize()
            wall_us = t0.elapsed_time(t1) * 1e3 / (L * cycles)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                steps(L)
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path)
                device_us, kernels = device_time(path, L)
        else:
            t = time.perf_counter()
            steps(L * cycles)
            wall_us = (time.perf_counter() - t) * 1e6 / (L * cycles)
            device_us, kernels = None, []
            steps(L)
    return dict(batch=Bt, wall_us=wall_us, device_us=device_us, kernels=kernels, checkpoint=checkpoint_dtype(cache),
                argmax=torch.stack(argmax, 1).cpu().tolist(), sampled=torch.stack(sampled, 1).cpu().tolist())


def checkpoint_dtype(cache) -> str | None:
    """The dtype of the first SSM layer's recurrent state in ``cache`` (e.g. "float32")."""
    for layer in getattr(cache, "layers", ()):
        states = getattr(layer, "recurrent_states", None)
        state = (states.get(0) if isinstance(states, dict) else states[0]) if states else None
        if state is not None:
            return str(state.dtype).removeprefix("torch.")
    return None


def run_variant(spec: dict) -> dict:
    """One child process: every batch of one (model, variant). Returns JSON-able rows."""
    import torch
    import replayssm

    device = spec["device"]
    cuda = device.startswith("cuda")
    model = build_model(spec["model"], getattr(torch, spec["dtype"]), device)
    if spec["variant"] == "replay":
        replayssm.patch(model, buffer_len=spec["L"], state_dtype=spec["state_dtype"])
        ssm = "ReplaySSM"
    elif spec["variant"] == "stock":
        ssm = use_stock_kernel(model, device)
    else:  # the fp32 oracle: transformers' default kernels (mamba_ssm is not swapped in)
        ssm = "fp32 weights"
    kw = cache_kwarg(model)
    vocab = model.config.get_text_config().vocab_size
    sample = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:256].to(device)
    rows = []
    for Bt in spec["batches"]:
        try:
            rows.append(run_batch(model, Bt, spec, kw, sample))
        except torch.OutOfMemoryError as e:  # a batch too large for this device: the others still count
            rows.append(dict(batch=Bt, error=f"out of memory: {str(e).splitlines()[0][:120]}"))
        if cuda:
            torch.cuda.empty_cache()
    return dict(model=spec["model"], variant=spec["variant"], ssm=ssm, rows=rows)


def run_child(spec: dict) -> dict:
    """``run_variant`` in a child process; a failure comes back as ``{"error": ...}``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(model=spec["model"], variant=spec["variant"], error=f"child exit {p.returncode}: {tail}")


def agreement(a: list, b: list) -> float:
    """Fraction of equal tokens between two (rows, steps) token lists."""
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def logit_gap(a: list, b: list) -> float:
    """Largest |a - b| over nested lists of logits, in units of a's standard deviation."""
    import torch

    ta, tb = torch.tensor(a), torch.tensor(b)
    return float((ta - tb).abs().max() / ta.std().clamp_min(1e-30))


def versions() -> dict:
    import torch
    import transformers

    out = dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version())
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        pass
    try:
        import fla

        out["fla"] = getattr(fla, "__version__", "installed")
    except ImportError:
        out["fla"] = None
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def table(results: list, meta: dict) -> str:
    lines = [f"# Whole-model decode step: stock SSM layers vs ReplaySSM ({meta['versions'].get('gpu', 'CPU')})", "",
             f"- date: {meta['date']}; " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "gpu"),
             f"- weights {meta['dtype']}, ReplaySSM L = {meta['L']}, checkpoint "
             f"{meta['state_dtype'] or 'in the dtype of the cache'}; "
             f"prompt {meta['prompt']} tokens, then 1 warm-up, {meta['cycles']} timed and 1 profiled cycle of L "
             "teacher-forced steps",
             "- `wall` = time per step of eager forward calls, Python included (CUDA events; the wall clock without "
             "CUDA); `device` = GPU kernel time per step from the profiler trace; `x` = stock / ReplaySSM; "
             "`argmax` = share of (row, step) argmax tokens the two agree on (teacher-forced); `dlogit` = largest "
             "difference of sampled logits (rows 0-1, every step) over their standard deviation",
             ""]
    for res in results:
        lines += [f"## {res['model']}: {res['description']}", ""]
        if "error" in res:
            lines += [f"Not run: {res['error']}", ""]
            continue
        if res.get("stock_ssm"):
            ck = res.get("checkpoint") or {}
            lines += [f"Stock SSM layers on {res['stock_ssm']}; recurrent state {ck.get('stock', '?')} (stock), "
                      f"{ck.get('replay', '?')} (ReplaySSM checkpoint).", ""]
        lines += ["| batch | stock wall µs | ReplaySSM wall µs | x wall | stock device µs | ReplaySSM device µs "
                  "| x device | argmax | dlogit |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"| {r['batch']} | not run: {r['error']} |")
                continue
            dev = (f"{r['stock_device_us']:.0f} | {r['replay_device_us']:.0f} | {r['x_device']:.2f}x"
                   if r["stock_device_us"] else "— | — | —")
            lines.append(f"| {r['batch']} | {r['stock_wall_us']:.0f} | {r['replay_wall_us']:.0f} | "
                         f"{r['x_wall']:.2f}x | {dev} | {r['argmax_agree']:.3f} | {r['dlogit']:.3g} |")
        lines.append("")
        done = [r for r in res["rows"] if "error" not in r]
        for r in (done[0], done[-1]) if len(done) > 1 else done:
            for variant in ("stock", "replay"):
                top = r.get(f"{variant}_kernels") or []
                if top:
                    lines.append(f"- batch {r['batch']}, {variant}, largest kernels (µs / launches per step): "
                                 + "; ".join(f"`{n[:48]}` {us:.0f} / {c:g}" for n, us, c in top[:5]))
        if any(r.get("stock_kernels") for r in done):
            lines.append("")
        if meta.get("reference"):
            lines += ["Against the stock model with fp32 weights (the same weights):", "",
                      "| batch | stock argmax | ReplaySSM argmax | stock dlogit | ReplaySSM dlogit |",
                      "|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['batch']} | {r['argmax_stock_ref']:.3f} | {r['argmax_replay_ref']:.3f} | "
                      f"{r['dlogit_stock_ref']:.3g} | {r['dlogit_replay_ref']:.3g} |" for r in done]
            lines.append("")
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_list(text: str, known: dict, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"--{what}: unknown {', '.join(bad) or '(empty)'} (expected some of: {', '.join(known)})")
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    ap.add_argument("--models", default=None, help=f"comma-separated, of: {', '.join(MODELS)} (default: all)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32,256)")
    ap.add_argument("--L", type=int, default=16, help="ReplaySSM buffer length")
    ap.add_argument("--state-dtype", default=None, choices=["fp32", "bf16", "fp16"], help="checkpoint dtype")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--cycles", type=int, default=2, help="timed L-step cycles")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="weights and activations (default bfloat16; float32 with --smoke)")
    ap.add_argument("--reference", action="store_true",
                    help="also run the stock model with fp32 weights and report each variant's distance from it")
    ap.add_argument("--smoke", action="store_true", help="tiny built-in models on CPU (checks the script)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_variant(json.loads(args.child))))
        return 0
    import torch

    known = SMOKE_MODELS if args.smoke else MODELS
    try:
        models = parse_list(args.models, known, "models") if args.models else list(known)
        batches = [int(b) for b in (args.batches or ("2" if args.smoke else "1,32,256")).split(",")]
        if min(batches) < 1 or args.L < 1 or args.prompt < 1 or args.cycles < 1:
            raise ValueError("--batches, --L, --prompt and --cycles must be positive")
    except ValueError as e:
        ap.error(str(e))
    if not args.smoke and not torch.cuda.is_available():
        ap.error("needs a CUDA device (use --smoke to check the script on CPU)")
    device = "cpu" if args.smoke else "cuda"
    dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
    variants = ("stock", "replay") + (("reference",) if args.reference and dtype != "float32" else ())
    L = min(args.L, 4) if args.smoke else args.L
    cycles = 1 if args.smoke else args.cycles
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                versions=versions(), dtype=dtype, L=L, state_dtype=args.state_dtype, prompt=args.prompt,
                cycles=cycles, batches=batches, reference="reference" in variants)
    out = Path(args.out)
    results = []
    for name in models:
        spec = dict(model=name, device=device, dtype=dtype, L=L, cycles=cycles, prompt=args.prompt,
                    batches=batches, state_dtype=args.state_dtype)
        got = {v: run_child(dict(spec, variant=v, **({"dtype": "float32"} if v == "reference" else {})))
               for v in variants}
        err = [g["error"] for g in got.values() if "error" in g]
        if err:
            results.append(dict(model=name, description=describe(name), error="; ".join(err)))
            print(f"{name}: {err[0]}", file=sys.stderr)
        else:
            rows = []
            refs = got["reference"]["rows"] if "reference" in got else [None] * len(got["stock"]["rows"])
            for s, r, f in zip(got["stock"]["rows"], got["replay"]["rows"], refs):
                failed = [x["error"] for x in (s, r, f) if x is not None and "error" in x]
                if failed:
                    rows.append(dict(batch=s["batch"], error=failed[0]))
                    print(json.dumps(dict(model=name, **rows[-1])))
                    continue
                row = dict(batch=s["batch"], stock_wall_us=s["wall_us"], replay_wall_us=r["wall_us"],
                           x_wall=s["wall_us"] / r["wall_us"], stock_device_us=s["device_us"],
                           replay_device_us=r["device_us"], stock_kernels=s["kernels"], replay_kernels=r["kernels"],
                           x_device=(s["device_us"] / r["device_us"]) if s["device_us"] else None,
                           argmax_agree=agreement(s["argmax"], r["argmax"]),
                           dlogit=logit_gap(s["sampled"], r["sampled"]))
                if f is not None:
                    row.update(argmax_stock_ref=agreement(f["argmax"], s["argmax"]),
                               argmax_replay_ref=agreement(f["argmax"], r["argmax"]),
                               dlogit_stock_ref=logit_gap(f["sampled"], s["sampled"]),
                               dlogit_replay_ref=logit_gap(f["sampled"], r["sampled"]))
                rows.append(row)
                print(json.dumps(dict(model=name, **{k: v for k, v in row.items() if not k.endswith("_kernels")})))
            checkpoints = {v: sorted({r.get("checkpoint") or "?" for r in got[v]["rows"] if "error" not in r})
                           for v in ("stock", "replay")}
            results.append(dict(model=name, description=describe(name), stock_ssm=got["stock"]["ssm"],
                                checkpoint={v: "/".join(c) for v, c in checkpoints.items()}, rows=rows))
        out.mkdir(parents=True, exist_ok=True)  # after every model, so a run cut short keeps what it measured
        write_atomically(out / "decode_bench.json", json.dumps(dict(meta=meta, results=results), indent=1))
        write_atomically(out / "decode_bench.md", table(results, meta) + "\n")
    print(f"wrote {out / 'decode_bench.md'}")
    return 1 if any("error" in r or any("error" in x for x in r.get("rows", ())) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
