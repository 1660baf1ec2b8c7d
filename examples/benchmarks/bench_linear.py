"""Linear-layer benchmark at decode batch sizes: cuBLAS (``F.linear``) against the small-batch Triton
GEMV (``replayssm.kernels.linear.linear_small_batch``), on every distinct (N, K) of the linear layers
of the benchmark presets (read from models built on the meta device: nothing is allocated for them).

For each (N, K) and M (rows of x, ``--batches``) both are timed in CUDA graphs: one graph holds
``max(20, R)`` calls, cycling through R copies of the weight so that the weights of one replay are at
least 4x the L2 (as in a decode step, where every layer's weight comes from memory); median µs per call
over ``--reps`` rounds of ``triton.testing.do_bench``. Reported: µs, GB/s of weight bytes (x and y
counted too), the fraction of the device-to-device copy bandwidth measured in the same run (bytes read
+ written by a 1 GiB ``copy_``), cuBLAS / Triton time (``speedup``), the largest difference from the
fp32 result relative to its largest value for both, and ``host_us``: the wall time of an eager call in
a Python loop (host-bound for small shapes; what an eager decode step pays). Then, per preset, one
decode step's linear layers (each shape's time x its count) for cuBLAS and Triton at M = 1 and 2
(the kernel takes at most ``M_MAX`` = 2 rows).

``--sweep`` times, per (N, K, M), the default launch and the variants one knob away from it (column
block, K tile, warps, stages, split): one JSON line per candidate, then a table of the best against
the default, from which ``default_config``'s rules can be tuned (about 15 candidates a case: take one
batch size or preset per run, e.g. ``--batches 1``, to stay within a 10-minute command).

``--groups`` times, at one row, the launches a patched batch-1 step makes where projections share their
input (``patches/delta.py``: Gated DeltaNet / KDA input projections) and for gated MLPs: one grouped or
gated launch against the same weights as separate Triton launches (plus the MLP's activation and
product) and as cuBLAS calls; then, per preset, those groups' time in one decode step.

One JSON line per case on stdout, then the tables; ``--out DIR`` also writes ``linear.jsonl`` there.
GPU only.

    python examples/benchmarks/bench_linear.py
    python examples/benchmarks/bench_linear.py --sweep --batches 1 --presets qwen3.5-4b-like
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import copy_bandwidth, time_steps  # noqa: E402
from run_record import UsageError  # noqa: E402

PRESETS = ("nemotron3-nano-like", "qwen3.5-4b-like", "kimi-linear-like")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
MIN_CALLS = 20
MAX_COPIES = 2048


def preset_linear_shapes(name: str) -> collections.Counter:
    """{(N, K): count} of the ``nn.Linear`` layers of a preset, from its model built on the meta device."""
    from replayssm.presets import build_preset

    model = build_preset(name, torch.bfloat16, "meta")
    return collections.Counter(tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear))


def preset_launch_groups(name: str) -> collections.Counter:
    """{(kind, ((N, K), ...)): count} of a preset's grouped launches: kind "shared" (projections of one
    input) or "gated" (a gated MLP's gate and up), from its model built on the meta device."""
    from replayssm.patches.delta import PROJECTION_GROUPS
    from replayssm.patches.fused_linear import is_gated_mlp
    from replayssm.presets import build_preset

    model = build_preset(name, torch.bfloat16, "meta")
    found = collections.Counter()
    for module in model.modules():
        if is_gated_mlp(module):
            found["gated", (tuple(module.gate_proj.weight.shape), tuple(module.up_proj.weight.shape))] += 1
        if not isinstance(getattr(module, "conv1d", None), torch.nn.Conv1d):  # the mixers, not attention
            continue
        for names in PROJECTION_GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if all(isinstance(m, torch.nn.Linear) for m in linears):
                found["shared", tuple(tuple(m.weight.shape) for m in linears)] += 1
    return found


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} takes positive integers; got {text!r}")
    return values


