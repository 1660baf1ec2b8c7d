"""Decode attention benchmark: one attention layer's one-token step, sdpa against the Triton kernel.

For the presets' attention shapes (``SHAPES``), batches and cache lengths C it times, in CUDA graphs with
CUDA events, µs per call of

* ``sdpa_grouped``: sdpa with the one-token query packed as (B, Hkv, G, D) against the cache's (B, Hkv, C, D)
  keys and values (transformers 5.24's ``pack_gqa``, replayssm's registered form on 5.17-5.23);
* ``sdpa_repeated``: sdpa after ``repeat_kv`` (transformers 5.17-5.23's own ``sdpa``); the same call as
  ``sdpa_grouped`` when G = 1;
* ``triton``: ``replayssm.kernels.attention.decode_attention`` with its default launch;

each on a bool (B, 1, 1, C) mask, the first ``--live`` fraction of the cache attended (a static cache
filled that far; 1.0 = all of it: sdpa reads every position either way, the kernel only the attended
ones). Every variant is checked against the reference once per cell. The working set is rotated through
enough copies of the cache to stay above the L2, and the variants are timed in interleaved rounds
(``--reps``, median kept). ``GB/s``: the attended K+V bytes over the time; ``frac``: that over the
device-to-device copy bandwidth measured in the same run. ``--sweep`` also times a grid of launch
configurations of the kernel per cell (block, splits, warps, stages) and reports the best beside the
default. Writes ``attention.json`` and ``attention.md`` under ``--out`` (default ``out/bench``).
``--smoke``: tiny shapes through the Triton interpreter, wall clock (checks the script only).

    python examples/benchmarks/bench_attention.py                       # all shapes, B 1,8,64,256, C 64,256,1024
    python examples/benchmarks/bench_attention.py --shapes qwen3.5-4b-like --batches 256 --lengths 64 --sweep
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_record import UsageError, cuda_or_smoke, run_meta, write_run  # noqa: E402

#: (Hq, Hkv, Dk, Dv) of the presets' attention layers (replayssm_convert/presets.py); Kimi-Linear's MLA
#: layers expand their latent cache to 32 heads of 192-wide keys (128 + 64 rotary) and 128-wide values
SHAPES = {
    "qwen3.5-4b-like": (16, 4, 256, 256),
    "nemotron3-nano-like": (32, 8, 128, 128),
    "kimi-linear-like": (32, 32, 192, 128),
}
SMOKE_SHAPES = {"smoke-gqa": (4, 2, 16, 16), "smoke-mla": (2, 2, 24, 16)}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
L2_BYTES = 60e6
VARIANTS = ("sdpa_grouped", "sdpa_repeated", "triton")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help=f"comma-separated, some of {', '.join(SHAPES)} (default: all)")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--lengths", default="64,256,1024", help="cache lengths C")
    ap.add_argument("--live", type=float, default=1.0, help="attended fraction of the cache, from its start")
    ap.add_argument("--dtype", default="bfloat16", help=", ".join(DTYPES))
    ap.add_argument("--reps", type=int, default=5, help="interleaved timing rounds (median kept)")
    ap.add_argument("--sweep", action="store_true", help="also time a grid of the kernel's launch configurations")
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes through the interpreter (checks the script)")
    args = ap.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
        args.lengths = [int(c) for c in args.lengths.split(",")]
    except ValueError:
        raise UsageError("--batches and --lengths take comma-separated integers") from None
    if min(args.batches + args.lengths) < 1 or args.reps < 1 or not 0 < args.live <= 1:
        raise UsageError("--batches, --lengths and --reps must be positive and --live in (0, 1]")
    if args.dtype not in DTYPES:
        raise UsageError(f"--dtype: unknown {args.dtype!r}; expected one of {', '.join(DTYPES)}")
    args.torch_dtype = DTYPES[args.dtype]
    table = SMOKE_SHAPES if args.smoke else SHAPES
    names = args.shapes.split(",") if args.shapes else list(table)
    if set(names) - set(table):
        raise UsageError(f"--shapes: unknown {sorted(set(names) - set(table))}; expected some of {sorted(table)}")
    args.cells = {n: table[n] for n in names}
    if args.smoke:  # the interpreter is slow, and its 16-bit products are wrong: fp32, tiny, one round
        args.batches, args.lengths, args.reps, args.torch_dtype, args.dtype = [2], [40], 1, torch.float32, "float32"
    return args


# ----------------------------------------------------------------------------- one cell

class Cell:
    """One (shape, batch, length) cell: R copies of the cache, the query and the mask."""

    def __init__(self, shape, B, C, live, dtype, dev, copies=None):
        Hq, Hkv, Dk, Dv = shape
        self.shape, self.B, self.C, self.G = shape, B, C, Hq // Hkv
        self.kv_bytes = B * Hkv * C * (Dk + Dv) * dtype.itemsize
        self.live = max(1, round(live * C))
        self.R = copies or max(1, min(256, math.ceil(4 * L2_BYTES / self.kv_bytes)))
        self.q = torch.randn(B, 1, Hq, Dk, device=dev).to(dtype).transpose(1, 2)  # transformers' layout
        self.caches = [(torch.randn(B, Hkv, C, Dk, device=dev).to(dtype),
                        torch.randn(B, Hkv, C, Dv, device=dev).to(dtype)) for _ in range(self.R)]
        self.mask = (torch.arange(C, device=dev) < self.live).expand(B, 1, 1, C).contiguous()
        self.scale = Dk ** -0.5

    def attended_bytes(self) -> int:
        return self.kv_bytes * self.live // self.C

    def call(self, variant, launch=None):
        """A function running ``variant`` once on cache copy i."""
        from replayssm.kernels.attention import decode_attention_triton

        q, mask, scale, G = self.q, self.mask, self.scale, self.G
        B, Hq, _, Dk = q.shape
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if variant == "triton":
            return lambda i: decode_attention_triton(q, *self.caches[i], mask, scale, launch=launch)
        if variant == "sdpa_grouped":
            def grouped(i):
                k, v = self.caches[i]
                out = sdpa(q.reshape(B, Hq // G, G, Dk), k, v, attn_mask=mask, scale=scale)
                return out.reshape(B, Hq, 1, v.shape[-1]).transpose(1, 2).contiguous()
            return grouped

        def repeated(i):
            k, v = self.caches[i]
            if G > 1:  # transformers' repeat_kv
                k = k[:, :, None].expand(B, Hq // G, G, *k.shape[2:]).reshape(B, Hq, *k.shape[2:])
                v = v[:, :, None].expand(B, Hq // G, G, *v.shape[2:]).reshape(B, Hq, *v.shape[2:])
            return sdpa(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2).contiguous()
        return repeated

    def check(self, fn) -> None:
        from replayssm.kernels.attention import decode_attention_reference

        want = decode_attention_reference(self.q.float(), *(t.float() for t in self.caches[0]), self.mask, self.scale)
        got = fn(0).float()
        tol = 1e-4 if self.q.dtype == torch.float32 else 3e-2
        if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
            raise AssertionError(f"wrong output: max error {(got - want).abs().max().item():.3g} (shape {self.shape}, "
                                 f"B {self.B}, C {self.C})")


# ----------------------------------------------------------------------------- timing

def copy_bandwidth(dev) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written (1 GiB each way)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    return 2 * a.numel() / (event_seconds(lambda: b.copy_(a), 50) / 50)


def event_seconds(fn, n: int) -> float:
    """Seconds for ``n`` calls of ``fn``, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


