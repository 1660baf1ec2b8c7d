"""Verify-step benchmark: one layer's speculative verify of T tokens (plus its rollback) against one
plain ReplaySSM decode step, Mamba-2 and delta rule (GDN, KDA), in CUDA graphs.

Per (shape, batch, T) it reports µs per call of: ``step`` (``mamba2_replay_decode`` /
``delta_replay_decode``, averaged over whole L-step cycles, flush included), ``T steps`` (T of
them: what the verify replaces), ``verify`` (T tokens per row, every draft accepted: the cursors
advance by T, flush-first windows included), ``verify+rollback`` (the verify, then every row rolled
back by T - 1 tokens, as a run at acceptance 1/T would), the ratios ``verify / step`` (issue target:
<= 1.3 at T = 5, batch 1-64) and ``verify+rollback / (T x step)`` (target at batch 256, T = 4:
<= 0.5). On a GPU both run the Triton kernels (``backend="triton"``;
the Mamba-2 verify is one launch, ``kernels/mamba2/verify_launch.py``). ``--baseline-tree DIR``:
also another checkout's ``kernels/`` verify (+ rollback) on the same data, and this one's time
relative to it (``vs_baseline``; see bench_kernels.py). Writes ``verify.json`` and ``verify.md`` under
``--out``. ``--smoke``: tiny shapes on any device (the PyTorch references off the GPU).
``--state-dtypes``: checkpoint dtypes to time (default fp32; int8 / fp8 with their scales, nearest
rounding).

    python examples/benchmarks/bench_verify.py --batches 1,64,256 --T 4,5
    python examples/benchmarks/bench_verify.py --batches 1,256 --T 4 --state-dtypes float32,bfloat16,int8
    python examples/benchmarks/bench_verify.py --baseline-tree /tmp/old/kernels
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton

import replayssm.kernels.delta as delta_ops
import replayssm.kernels.mamba2 as mamba2_ops
from baselines import check_baseline_tree, load_baseline_tree
from replayssm.kernels import quant as Q
from replayssm.kernels.speculation import rollback_cursor_reference
from run_record import UsageError

SHAPES = {"nemotron3-nano": ("mamba2", (96, 80, 128, 8)), "nemotron3-super": ("mamba2", (128, 64, 128, 8)),
          "qwen3.5-4b-gdn": ("delta", (16, 32, 128, 128, False)), "kimi-linear-kda": ("delta", (32, 32, 128, 128, True))}
SMOKE = {"smoke-mamba2": ("mamba2", (4, 16, 16, 2)), "smoke-gdn": ("delta", (2, 4, 16, 16, False))}
ACT = torch.bfloat16


def _l2n(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _stored(state: torch.Tensor, dtype: torch.dtype, dim: int) -> tuple[torch.Tensor, dict]:
    """The fp32 checkpoint stored as ``dtype`` (nearest), and the kernels' keyword arguments for it."""
    if dtype == torch.float32:
        return state, {}
    q = torch.empty(state.shape, dtype=dtype, device=state.device)
    scale = torch.empty(Q.scale_shape(tuple(state.shape), dim), device=state.device) if Q.is_scaled(dtype) else None
    Q.store_state(q, scale, None, state, torch.ones(state.shape[0], dtype=torch.bool, device=state.device), dim)
    return q, ({"state_scale": scale} if scale is not None else {})


def make_layer(family, shape, Bt, L, T, dev, act, ops=None, state_dtype=torch.float32):
    """(step(), verify(), verify_and_rollback()) closures over one layer's checkpoint (fp32, or
    stored as ``state_dtype``), rings and inputs (the same for the same arguments); ``ops``: the
    family's kernels module (default: this checkout's)."""
    ops = ops or (mamba2_ops if family == "mamba2" else delta_ops)
    g = torch.Generator().manual_seed(0)
    backend = "triton" if dev.type == "cuda" else "auto"
    cursor = torch.zeros(Bt, dtype=torch.int32, device=dev)
    back = torch.full((Bt,), T - 1, dtype=torch.int32, device=dev)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if family == "mamba2":
        H, P, N, G = shape
        state, quant = _stored(r(Bt, H, P, N).to(dev), state_dtype, -1)
        rings = (torch.zeros(Bt, H, L, P, dtype=act, device=dev), torch.zeros(Bt, H, L, device=dev),
                 torch.zeros(Bt, G, L, N, dtype=act, device=dev))
        A, dtb, D = (-torch.rand(H, generator=g) - 0.5).to(dev), r(H).to(dev), r(H).to(dev)
        one = [r(Bt, H, P).to(act), (r(Bt, H) - 2).to(act), r(Bt, G, N).to(act), r(Bt, G, N).to(act)]
        win = [r(Bt, T, H, P).to(act), (r(Bt, T, H) - 2).to(act), r(Bt, T, G, N).to(act), r(Bt, T, G, N).to(act)]
        one, win = [t.to(dev) for t in one], [t.to(dev) for t in win]
        step = lambda: ops.mamba2_replay_decode(*one, state, *rings, cursor, A, dtb, D, backend=backend,  # noqa: E731
                                                **quant)
        verify = lambda: ops.mamba2_replay_verify(*win, state, *rings, cursor, A, dtb, D, backend=backend,  # noqa: E731
                                                  **quant)
    else:
        Hk, HV, K, V, kda = shape
        state, quant = _stored(r(Bt, HV, K, V).to(dev), state_dtype, -2)
        rings = (torch.zeros(Bt, HV, L, V, dtype=act, device=dev), torch.zeros(Bt, Hk, L, K, dtype=act, device=dev),
                 torch.zeros(*((Bt, HV, L, K) if kda else (Bt, HV, L)), device=dev))

        def toks(*lead):
            q = (_l2n(r(*lead, Hk, K)) * K ** -0.5).to(dev)
            k = _l2n(r(*lead, Hk, K)).to(dev)
            gate = (-torch.exp(r(*lead, HV, *((K,) if kda else ())) - 2)).to(dev)
            return q, k, r(*lead, HV, V).to(act).to(dev), gate, torch.sigmoid(r(*lead, HV)).to(dev)

        one, win = toks(Bt), toks(Bt, T)
        step = lambda: ops.delta_replay_decode(*one, state, *rings, cursor, backend=backend, **quant)  # noqa: E731
        verify = lambda: ops.delta_replay_verify(*win, state, *rings, cursor, backend=backend, **quant)  # noqa: E731

    def verify_and_rollback():
        verify()
        rollback_cursor_reference(cursor, back)

    return step, verify, verify_and_rollback


