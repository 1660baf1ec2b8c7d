"""y = x @ weight.T (+ bias) for one or two rows of x, streaming the weight once: the decode step's
linear layers at batch 1, where reading the weight is the whole cost.

``linear_small_batch(x, weight, bias=None)``: x (..., K) with M = x.numel() / K rows, 1 <= M <=
``M_MAX`` (2), in bf16, fp16 or fp32; weight (N, K) with unit stride along K (``nn.Linear``'s
layout) and x's dtype; bias (N,) or None. Products and sums are fp32, rounded once to x's dtype
(as cuBLAS does), so the result is F.linear's within one rounding of the output. More rows are
left to cuBLAS, which was faster there (a tensor-core form of this kernel included); the patch
calls it with one row (``patches/fused_linear.py``).

``linear_small_batch_group(x, weights, biases=None)``: 1 to ``GROUP_MAX`` (4) weights (N_i, K)
sharing x (the q/k/v/gate projections of one layer, say), their columns side by side in one output
(..., sum N_i), as F.linear on their concatenation gives: one launch instead of one per weight in
the decode step, and no copy of the weights (each program picks its weight by its column block).
``linear_small_batch_gated(x, gate_weight, up_weight, activation="silu")``: a gated MLP's
act(x @ gate.T) * (x @ up.T) in one launch, the activation and product taken on the fp32 sums
and rounded once, instead of two GEMVs, an activation and a product, each rounding to x's dtype.

Each program owns ``block_n`` output columns (weight rows) and every row of x: it walks its
share of K in ``block_k`` tiles, each weight tile loaded once, coalesced along K, for all M rows,
and accumulates fp32 FMAs in a (rows, block_n, block_k) tile summed over K once at the end. When N
alone gives too few programs for the multiprocessors, K is split over ``split_k`` programs per
column block, which write fp32 partial sums that a second launch adds in a fixed order (with the
bias): the result is deterministic, unlike fp32 atomics. Every buffer has a size fixed by the
shapes, and nothing reads the device from the host, so the call can be captured in a CUDA graph. On
sm_90 the launch is a programmatic dependent of the one before (``kernels/dependent.py``): each program
reads its first weight tile, then waits for that launch to complete before it reads x.

``LaunchConfig`` holds the knobs and ``default_config`` picks them from (N, K, M) and the element
size, one rule a line. ``examples/benchmarks/bench_linear.py --sweep`` times candidates per shape.
The PyTorch reference (``F.linear``) is the CPU path.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .backend import is_pow2, num_sms, resolve_backend
from .dependent import dependent, gdc_launch_dependents, gdc_wait, launch_options

__all__ = ["ACTIVATIONS", "GROUP_MAX", "M_MAX", "LaunchConfig", "default_config", "linear_small_batch",
           "linear_small_batch_gated", "linear_small_batch_gated_reference", "linear_small_batch_gated_triton",
           "linear_small_batch_group", "linear_small_batch_group_reference", "linear_small_batch_group_triton",
           "linear_small_batch_reference", "split_plan"]

#: the most rows of x the kernel takes (its FMA accumulator grows with the rows)
M_MAX = 2
#: the most weights one grouped launch takes (the kernel's weight pointers)
GROUP_MAX = 4
#: the gated form's activations (fp32, on the unrounded gate sums), by name
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "relu": F.relu}
#: fp32 accumulator registers per thread of an FMA program (all rows)
_FMA_ACC_REGS = 16
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
    device of ``n_sm`` multiprocessors. Why each rule: ``examples/benchmarks/TUNING.md`` (small-batch linear)."""
    rows = triton.next_power_of_2(M)
    # 4 warps, 16 accumulator registers per thread over all rows: a tile of 2048 / rows elements (4 KB
    # of bf16 for one row) per step; K tiles up to 512 (whole lines)
    warps = 4
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


def _cat_biases(biases: Sequence[torch.Tensor | None] | None) -> torch.Tensor | None:
    """The grouped launch's one bias (sum N_i,): the small biases concatenated, or None."""
    if biases is None or biases[0] is None:
        return None
    return biases[0] if len(biases) == 1 else torch.cat(tuple(biases))


