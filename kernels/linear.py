"""y = x @ weight.T (+ bias) for one or two rows of x, streaming the weight once: the decode step's
linear layers at batch 1, where reading the weight is the whole cost.

``linear_small_batch(x, weight, bias=None)``: x (..., K) with M = x.numel() / K rows, 1 <= M <=
``M_MAX`` (2), in bf16, fp16 or fp32; weight (N, K) with unit stride along K (``nn.Linear``'s
layout) and x's dtype; bias (N,) or None. Products and sums are fp32, rounded once to x's dtype
(as cuBLAS does), so the result is F.linear's within one rounding of the output. More rows are
left to cuBLAS, which was faster there (a tensor-core form of this kernel included); the patch
calls it with one row (``patches/fused_linear.py``).

Each program owns ``block_n`` output columns (weight rows) and every row of x: it walks its
share of K in ``block_k`` tiles, each weight tile loaded once, coalesced along K, for all M rows,
and accumulates fp32 FMAs in a (rows, block_n, block_k) tile summed over K once at the end. When N
alone gives too few programs for the multiprocessors, K is split over ``split_k`` programs per
column block, which write fp32 partial sums that a second launch adds in a fixed order (with the
bias): the result is deterministic, unlike fp32 atomics. Every buffer has a size fixed by the
shapes, and nothing reads the device from the host, so the call can be captured in a CUDA graph.

``LaunchConfig`` holds the knobs and ``default_config`` picks them from (N, K, M) and the element
size, one rule a line. ``examples/benchmarks/bench_linear.py --sweep`` times candidates per shape.
The PyTorch reference (``F.linear``) is the CPU path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .backend import is_pow2, num_sms, resolve_backend

__all__ = ["M_MAX", "LaunchConfig", "default_config", "linear_small_batch", "linear_small_batch_reference",
           "split_plan"]

#: the most rows of x the kernel takes (its FMA accumulator grows with the rows)
M_MAX = 2
#: fp32 accumulator registers per thread of an FMA program (all rows)
_FMA_ACC_REGS = 32
#: weights smaller than this are never split: the partial sums' second launch costs about as much
#: as streaming them (a graph launch takes about 1-2 µs, in which ~4 MB stream at 4 TB/s)
_SPLIT_MIN_BYTES = 4 << 20
_REDUCE_BLOCK = 1024
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _cdiv(a: int, b: int) -> int:  # (triton.cdiv is a jitted function: slow to call from the host)
    return -(-a // b)


@dataclass(frozen=True)
class LaunchConfig:
    """Knobs of one small-batch linear launch.

    block_n: output columns (weight rows) per program.
    block_k: K tile a program loads per step (``block_n`` x ``block_k`` weight elements).
    num_warps: warps per program.
    num_stages: weight tiles in flight per program (software pipelining of the K loop).
    split_k: programs sharing one column block's K (rounded to whole ``block_k`` tiles, see
        ``split_plan``); above 1, partial sums and a second launch.
    """

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self):
        for name in ("block_n", "block_k", "num_warps"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"LaunchConfig.{name} must be a power of two; got {getattr(self, name)!r}")
        if self.num_stages < 1 or self.split_k < 1:
            raise ValueError(f"LaunchConfig.num_stages and split_k must be positive; got {self.num_stages}, "
                             f"{self.split_k}")


def _k_tile(K: int, largest: int) -> int:
    """The largest power of two in [64, ``largest``] dividing K (no masked tail), else one that covers
    K up to ``largest``."""
    tile = largest
    while tile >= 64:
        if K % tile == 0:
            return tile
        tile //= 2
    return min(triton.next_power_of_2(K), largest)


@functools.lru_cache(maxsize=1024)
def default_config(N: int, K: int, M: int, itemsize: int, n_sm: int = 132) -> LaunchConfig:
    """The launch for ``M`` rows of x against an (N, K) weight of ``itemsize``-byte elements on a
    device of ``n_sm`` multiprocessors. Rules untuned until a GPU sweep (``bench_linear.py --sweep``)."""
    rows = triton.next_power_of_2(M)
    # 4 warps for one row, 8 for two; 32 accumulator registers per thread over all rows: a tile of
    # 4096 elements (8 KB of bf16) per step; K tiles up to 512 (whole lines)
    warps = 4 if rows == 1 else 8
    elements = _FMA_ACC_REGS * 32 * warps // rows
    block_k = min(_k_tile(K, 512), elements)
    block_n = max(1, elements // block_k)
    # fewer columns per program until every SM has about four programs (latency hidden across them)
    while block_n > 2 and _cdiv(N, block_n) < 4 * n_sm:
        block_n //= 2
    # fewer warps for a smaller tile: 8 elements (16 B) a thread, within the registers
    warps = max(_cdiv(rows * block_n * block_k, 32 * _FMA_ACC_REGS), min(warps, block_n * block_k // 256))
    # split K only when still under two programs per SM and the weight is worth a second launch
    programs, k_tiles, split = _cdiv(N, block_n), _cdiv(K, block_k), 1
    if programs < 2 * n_sm and N * K * itemsize >= _SPLIT_MIN_BYTES:
        split = min(k_tiles, _cdiv(4 * n_sm, programs))
    return LaunchConfig(block_n=block_n, block_k=block_k, num_warps=warps, num_stages=3, split_k=split)


def split_plan(K: int, cfg: LaunchConfig) -> tuple[int, int]:
    """(programs per column block, K per program): ``cfg.split_k`` rounded to whole ``block_k`` tiles."""
    tiles = _cdiv(K, cfg.block_k)
    per = _cdiv(tiles, min(cfg.split_k, tiles))
    return _cdiv(tiles, per), per * cfg.block_k


def linear_small_batch_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                                 ) -> torch.Tensor:
    """PyTorch reference of ``linear_small_batch`` (the CPU path)."""
    return F.linear(x, weight, bias)


@triton.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    "HAS_BIAS": lambda args: args["bias"] is not None,
    "PARTIAL": lambda args: args["partial"] is not None,
})
@triton.jit
def _linear_small_batch_kernel(x, weight, bias, out, partial, M, N, K, k_per_program, stride_xm, stride_wn,
                               stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               NUM_STAGES: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                               PARTIAL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows past M and columns past N load the last valid one again (unmasked loads); stores are masked
    x_rows = tl.minimum(offs_m, M - 1)
    w_rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_ptrs = x + x_rows[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = weight + w_rows[:, None] * stride_wn + offs_k[None, :]
    k_lo = pid_k * k_per_program
    k_hi = tl.minimum(k_lo + k_per_program, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        if EVEN_K:
            w = tl.load(w_ptrs + k)
            xk = tl.load(x_ptrs + k)
        else:
            in_k = (k + offs_k) < K
            w = tl.load(w_ptrs + k, mask=in_k[None, :], other=0.0)
            xk = tl.load(x_ptrs + k, mask=in_k[None, :], other=0.0)
        acc += xk.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    y = tl.sum(acc, axis=2)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:
        tl.store(partial + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], y, mask=mask)
    else:
        if HAS_BIAS:
            y += tl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out + offs_m[:, None] * stride_om + offs_n[None, :], y.to(out.dtype.element_ty), mask=mask)


@triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None})
@triton.jit
def _split_sum_kernel(partial, bias, out, M, N, splits, stride_om, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr):
    """out[m] = sum over the splits of partial[s, m] (in split order) + bias, rounded to out's dtype."""
    m = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(splits):
        acc += tl.load(partial + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + m * stride_om + offs, acc.to(out.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=4096)
def _launch_plan(N: int, K: int, M: int, itemsize: int, n_sm: int, config: LaunchConfig | None):
    """(config, K splits, K per program, BLOCK_M) of one call, worked out once per shape."""
    cfg = config or default_config(N, K, M, itemsize, n_sm)
    splits, k_per_program = split_plan(K, cfg)
    return cfg, splits, k_per_program, triton.next_power_of_2(M)


def linear_small_batch_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              config: LaunchConfig | None = None) -> torch.Tensor:
    """The Triton path of ``linear_small_batch`` without its checks (the patched modules' per-call
    path, which checks the inputs itself: ``patches/fused_linear.py``)."""
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)  # rows of N, contiguous
    if M == 0:
        return out
    cfg, splits, k_per_program, block_m = _launch_plan(N, K, M, x.element_size(),
                                                       num_sms(x.device.type, x.device.index), config)
    partial = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if splits > 1 else None
    _linear_small_batch_kernel[(_cdiv(N, cfg.block_n), splits)](
        x=x2, weight=weight, bias=None if partial is not None else bias, out=out, partial=partial, M=M, N=N, K=K,
        k_per_program=k_per_program, stride_xm=x2.stride(0), stride_wn=weight.stride(0), stride_om=N,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    if partial is not None:
        _split_sum_kernel[(_cdiv(N, _REDUCE_BLOCK), M)](
            partial=partial, bias=bias, out=out, M=M, N=N, splits=splits, stride_om=N, BLOCK=_REDUCE_BLOCK,
            num_warps=4)
    return out


def linear_small_batch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                       backend: str = "auto", config: LaunchConfig | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias) for at most ``M_MAX`` rows of x (see the module notes); dispatches on
    ``backend`` like the decode kernels. ``config`` overrides ``default_config`` (benchmarks, tests)."""
    if (weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or weight.shape[1] == 0
            or weight.stride(-1) != 1):
        raise ValueError(f"linear_small_batch expects x (..., K) and weight (N, K), K >= 1, with unit stride along "
                         f"K; got x {tuple(x.shape)}, weight {tuple(weight.shape)} with strides "
                         f"{tuple(weight.stride())}")
    if x.dtype not in _KERNEL_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"linear_small_batch expects x, weight and bias of one dtype among bf16, fp16, fp32; got "
                         f"{x.dtype}, {weight.dtype}, {None if bias is None else bias.dtype}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear_small_batch expects bias (N,) = ({weight.shape[0]},); got {tuple(bias.shape)}")
    rows = x.numel() // max(1, x.shape[-1])
    if rows > M_MAX:
        raise ValueError(f"linear_small_batch takes at most {M_MAX} rows of x; got {rows} (x {tuple(x.shape)})")
    if resolve_backend(backend, x.device) == "triton":
        return linear_small_batch_triton(x, weight, bias, config)
    return linear_small_batch_reference(x, weight, bias)