def sweep_candidates(N: int, K: int, M: int, itemsize: int, n_sm: int) -> list:
    """The default launch first, then the valid variants one knob away from it."""
    import triton

    from replayssm.kernels.linear import default_config

    base = default_config(N, K, M, itemsize, n_sm)
    knobs = {"block_n": (base.block_n // 2, base.block_n * 2), "block_k": (base.block_k // 2, base.block_k * 2),
             "num_warps": (base.num_warps // 2, base.num_warps * 2),
             "num_stages": tuple(s for s in (1, 2, 3, 4, 5) if s != base.num_stages),
             "split_k": (base.split_k // 2, base.split_k * 2, 1, 4)}
    out = [base]
    for name, values in knobs.items():
        for v in values:
            try:
                cand = dataclasses.replace(base, **{name: v})
            except ValueError:  # not a valid launch (a zero)
                continue
            if cand not in out and cand.block_k <= max(64, triton.next_power_of_2(K)) and cand.num_warps <= 16:
                out.append(cand)
    return out


class Case:
    """One (N, K, M): R weight copies (together >= 4x the L2), x, and a bias-free call of each kind."""

    def __init__(self, N, K, M, dtype, dev, l2_bytes):
        g = torch.Generator(device=dev).manual_seed(0)
        self.N, self.K, self.M = N, K, M
        wbytes = N * K * dtype.itemsize
        self.copies = max(1, min(MAX_COPIES, math.ceil(4 * l2_bytes / wbytes)))
        self.calls = max(MIN_CALLS, self.copies)
        self.weights = [(torch.randn(N, K, generator=g, device=dev) / math.sqrt(K)).to(dtype)
                        for _ in range(self.copies)]
        self.x = torch.randn(M, 1, K, generator=g, device=dev).to(dtype)
        self.bytes = wbytes + (M * K + M * N) * dtype.itemsize

    def body(self, fn):
        def run():
            for i in range(self.calls):
                fn(self.x, self.weights[i % self.copies])
        return run

    def errors(self, kernel) -> dict:
        """Largest |y - fp32 result| over the largest |fp32 result|, for cuBLAS and the kernel."""
        w = self.weights[0]
        ref = F.linear(self.x.float(), w.float())
        scale = ref.abs().max().item() or 1.0
        return {name: (fn(self.x, w).float() - ref).abs().max().item() / scale
                for name, fn in (("cublas", F.linear), ("triton", kernel))}

    def host_us(self, fn, n=200) -> float:
        fn(self.x, self.weights[0])
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(n):
            fn(self.x, self.weights[i % self.copies])
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e6 / n


def _timed(case: Case, fns: dict, reps: int) -> dict:
    runs = {name: [] for name in fns}
    for _ in range(reps):  # interleaved rounds: same-run ratios
        for name, fn in fns.items():
            runs[name].append(time_steps(case.body(fn), case.calls))
    return {name: statistics.median(v) for name, v in runs.items()}


def bench_case(N, K, M, args, dev, bw, l2) -> dict:
    from replayssm.kernels.linear import linear_small_batch_triton as triton_fn  # the patched modules' call

    case = Case(N, K, M, args.dtype, dev, l2)
    us = _timed(case, {"cublas": F.linear, "triton": triton_fn}, args.reps)
    gbps = {k: case.bytes / (v * 1e-6) / 1e9 for k, v in us.items()}
    row = {"N": N, "K": K, "M": M, "dtype": str(args.dtype).replace("torch.", ""), "copies": case.copies,
           "us": us, "GBps": gbps, "frac_copy_bw": {k: v * 1e9 / bw for k, v in gbps.items()},
           "speedup": us["cublas"] / us["triton"], "rel_err": case.errors(triton_fn),
           "host_us": {"cublas": case.host_us(F.linear), "triton": case.host_us(triton_fn)}}
    return row


class GroupCase(Case):
    """One group of weights sharing x (one row), R copies of the group (together >= 4x the L2)."""

    def __init__(self, shapes, dtype, dev, l2_bytes):
        g = torch.Generator(device=dev).manual_seed(0)
        K = shapes[0][1]
        self.shapes, self.M = shapes, 1
        wbytes = sum(n * k for n, k in shapes) * dtype.itemsize
        self.copies = max(1, min(MAX_COPIES, math.ceil(4 * l2_bytes / wbytes)))
        self.calls = max(MIN_CALLS, self.copies)
        self.weights = [[(torch.randn(n, k, generator=g, device=dev) / math.sqrt(k)).to(dtype) for n, k in shapes]
                        for _ in range(self.copies)]
        self.x = torch.randn(1, 1, K, generator=g, device=dev).to(dtype)
        self.bytes = wbytes


def group_variants(kind: str) -> dict:
    """name -> fn(x, weights) of one group's launch forms."""
    from replayssm.kernels import linear as L

    if kind == "gated":
        return {"cublas": lambda x, w: F.silu(F.linear(x, w[0])) * F.linear(x, w[1]),
                "triton": lambda x, w: (F.silu(L.linear_small_batch_triton(x, w[0]))
                                        * L.linear_small_batch_triton(x, w[1])),
                "one_launch": lambda x, w: L.linear_small_batch_gated_triton(x, w[0], w[1], activation="silu")}
    return {"cublas": lambda x, w: [F.linear(x, t) for t in w],
            "triton": lambda x, w: [L.linear_small_batch_triton(x, t) for t in w],
            "one_launch": lambda x, w: L.linear_small_batch_group_triton(x, w)}


def group_case(kind, shapes, args, dev, bw, l2) -> dict:
    case = GroupCase(shapes, args.dtype, dev, l2)
    us = _timed(case, group_variants(kind), args.reps)
    return {"kind": kind, "shapes": [list(s) for s in shapes], "copies": case.copies, "us": us,
            "frac_copy_bw": {k: case.bytes / (v * 1e-6) / bw for k, v in us.items()},
            "vs_separate": us["triton"] / us["one_launch"], "vs_cublas": us["cublas"] / us["one_launch"]}


def sweep_case(N, K, M, args, dev, l2, n_sm) -> list[dict]:
    from replayssm.kernels.linear import linear_small_batch

    case = Case(N, K, M, args.dtype, dev, l2)
    fns = {"cublas": F.linear}
    cands = sweep_candidates(N, K, M, args.dtype.itemsize, n_sm)
    for i, cfg in enumerate(cands):
        fns[i] = lambda x, w, cfg=cfg: linear_small_batch(x, w, backend="triton", config=cfg)
    us = _timed(case, fns, args.reps)
    rows = []
    for i, cfg in enumerate(cands):
        rows.append({"N": N, "K": K, "M": M, "candidate": i, "default": i == 0, "config": dataclasses.asdict(cfg),
                     "us": us[i], "cublas_us": us["cublas"], "vs_default": us[0] / us[i]})
    return rows


def _fmt_cfg(c: dict) -> str:
    return f"n{c['block_n']} k{c['block_k']} w{c['num_warps']} s{c['num_stages']} x{c['split_k']}"


def step_sums(rows, shapes_by_preset) -> list[dict]:
    """Per preset and M in (1, 2): one decode step's linear layers, each shape's time x its count."""
    by = {(r["N"], r["K"], r["M"]): r["us"] for r in rows}
    sums = []
    for preset, shapes in shapes_by_preset.items():
        for M in (1, 2):
            if all((N, K, M) in by for N, K in shapes):
                tot = {k: sum(n * by[(N, K, M)][k] for (N, K), n in shapes.items()) for k in ("cublas", "triton")}
                sums.append({"preset": preset, "M": M, "step_us": tot, "speedup": tot["cublas"] / tot["triton"]})
    return sums


def print_tables(rows, sums, bw) -> None:
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s (read + write)\n")
    print("| N | K | M | cuBLAS µs | Triton µs | speed-up | cuBLAS frac | Triton frac | host µs cuBLAS / Triton |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['N']} | {r['K']} | {r['M']} | {r['us']['cublas']:.2f} | {r['us']['triton']:.2f} | "
              f"{r['speedup']:.2f}x | {r['frac_copy_bw']['cublas']:.0%} | {r['frac_copy_bw']['triton']:.0%} | "
              f"{r['host_us']['cublas']:.1f} / {r['host_us']['triton']:.1f} |")
    print("\none decode step's linear layers (each shape's time x its count), µs\n")
    print("| preset | M | cuBLAS | Triton | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for s in sums:
        print(f"| {s['preset']} | {s['M']} | {s['step_us']['cublas']:.0f} | {s['step_us']['triton']:.0f} | "
              f"{s['speedup']:.2f}x |")


def print_sweep_table(rows) -> None:
    print("\n| N | K | M | default | µs | best | µs | best vs default | best vs cuBLAS |")
    print("|---:|---:|---:|---|---:|---|---:|---:|---:|")
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["N"], r["K"], r["M"])].append(r)
    for (N, K, M), rs in groups.items():
        d = next(r for r in rs if r["default"])
        b = min(rs, key=lambda r: r["us"])
        print(f"| {N} | {K} | {M} | {_fmt_cfg(d['config'])} | {d['us']:.2f} | {_fmt_cfg(b['config'])} | "
              f"{b['us']:.2f} | {d['us'] / b['us']:.2f}x | {b['cublas_us'] / b['us']:.2f}x |")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated preset names")
    p.add_argument("--batches", default="1,2", help="rows of x (M), comma-separated, 1-2 (the kernel's M_MAX)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--reps", type=int, default=2, help="interleaved timing rounds (median kept)")
    p.add_argument("--sweep", action="store_true", help="time launch candidates per shape instead")
    p.add_argument("--groups", action="store_true", help="time the grouped and gated launches instead (one row)")
    p.add_argument("--out", default=None, help="also write linear.jsonl (or linear_sweep.jsonl) here")
    args = p.parse_args(argv)
    from replayssm.kernels.linear import M_MAX
    from replayssm.presets import PRESETS as KNOWN

    args.presets = [s for s in args.presets.split(",") if s]
    unknown = [s for s in args.presets if s not in KNOWN]
    if unknown or not args.presets:
        raise UsageError(f"--presets: unknown {unknown}; expected some of {', '.join(KNOWN)}")
    args.batches = _ints(args.batches, "--batches")
    if max(args.batches) > M_MAX:
        raise UsageError(f"--batches: at most {M_MAX} rows; got {max(args.batches)}")
    if args.reps < 1:
        raise UsageError(f"--reps must be positive; got {args.reps}")
    if args.sweep and args.groups:
        raise UsageError("--sweep and --groups are separate runs; pick one")
    args.dtype = DTYPES[args.dtype]
    return args


def main(argv=None) -> int:
    try:
        args = parse(argv)
        if not torch.cuda.is_available():
            raise UsageError("bench_linear.py times CUDA graphs: it needs a CUDA GPU")
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from replayssm.kernels.backend import num_sms

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 0) or 60 << 20
    n_sm = num_sms("cuda", dev.index)
    if args.groups:
        return run_groups(args, dev, l2)
    shapes_by_preset = {name: preset_linear_shapes(name) for name in args.presets}
    shapes = sorted({s for c in shapes_by_preset.values() for s in c})
    bw = copy_bandwidth(dev)
    meta = {"gpu": props.name, "torch": torch.__version__, "triton": __import__("triton").__version__,
            "copy_bw": bw, "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d")}
    print(json.dumps({"meta": meta}))
    rows = []
    for N, K in shapes:
        for M in args.batches:
            new = sweep_case(N, K, M, args, dev, l2, n_sm) if args.sweep else [bench_case(N, K, M, args, dev, bw, l2)]
            for r in new:
                print(json.dumps(r), flush=True)
            rows += new
            torch.cuda.empty_cache()
    sums = [] if args.sweep else step_sums(rows, shapes_by_preset)
    for s in sums:
        print(json.dumps(s))
    if args.out:
        path = Path(args.out) / ("linear_sweep.jsonl" if args.sweep else "linear.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in [{"meta": meta}, *rows, *sums]))
    if args.sweep:
        print_sweep_table(rows)
    else:
        print_tables(rows, sums, bw)
    return 0


def run_groups(args, dev, l2) -> int:
    """``--groups``: one row per distinct group, then per preset the groups' time in one decode step."""
    bw = copy_bandwidth(dev)
    groups_by_preset = {name: preset_launch_groups(name) for name in args.presets}
    rows = {}
    for key in sorted({g for c in groups_by_preset.values() for g in c}):
        rows[key] = group_case(*key, args, dev, bw, l2)
        print(json.dumps(rows[key]), flush=True)
        torch.cuda.empty_cache()
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s (read + write); one row, µs per group\n")
    print("| kind | weights (N x K) | cuBLAS | Triton, separate | one launch | vs separate | vs cuBLAS | frac |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows.values():
        shapes = ", ".join(f"{n}x{k}" for n, k in r["shapes"])
        print(f"| {r['kind']} | {shapes} | {r['us']['cublas']:.2f} | {r['us']['triton']:.2f} | "
              f"{r['us']['one_launch']:.2f} | {r['vs_separate']:.2f}x | {r['vs_cublas']:.2f}x | "
              f"{r['frac_copy_bw']['one_launch']:.0%} |")
    print("\none decode step's grouped launches (each group's time x its count), µs\n")
    print("| preset | groups | cuBLAS | Triton, separate | one launch |")
    print("|---|---:|---:|---:|---:|")
    for preset, found in groups_by_preset.items():
        tot = {k: sum(n * rows[g]["us"][k] for g, n in found.items()) for k in ("cublas", "triton", "one_launch")}
        print(f"| {preset} | {sum(found.values())} | {tot['cublas']:.0f} | {tot['triton']:.0f} | "
              f"{tot['one_launch']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