def linear_small_batch_group_reference(x: torch.Tensor, weights: Sequence[torch.Tensor],
                                       biases: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """PyTorch reference of ``linear_small_batch_group`` (the CPU path): F.linear on the concatenation."""
    return F.linear(x, torch.cat(tuple(weights)), _cat_biases(biases))


def linear_small_batch_gated_reference(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor,
                                       activation: str = "silu") -> torch.Tensor:
    """PyTorch reference of ``linear_small_batch_gated`` (the CPU path): what the kernel promises, fp32 sums, the
    activation and product in fp32, one rounding to x's dtype."""
    xf = x.float()
    return (ACTIVATIONS[activation](F.linear(xf, gate_weight.float())) * F.linear(xf, up_weight.float())).to(x.dtype)


@triton.jit
def _next_weight(pid_n, weight, stride_wn, col_lo, col_hi, first, w_next, stride_next, hi_next, BLOCK_N: tl.constexpr):
    """(weight, row stride, its first and end output column, its first column block) of column block ``pid_n``:
    the next weight's once ``pid_n`` is past the current one's cdiv(col_hi - col_lo, BLOCK_N) blocks (scalar
    selects; a block never straddles two weights)."""
    first_next = first + tl.cdiv(col_hi - col_lo, BLOCK_N)
    take = pid_n >= first_next
    return (tl.where(take, w_next, weight), tl.where(take, stride_next, stride_wn), tl.where(take, col_hi, col_lo),
            tl.where(take, hi_next, col_hi), tl.where(take, first_next, first))


@triton.jit
def _load_k_tile(ptrs, k, offs_k, K, EVEN_K: tl.constexpr):
    """The (rows, BLOCK_K) tile at ``k`` of ``ptrs`` in fp32, zero past K."""
    if EVEN_K:
        tile = tl.load(ptrs + k)
    else:
        tile = tl.load(ptrs + k, mask=((k + offs_k) < K)[None, :], other=0.0)
    return tile.to(tl.float32)


@triton.jit
def _activate(g, ACTIVATION: tl.constexpr):
    """act(g) in fp32: silu g sigmoid(g); gelu_tanh g sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)), which is
    0.5 g (1 + tanh(sqrt(2/pi) (...))); relu."""
    if ACTIVATION == "silu":
        y = g * tl.sigmoid(g)
    elif ACTIVATION == "gelu_tanh":
        y = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g))
    else:
        y = tl.maximum(g, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu(NaN) = NaN, as F.relu
    return y


@triton.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    "HAS_BIAS": lambda args: args["bias"] is not None,
    "PARTIAL": lambda args: args["partial"] is not None,
})
@triton.jit
def _linear_small_batch_kernel(x, w0, w1, w2, w3, bias, out, partial, M, N, K, k_per_program, stride_xm, stride_w0,
                               stride_w1, stride_w2, stride_w3, n1, n2, n3, stride_om, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                               NUM_WEIGHTS: tl.constexpr, ACTIVATION: tl.constexpr, EVEN_K: tl.constexpr,
                               HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, PDL: tl.constexpr):
    """Columns [0, n1) of out from w0, [n1, n2) from w1, [n2, n3) from w2, [n3, N) from w3 (the first
    NUM_WEIGHTS; n_i the cumulative ends); with ACTIVATION (gated: NUM_WEIGHTS 1, no split) act(x @ w0.T) *
    (x @ w1.T) instead."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    weight, stride_wn, col_lo, col_hi, first = w0, stride_w0, 0, n1, 0
    if NUM_WEIGHTS > 1:
        weight, stride_wn, col_lo, col_hi, first = _next_weight(pid_n, weight, stride_wn, col_lo, col_hi, first,
                                                                w1, stride_w1, n2, BLOCK_N)
    if NUM_WEIGHTS > 2:
        weight, stride_wn, col_lo, col_hi, first = _next_weight(pid_n, weight, stride_wn, col_lo, col_hi, first,
                                                                w2, stride_w2, n3, BLOCK_N)
    if NUM_WEIGHTS > 3:
        weight, stride_wn, col_lo, col_hi, first = _next_weight(pid_n, weight, stride_wn, col_lo, col_hi, first,
                                                                w3, stride_w3, N, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = (pid_n - first) * BLOCK_N + tl.arange(0, BLOCK_N)  # rows of this block's weight
    offs_n = col_lo + offs_c  # their output columns
    offs_k = tl.arange(0, BLOCK_K)
    # rows past M and columns past the weight's load the last valid one again (unmasked loads); stores are masked
    x_rows = tl.minimum(offs_m, M - 1)
    w_rows = tl.minimum(offs_c, col_hi - col_lo - 1).to(tl.int64)
    x_ptrs = x + x_rows[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = weight + w_rows[:, None] * stride_wn + offs_k[None, :]
    k_lo = pid_k * k_per_program
    k_hi = tl.minimum(k_lo + k_per_program, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if ACTIVATION is not None:  # gated: the up weight's tile of the same columns, its own accumulator
        u_ptrs = w1 + w_rows[:, None] * stride_w1 + offs_k[None, :]
        acc_up = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PDL:  # the first weight tile streams in under the previous launch's tail; x only after it completes
        w = _load_k_tile(w_ptrs, k_lo, offs_k, K, EVEN_K)
        if ACTIVATION is not None:
            u = _load_k_tile(u_ptrs, k_lo, offs_k, K, EVEN_K)
        gdc_launch_dependents()
        gdc_wait()
        xk = _load_k_tile(x_ptrs, k_lo, offs_k, K, EVEN_K)
        acc += xk[:, None, :] * w[None, :, :]
        if ACTIVATION is not None:
            acc_up += xk[:, None, :] * u[None, :, :]
        k_lo += BLOCK_K
    for k in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        w = _load_k_tile(w_ptrs, k, offs_k, K, EVEN_K)
        xk = _load_k_tile(x_ptrs, k, offs_k, K, EVEN_K)
        acc += xk[:, None, :] * w[None, :, :]
        if ACTIVATION is not None:
            acc_up += xk[:, None, :] * _load_k_tile(u_ptrs, k, offs_k, K, EVEN_K)[None, :, :]
    y = tl.sum(acc, axis=2)
    if ACTIVATION is not None:
        y = _activate(y, ACTIVATION) * tl.sum(acc_up, axis=2)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < col_hi)
    if PARTIAL:
        tl.store(partial + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], y, mask=mask)
    else:
        if HAS_BIAS:
            y += tl.load(bias + offs_n, mask=offs_n < col_hi, other=0.0).to(tl.float32)[None, :]
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
def _launch_plan(widths: tuple[int, ...], K: int, M: int, itemsize: int, n_sm: int, config: LaunchConfig | None,
                 gated: bool = False):
    """(config, cumulative column ends, column blocks, K splits, K per program, BLOCK_M) of one call over weights
    of ``widths`` rows, worked out once per shape. The gated form plans for 2 M rows (its two accumulators take
    their registers) and never splits K (the sum launch would need the activation)."""
    ends = tuple(itertools.accumulate(widths))
    cfg = config or default_config(ends[-1], K, 2 * M if gated else M, itemsize, n_sm)
    if gated and cfg.split_k > 1:
        cfg = dataclasses.replace(cfg, split_k=1)
    splits, k_per_program = split_plan(K, cfg)
    blocks = sum(_cdiv(n, cfg.block_n) for n in widths)  # each weight its own column blocks
    return cfg, ends, blocks, splits, k_per_program, triton.next_power_of_2(M)


def _launch(x: torch.Tensor, weights: Sequence[torch.Tensor], bias: torch.Tensor | None, config: LaunchConfig | None,
            activation: str | None = None) -> torch.Tensor:
    """One launch (two with split K) over 1 to ``GROUP_MAX`` weights sharing x, their columns side by side
    (``activation`` None), or act(x @ weights[0].T) * (x @ weights[1].T) (the gated pair)."""
    K = weights[0].shape[1]
    group = weights if activation is None else weights[:1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    widths = tuple(w.shape[0] for w in group)
    N = sum(widths)
    out = torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)  # rows of N, contiguous
    if M == 0:
        return out
    cfg, ends, blocks, splits, k_per_program, block_m = _launch_plan(
        widths, K, M, x.element_size(), num_sms(x.device.type, x.device.index), config, activation is not None)
    partial = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if splits > 1 else None
    pdl = dependent(x.device)
    w = (*weights, None, None, None)  # unused pointers (and their strides, ends) are None: never read
    strides = (*(t.stride(0) for t in weights), None, None, None)
    n = (*ends, None, None)
    _linear_small_batch_kernel[(blocks, splits)](
        x=x2, w0=w[0], w1=w[1], w2=w[2], w3=w[3], bias=None if partial is not None else bias, out=out, partial=partial,
        M=M, N=N, K=K, k_per_program=k_per_program, stride_xm=x2.stride(0), stride_w0=strides[0],
        stride_w1=strides[1], stride_w2=strides[2], stride_w3=strides[3], n1=n[0], n2=n[1], n3=n[2], stride_om=N,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages,
        NUM_WEIGHTS=len(group), ACTIVATION=activation, PDL=pdl, num_warps=cfg.num_warps, **launch_options(pdl))
    if partial is not None:
        _split_sum_kernel[(_cdiv(N, _REDUCE_BLOCK), M)](
            partial=partial, bias=bias, out=out, M=M, N=N, splits=splits, stride_om=N, BLOCK=_REDUCE_BLOCK,
            num_warps=4)
    return out


def linear_small_batch_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              config: LaunchConfig | None = None) -> torch.Tensor:
    """The Triton path of ``linear_small_batch`` without its checks (the patched modules' per-call
    path, which checks the inputs itself: ``patches/fused_linear.py``)."""
    return _launch(x, (weight,), bias, config)


def linear_small_batch_group_triton(x: torch.Tensor, weights: Sequence[torch.Tensor],
                                    biases: Sequence[torch.Tensor | None] | None = None,
                                    config: LaunchConfig | None = None) -> torch.Tensor:
    """The Triton path of ``linear_small_batch_group`` without its checks (a decode step's per-call path)."""
    return _launch(x, weights, _cat_biases(biases), config)


def linear_small_batch_gated_triton(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor,
                                    activation: str = "silu", config: LaunchConfig | None = None) -> torch.Tensor:
    """The Triton path of ``linear_small_batch_gated`` without its checks (a decode step's per-call path)."""
    return _launch(x, (gate_weight, up_weight), None, config, activation)


def _check_inputs(fn: str, x: torch.Tensor, weights: Sequence[torch.Tensor], names: Sequence[str],
                  biases: Sequence[torch.Tensor | None]) -> None:
    """The public entries' checks (ValueError, one line each): x (..., K), at most ``M_MAX`` rows; each weight
    (N_i, K) with unit stride along K on x's device; one dtype among bf16, fp16, fp32; biases None or (N_i,)."""
    for w, name in zip(weights, names, strict=True):
        if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1] or w.shape[1] == 0 or w.stride(-1) != 1:
            raise ValueError(f"{fn} expects x (..., K) and {name} (N, K), K >= 1, with unit stride along K; got x "
                             f"{tuple(x.shape)}, {name} {tuple(w.shape)} with strides {tuple(w.stride())}")
        if w.device != x.device:
            raise ValueError(f"{fn} expects {name} on x's device {x.device}; got {w.device}")
    dtypes = [t.dtype for t in (x, *weights, *biases) if t is not None]
    if x.dtype not in _KERNEL_DTYPES or any(d != x.dtype for d in dtypes):
        raise ValueError(f"{fn} expects x, {', '.join(names)} and any bias of one dtype among bf16, fp16, fp32; "
                         f"got {', '.join(str(d) for d in dtypes)}")
    for w, b, name in zip(weights, biases, names, strict=True):
        if b is not None and b.shape != w.shape[:1]:  # weight -> bias, weights[i] -> biases[i]
            raise ValueError(f"{fn} expects {name.replace('weights', 'biases').replace('weight', 'bias')} (N,) = "
                             f"({w.shape[0]},); got {tuple(b.shape)}")
    rows = x.numel() // max(1, x.shape[-1])
    if rows > M_MAX:
        raise ValueError(f"{fn} takes at most {M_MAX} rows of x; got {rows} (x {tuple(x.shape)})")