class Timed:
    """``fn`` over every cache copy, captured as one CUDA graph (compiled and warmed on a side stream);
    ``sample()`` is µs per call, from as many replays as fill about 20 ms. Without CUDA (smoke runs) the
    wall clock of one eager pass."""

    def __init__(self, fn, copies: int):
        self.copies = copies
        self.body = lambda: [fn(i) for i in range(copies)]
        if not torch.cuda.is_available():
            self.body()
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.body()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.body()
        once = event_seconds(self.graph.replay, 1)
        self.replays = max(1, min(1000, math.ceil(0.02 / once)))  # about 20 ms a sample

    def sample(self) -> float:
        if not torch.cuda.is_available():
            import time

            t0 = time.perf_counter()
            self.body()
            return (time.perf_counter() - t0) * 1e6 / self.copies
        return event_seconds(self.graph.replay, self.replays) * 1e6 / (self.replays * self.copies)


def median_us(timed: dict, reps: int) -> dict:
    """Median µs per call of each entry, over ``reps`` interleaved rounds."""
    samples = {k: [] for k in timed}
    for _ in range(reps):
        for k, t in timed.items():
            samples[k].append(t.sample())
    return {k: statistics.median(v) for k, v in samples.items()}


def sweep_launches(cell: Cell):
    """The grid ``--sweep`` times: tiles of 16-128 positions (a K tile of at most 128 x 128 elements),
    1-64 splits (no more than the tiles), 2-8 warps, 1-3 stages."""
    from replayssm.kernels.attention import DecodeLaunch

    Dmax = max(cell.shape[2], cell.shape[3])
    blocks = [b for b in (16, 32, 64, 128) if b * Dmax <= 128 * 128 and b <= max(16, cell.C)]
    for block_n, num_warps, num_stages in itertools.product(blocks, (2, 4, 8), (1, 2, 3)):
        tiles = math.ceil(cell.C / block_n)
        for splits in sorted({s for s in (1, 2, 4, 8, 16, 32, 64) if s <= tiles}):
            yield DecodeLaunch(block_n=block_n, splits=splits, num_warps=num_warps, num_stages=num_stages)