def time_us(fn, calls: int, dev) -> float:
    """µs per call of ``fn`` repeated ``calls`` times in one CUDA graph (eager off the GPU)."""
    if dev.type != "cuda":
        import time

        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"{name} takes comma-separated integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{name} takes positive integers; got {text!r}")
    return values


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--T", default="4,5", help="verify window lengths")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--baseline-tree", help="another checkout's kernels/ directory, timed beside this one")
    ap.add_argument("--state-dtypes", default="float32",
                    help="checkpoint dtypes: float32, bfloat16, float16, float8_e4m3fn, int8 (comma-separated)")
    args = ap.parse_args(argv)
    known = {str(d).replace("torch.", ""): d for d in (torch.float32, torch.bfloat16, torch.float16,
                                                       torch.float8_e4m3fn, torch.int8)}
    names = args.state_dtypes.split(",")
    if not names or any(n not in known for n in names):
        raise UsageError(f"--state-dtypes takes comma-separated names of {', '.join(known)}; got {args.state_dtypes!r}")
    args.state_dtypes = [known[n] for n in names]
    args.batches, args.T = _ints(args.batches, "--batches"), _ints(args.T, "--T")
    if max(args.T) > args.L:
        raise UsageError(f"--T values must be at most --L (a window fits the ring); got --T "
                         f"{','.join(map(str, args.T))} and --L {args.L}")
    if args.baseline_tree:
        check_baseline_tree(args.baseline_tree)
    if not torch.cuda.is_available() and not args.smoke:
        raise UsageError("needs a CUDA device (--smoke runs tiny shapes anywhere)")
    return args


def main(argv=None) -> int:
    try:
        args = _parse(argv)
    except UsageError as e:
        print(f"bench_verify.py: {e}", file=sys.stderr)
        return 2
    baseline = load_baseline_tree(args.baseline_tree) if args.baseline_tree else None
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SMOKE if args.smoke else SHAPES
    batches = [2] if args.smoke else args.batches
    act = torch.float32 if args.smoke else ACT
    calls, back_calls = (2, 2) if args.smoke else (args.L * 4, 32)  # per timing: kernel calls, verify+rollbacks
    rows = []
    for name, (family, shape), Bt, sd in ((n, fs, b, d) for n, fs in shapes.items() for b in batches
                                          for d in args.state_dtypes):
        step_us = None
        for T in args.T:
            step, verify, verify_back = make_layer(family, shape, Bt, args.L, T, dev, act, state_dtype=sd)
            if step_us is None:
                step_us = time_us(step, calls, dev)
            verify_us = time_us(verify, calls, dev)
            back_us = time_us(verify_back, back_calls, dev)
            rows.append(dict(shape=name, batch=Bt, state=str(sd).replace("torch.", ""), T=T,
                             step_us=round(step_us, 2), T_steps_us=round(T * step_us, 2),
                             verify_us=round(verify_us, 2), verify_rollback_us=round(back_us, 2),
                             verify_per_step=round(verify_us / step_us, 3),
                             verify_rollback_per_T_steps=round(back_us / (T * step_us), 3)))
            if baseline:
                *_, base_back = make_layer(family, shape, Bt, args.L, T, dev, act, ops=baseline[family],
                                           state_dtype=sd)
                base_us = time_us(base_back, back_calls, dev)
                rows[-1].update(baseline_verify_rollback_us=round(base_us, 2),
                                vs_baseline=round(back_us / base_us, 3))
            print(json.dumps(rows[-1]), flush=True)
    meta = dict(date=datetime.date.today().isoformat(),
                gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke run)",
                torch=torch.__version__, triton=triton.__version__, L=args.L,
                command=" ".join(["python examples/benchmarks/bench_verify.py", *(sys.argv[1:] if argv is None else argv)]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    extra = ("| baseline verify+rollback µs | vs baseline ", "---|---|") if baseline else ("", "")
    lines = [f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · triton {meta['triton']} · L = {args.L} · "
             f"`{meta['command']}`", "",
             "| shape | batch | state | T | step µs | T steps µs | verify µs | verify+rollback µs | verify / step | "
             f"verify+rollback / (T x step) {extra[0]}|",
             f"|---|---|---|---|---|---|---|---|---|---|{extra[1]}"]
    lines += [f"| {r['shape']} | {r['batch']} | {r['state']} | {r['T']} | {r['step_us']} | {r['T_steps_us']} | {r['verify_us']} | "
              f"{r['verify_rollback_us']} | {r['verify_per_step']} | {r['verify_rollback_per_T_steps']} |"
              + (f" {r['baseline_verify_rollback_us']} | {r['vs_baseline']} |" if baseline else "") for r in rows]
    (out / "verify.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