def linear_small_batch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                       backend: str = "auto", config: LaunchConfig | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias) for at most ``M_MAX`` rows of x (see the module notes); dispatches on
    ``backend`` like the decode kernels. ``config`` overrides ``default_config`` (benchmarks, tests)."""
    _check_inputs("linear_small_batch", x, (weight,), ("weight",), (bias,))
    if resolve_backend(backend, x.device) == "triton":
        return linear_small_batch_triton(x, weight, bias, config)
    return linear_small_batch_reference(x, weight, bias)


def linear_small_batch_group(x: torch.Tensor, weights: Sequence[torch.Tensor],
                             biases: Sequence[torch.Tensor | None] | None = None, *, backend: str = "auto",
                             config: LaunchConfig | None = None) -> torch.Tensor:
    """F.linear(x, cat(weights), cat(biases)) of shape (..., sum N_i) for 1 to ``GROUP_MAX`` weights (N_i, K)
    sharing x, in one launch and without concatenating the weights (see the module notes); biases None or one
    per weight, all None or all (N_i,). ``config`` overrides ``default_config(sum N_i, K, M, ...)``."""
    if not isinstance(weights, (tuple, list)) or not 1 <= len(weights) <= GROUP_MAX:
        found = f"{len(weights)}" if isinstance(weights, (tuple, list)) else type(weights).__name__
        raise ValueError(f"linear_small_batch_group expects a tuple or list of 1 to {GROUP_MAX} weights; got {found}")
    if biases is not None and (not isinstance(biases, (tuple, list)) or len(biases) != len(weights)
                               or len({b is None for b in biases}) != 1):
        found = (f"{len(biases)} with {sum(b is None for b in biases)} None" if isinstance(biases, (tuple, list))
                 else type(biases).__name__)
        raise ValueError(f"linear_small_batch_group expects biases None or {len(weights)} entries, all None or all "
                         f"tensors; got {found}")
    names = [f"weights[{i}]" for i in range(len(weights))]
    _check_inputs("linear_small_batch_group", x, weights, names, biases or (None,) * len(weights))
    if resolve_backend(backend, x.device) == "triton":
        return linear_small_batch_group_triton(x, weights, biases, config)
    return linear_small_batch_group_reference(x, weights, biases)


def linear_small_batch_gated(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor, *,
                             activation: str = "silu", backend: str = "auto", config: LaunchConfig | None = None
                             ) -> torch.Tensor:
    """act(x @ gate_weight.T) * (x @ up_weight.T) of shape (..., N) for weights (N, K) and at most ``M_MAX`` rows
    of x: fp32 sums, activation and product, one rounding to x's dtype (see the module notes). ``activation``:
    one of ``ACTIVATIONS``; ``config`` overrides the plan, its ``split_k`` ignored (gated launches never split)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear_small_batch_gated expects activation one of {', '.join(map(repr, ACTIVATIONS))}; "
                         f"got {activation!r}")
    if gate_weight.shape != up_weight.shape:
        raise ValueError(f"linear_small_batch_gated expects gate_weight and up_weight of one shape (N, K); got "
                         f"{tuple(gate_weight.shape)} and {tuple(up_weight.shape)}")
    _check_inputs("linear_small_batch_gated", x, (gate_weight, up_weight), ("gate_weight", "up_weight"), (None, None))
    if resolve_backend(backend, x.device) == "triton":
        return linear_small_batch_gated_triton(x, gate_weight, up_weight, activation, config)
    return linear_small_batch_gated_reference(x, gate_weight, up_weight, activation)