def bench_cell(name, shape, B, C, args, dev) -> dict:
    from replayssm.kernels.attention import default_launch

    cell = Cell(shape, B, C, args.live, args.torch_dtype, dev, copies=1 if args.smoke else None)
    variants = [v for v in VARIANTS if not (v == "sdpa_repeated" and cell.G == 1)]
    fns = {v: cell.call(v) for v in variants}
    for fn in fns.values():
        cell.check(fn)
    us = median_us({v: Timed(fn, cell.R) for v, fn in fns.items()}, args.reps)
    default = default_launch(B, shape[1], C, max(shape[2:]), dev)
    row = dict(shape=name, batch=B, length=C, live=cell.live, dtype=args.dtype, copies=cell.R,
               kv_MB=round(cell.kv_bytes / 1e6, 3), launch=default.__dict__, us={k: round(v, 3) for k, v in us.items()})
    row["GBps"] = {k: round(cell.attended_bytes() / (v * 1e-6) / 1e9, 1) for k, v in us.items()}
    row["frac"] = {k: round(cell.attended_bytes() / (v * 1e-6) / args.copy_bw, 3) for k, v in us.items()}
    row["speedup"] = {k: round(v / us["triton"], 3) for k, v in us.items() if k != "triton"}
    if args.sweep:
        timed = {}
        for launch in sweep_launches(cell):
            fn = cell.call("triton", launch)
            try:
                cell.check(fn)
                timed[launch] = Timed(fn, cell.R)
            except Exception as exc:  # e.g. a tile that does not fit in shared memory
                row.setdefault("sweep_failed", []).append(f"{launch}: {type(exc).__name__}: {str(exc)[:120]}")
        swept = median_us(timed, max(1, args.reps // 2))
        best = min(swept, key=swept.get)
        row["sweep"] = sorted(([round(t, 3), launch.__dict__] for launch, t in swept.items()), key=lambda r: r[0])
        row["best"] = dict(launch=best.__dict__, us=round(swept[best], 3),
                           vs_default=round(swept.get(default, us["triton"]) / swept[best], 3))
    return row


def markdown(meta, rows) -> str:
    out = [f"# Decode attention benchmark, {meta['date']}", "",
           f"{meta['gpu']}; torch {meta['torch']}, Triton {meta['triton']}, transformers {meta['transformers']} "
           f"(whose own sdpa runs `{meta['hf_sdpa']}`); {meta['dtype']}; µs per call in CUDA graphs (CUDA events), "
           f"median of {meta['reps']} interleaved rounds, cache rotated over copies to stay above the L2; "
           f"attended fraction {meta['live']}. GB/s: attended K+V bytes / time; frac: that over the copy bandwidth "
           f"of this run ({meta['copy_bw_TBps']} TB/s); speed-up: sdpa µs / triton µs. Command: `{meta['command']}`.",
           "", "| shape | B | C | K+V MB | sdpa_grouped µs | sdpa_repeated µs | triton µs | triton GB/s "
           "| triton frac | speed-up (grouped, repeated) | launch (block, splits) | best swept |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        us, sp = r["us"], r["speedup"]
        rep = f"{us['sdpa_repeated']:.2f}" if "sdpa_repeated" in us else "(G = 1)"
        speed = f"{sp['sdpa_grouped']:.2f}x, " + (f"{sp['sdpa_repeated']:.2f}x" if "sdpa_repeated" in sp else "—")
        best = "—"
        if "best" in r:
            b = r["best"]["launch"]
            best = (f"{r['best']['us']:.2f} µs ({b['block_n']}, {b['splits']}, {b['num_warps']}w, {b['num_stages']}s; "
                    f"{r['best']['vs_default']:.2f}x default)")
        out.append(f"| {r['shape']} | {r['batch']} | {r['length']} | {r['kv_MB']:.1f} | {us['sdpa_grouped']:.2f} | "
                   f"{rep} | {us['triton']:.2f} | {r['GBps']['triton']:.0f} | {r['frac']['triton']:.2f} | {speed} | "
                   f"{r['launch']['block_n']}, {r['launch']['splits']} | {best} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        cuda_or_smoke(args.smoke)
    except UsageError as e:
        print(f"bench_attention: {e}", file=sys.stderr)
        return 2
    import transformers
    from transformers.integrations import sdpa_attention

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.copy_bw = copy_bandwidth(dev) if dev.type == "cuda" else 1e11  # nominal on CPU (smoke runs only)
    rows = []
    for name, shape in args.cells.items():
        for B, C in itertools.product(args.batches, args.lengths):
            row = bench_cell(name, shape, B, C, args, dev)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    meta = run_meta("bench_attention.py", argv, dev, transformers=transformers.__version__,
                    hf_sdpa="sdpa_grouped" if hasattr(sdpa_attention, "pack_gqa") else "sdpa_repeated",
                    dtype=args.dtype, reps=args.reps, live=args.live, copy_bw_TBps=round(args.copy_bw / 1e12, 3))
    write_run(args.out, "attention", meta, rows, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
