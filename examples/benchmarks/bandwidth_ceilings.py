"""What fraction of the copy bandwidth can a decode-step access pattern reach on this GPU?

The byte floors of ``bench_delta.py`` / ``bench_mamba2.py`` divide bytes by the
device-to-device copy bandwidth (bytes read + written by ``torch.Tensor.copy_``). This
script times, in one run, stand-alone Triton kernels that move the bytes of a delta-rule
checkpoint the way the replay launches do, without any of their arithmetic, so the
"% of floor" of the real launches can be read against what the memory system gives each
pattern:

* ``read_tiles``: one program per (row, head, block of value columns) loads a (K, BV)
  state tile and reduces it against two key-dim vectors (the output launch of every
  step); ``read_tiles_persistent``: the same work items walked by a few programs per
  multiprocessor with a software-pipelined loop;
* ``read_flat``: the whole state read as one flat array in large blocks (the read
  ceiling);
* ``rmw_tiles`` / ``rmw_tiles_persistent``: load a tile, scale it, store it in place (the
  flush launch without its small matrix product); ``torch.mul_``: the same in place.

    python examples/benchmarks/bandwidth_ceilings.py --out DIR

Needs CUDA; prints a table and writes ``bandwidth_ceilings.json`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared timing helpers
from timing import copy_bandwidth  # noqa: E402

SHAPES = {"qwen3.5-4b-gdn": (256, 32, 128, 128), "qwen3.5-122b-gdn": (256, 64, 128, 128)}  # (batch, HV, K, V)


@triton.jit
def _tile_item(s_ptr, x_ptr, o_ptr, item, NV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               EVICT: tl.constexpr):
    i_bh = item // NV
    i_v = item - i_bh * NV
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    base = s_ptr + i_bh.to(tl.int64) * K * V
    if EVICT:
        s = tl.load(base + offs_k[:, None] * V + offs_v[None, :], eviction_policy="evict_first")
    else:
        s = tl.load(base + offs_k[:, None] * V + offs_v[None, :])
    s = s.to(tl.float32)
    xk = tl.load(x_ptr + offs_k)
    xq = tl.load(x_ptr + K + offs_k)
    r = tl.sum(s * xk[:, None], axis=0)
    hq = tl.sum(s * xq[:, None], axis=0)
    tl.store(o_ptr + i_bh.to(tl.int64) * V + offs_v, r + hq)


@triton.jit
def _read_tiles(s_ptr, x_ptr, o_ptr, NV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, EVICT: tl.constexpr):
    _tile_item(s_ptr, x_ptr, o_ptr, tl.program_id(0), NV, K, V, BV, EVICT)


@triton.jit
def _read_tiles_persistent(s_ptr, x_ptr, o_ptr, NV, total, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                           EVICT: tl.constexpr, STAGES: tl.constexpr):
    for item in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages=STAGES):
        _tile_item(s_ptr, x_ptr, o_ptr, item, NV, K, V, BV, EVICT)


@triton.jit
def _read_flat(s_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(s_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(o_ptr + tl.program_id(0), tl.sum(s, axis=0))


@triton.jit
def _rmw_item(s_ptr, item, NV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    i_bh = item // NV
    i_v = item - i_bh * NV
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    ptrs = s_ptr + i_bh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
    s = tl.load(ptrs).to(tl.float32)
    tl.store(ptrs, (s * 0.5).to(s_ptr.dtype.element_ty))


@triton.jit
def _rmw_tiles(s_ptr, NV, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    _rmw_item(s_ptr, tl.program_id(0), NV, K, V, BV)


@triton.jit
def _rmw_tiles_persistent(s_ptr, NV, total, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, STAGES: tl.constexpr):
    for item in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages=STAGES):
        _rmw_item(s_ptr, item, NV, K, V, BV)


def _bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # µs


def run(out_dir: Path) -> list[dict]:
    dev = "cuda"
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    copy_bw = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name(0)}; copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + written)", flush=True)
    rows = []

    def record(shape, dtype, pattern, knobs, us, nbytes):
        row = dict(shape=shape, dtype=str(dtype).split(".")[-1], pattern=pattern, knobs=knobs, us=round(us, 1),
                   bytes=nbytes, frac_of_copy_bw=round(nbytes / (us * 1e-6) / copy_bw, 3))
        rows.append(row)
        print(json.dumps(row), flush=True)

    for shape, (B, HV, K, V) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            s = torch.randn(B * HV * K * V, device=dev).to(dtype)
            nbytes = s.numel() * s.element_size()
            x = torch.randn(2 * K, device=dev)
            o = torch.empty(B * HV * V, device=dev)
            for BV in (32, 64):
                NV = V // BV
                total = B * HV * NV
                for warps in (1, 2, 4):
                    for evict in (False, True):
                        us = _bench(lambda: _read_tiles[(total,)](s, x, o, NV, K, V, BV, evict, num_warps=warps))
                        record(shape, dtype, "read_tiles", dict(block_v=BV, warps=warps, evict_first=evict), us,
                               nbytes)
                    for per_sm in (4, 8, 16):
                        for stages in (2, 3):
                            grid = (min(total, per_sm * nsm),)
                            us = _bench(lambda: _read_tiles_persistent[grid](s, x, o, NV, total, K, V, BV, False, stages,
                                                                             num_warps=warps))
                            record(shape, dtype, "read_tiles_persistent",
                                   dict(block_v=BV, warps=warps, per_sm=per_sm, stages=stages), us, nbytes)
            n = s.numel()
            for block in (4096, 16384):
                part = torch.empty(triton.cdiv(n, block), device=dev)
                us = _bench(lambda: _read_flat[(triton.cdiv(n, block),)](s, part, n, block, num_warps=8))
                record(shape, dtype, "read_flat", dict(block=block, warps=8), us, nbytes)
            us = _bench(lambda: s.sum(dtype=torch.float32))
            record(shape, dtype, "torch.sum", {}, us, nbytes)
            for BV in (32, 64):
                NV = V // BV
                total = B * HV * NV
                for warps in (2, 4):
                    us = _bench(lambda: _rmw_tiles[(total,)](s, NV, K, V, BV, num_warps=warps))
                    record(shape, dtype, "rmw_tiles", dict(block_v=BV, warps=warps), us, 2 * nbytes)
                    for per_sm in (4, 8):
                        grid = (min(total, per_sm * nsm),)
                        us = _bench(lambda: _rmw_tiles_persistent[grid](s, NV, total, K, V, BV, 2, num_warps=warps))
                        record(shape, dtype, "rmw_tiles_persistent", dict(block_v=BV, warps=warps, per_sm=per_sm),
                               us, 2 * nbytes)
            us = _bench(lambda: s.mul_(1.0))
            record(shape, dtype, "torch.mul_", {}, us, 2 * nbytes)
            del s
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                copy_bw_tb_s=round(copy_bw / 1e12, 3))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bandwidth_ceilings.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="examples/benchmarks/results/latest")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bandwidth_ceilings.py needs a CUDA device")
    rows = run(Path(args.out))
    best = {}
    for r in rows:
        key = (r["shape"], r["dtype"], r["pattern"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print("\n| shape | dtype | pattern | best knobs | µs | % of copy bw |\n|---|---|---|---|---:|---:|")
    for (shape, dtype, pattern), r in best.items():
        print(f"| {shape} | {dtype} | {pattern} | `{json.dumps(r['knobs'])}` | {r['us']} | {100 * r['frac_of_copy_bw']:.0f}% |")


if __name__ == "__main__":
    main()
