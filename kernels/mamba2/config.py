"""Launch configurations of the Mamba-2 kernels and their defaults.

``LaunchConfig`` holds the knobs of the replay launch, ``StepConfig`` those of the per-step
baseline; ``default_config`` / ``step_config`` pick them from the shapes alone (no device work),
one rule per line with its reason. The measurements behind each rule:
examples/benchmarks/TUNING.md, section "Mamba-2".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from ..backend import is_pow2, pow2
from ..split_dot import SPLIT_PRECISIONS

__all__ = ["LaunchConfig", "StepConfig", "VerifyConfig", "default_config", "program_split", "step_config",
           "verify_config"]

DOT_PRECISIONS = (None, "tf32", "tf32x3", "ieee") + SPLIT_PRECISIONS


@dataclass(frozen=True)
class LaunchConfig:
    """Knobs of one replay launch.

    block_p: head-dim lanes per program (a power of two; at least 16 for the ``tl.dot`` flush).
    heads_per_program: heads of one group a program walks (rounded to chunks of equal size).
    block_n: state-dim tile of the output-only route; ``>= N`` means one tile, whose loads (the
        first head's) are issued before the cursor is known.
    flush_block_n: state-dim tile of the flush route.
    num_warps: warps per program.
    flush_fma: the flush window update as rank-1 fp32 updates instead of a ``tl.dot``.
    specialize: sizes and checkpoint / ring strides compiled in (one compile per layer shape).
    flush_first: the flushing rows' programs run first; the cursor advance is then counted
        launch-wide (batches up to ``persistent.FLUSH_ROWS``; larger ones keep row order).
    dot_precision: the flush ``tl.dot`` on fp32 operands: a ``tl.dot`` input precision, or ``bf16x2`` /
        ``bf16x3`` (``replayssm.kernels.split_dot``); None: ``tf32x3`` (``ieee`` under the interpreter).
    split_routes: two launches of the same grid, the output-only rows' (compiled without the flush
        route, so with fewer registers) and then the flushing rows' in the flush-first order, which
        moves every row's cursor on (batches up to ``persistent.FLUSH_ROWS``; one launch above). The
        output-only launch reads a one-tile int8 checkpoint as int32 words of four codes.
    flush_warps: warps of the split's flush launch (None: ``num_warps``).
    word_dots: the split's output-only launch takes ``S0 . C`` on int8 words as ``dp4a`` integer products
        against C rounded to 2^-22 of its largest element in byte planes (``int8_dot.planes_dot``)
        instead of decoding each code (a third fewer instructions in its loop over heads, sm_90); off
        until timed on a GPU (TUNING.md).
    """

    block_p: int
    heads_per_program: int
    block_n: int
    flush_block_n: int
    num_warps: int
    flush_fma: bool = False
    specialize: bool = True
    flush_first: bool = False
    dot_precision: str | None = None
    split_routes: bool = False
    flush_warps: int | None = None
    word_dots: bool = False

    def __post_init__(self):
        for name in ("block_p", "block_n", "flush_block_n", "num_warps"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"LaunchConfig.{name} must be a power of two; got {getattr(self, name)!r}")
        if self.flush_warps is not None and not is_pow2(self.flush_warps):
            raise ValueError(f"LaunchConfig.flush_warps must be a power of two or None; got {self.flush_warps!r}")
        if self.heads_per_program < 1:
            raise ValueError(f"LaunchConfig.heads_per_program must be positive; got {self.heads_per_program!r}")
        if self.block_n < 16 or self.flush_block_n < 16:
            raise ValueError(f"LaunchConfig tiles must be at least 16 wide; got block_n={self.block_n}, "
                             f"flush_block_n={self.flush_block_n}")
        if not self.flush_fma and self.block_p < 16:
            raise ValueError(f"the flush route's tl.dot needs block_p >= 16 (or flush_fma=True); got {self.block_p}")
        if self.dot_precision not in DOT_PRECISIONS:
            raise ValueError(f"LaunchConfig.dot_precision must be one of {DOT_PRECISIONS}; got {self.dot_precision!r}")


def program_split(cfg, H: int, P: int, G: int) -> tuple[int, int, int]:
    """(heads per program, head chunks per group, lane blocks per head) of ``cfg`` (a ``LaunchConfig``
    or ``VerifyConfig``) on a layer of ``H`` heads of ``P`` lanes in ``G`` groups: the chunks of a
    group are made equal."""
    HPG = H // G
    n_hc = triton.cdiv(HPG, max(1, min(cfg.heads_per_program, HPG)))
    return triton.cdiv(HPG, n_hc), n_hc, triton.cdiv(P, cfg.block_p)


@functools.lru_cache(maxsize=1024)
def default_config(Bt: int, H: int, P: int, N: int, G: int, L: int, state_bytes: int, act_bytes: int,
                   n_sm: int, fp8: bool = False) -> LaunchConfig:
    """The replay launch for ``Bt`` rows of a layer (H, P, N, G), buffer length L, checkpoint and
    activations of ``state_bytes`` / ``act_bytes`` bytes (``fp8``: an e4m3 checkpoint), ``n_sm``
    multiprocessors."""
    HPG = H // G
    small, lowp = Bt <= 4, state_bytes == 2 and act_bytes == 2
    # one state tile per head up to N = 256 (its loads then go out before the cursor is read)
    block_n = max(16, min(pow2(N), 256)) if N <= 256 else 128
    # 32 lanes x 128 columns (16 KB fp32) per tile; 16 lanes up to batch 4 (P = 80 wastes 32-lane blocks)
    block_p = 16 if small else max(16, min(pow2(P), 4096 // block_n))
    n_pb = triton.cdiv(P, block_p)
    # ~8 programs per SM; at most 8 heads of a group of 16+ (shorter flush programs when rows are staggered)
    hc = max(1, min(HPG if HPG < 16 else 8, (Bt * G * n_pb * HPG) // (8 * n_sm)))
    # 64-column flush tiles, halved for windows over 16 slots (registers)
    block_nf = max(16, min(block_n, 64 * 16 // max(16, pow2(L))))
    # 2 warps (1 with 16-bit flush operands, which 8-bit checkpoints use too, with flush tiles over
    # the whole state dim, ``launch.quant_config``: an fp32 flush tile spills there): reductions stay
    # in a warp
    warps = 1 if lowp or (state_bytes == 1 and act_bytes == 2) else 2
    # compiled-in layout, except 16-bit checkpoint and activations above batch 8 (runtime layout faster)
    specialize = not lowp or Bt <= 8
    # rank-1 fp32 flush up to batch 4 with an fp32 checkpoint and L <= 16 (fits one warp, no spills)
    flush_fma = small and not lowp and pow2(L) <= 16
    if flush_fma:
        # 4 warps when the grid fits one wave of 4-warp programs (3 per SM), else 1 warp
        warps = 4 if Bt * G * triton.cdiv(HPG, hc) * n_pb <= 3 * n_sm else 1
        if warps == 1:
            block_nf = block_n  # one flush tile: the first head flushes from the early loads
    # from batch 32 the flushing rows' programs first (staggered cursors no longer wait for them)
    flush_first = Bt >= 32
    # 8-bit checkpoints in two launches from batch 256 (e4m3) / 128 (int8): the one-launch program's
    # e4m3 flush spills heavily, and int8's output-only launch reads its codes as words; at smaller
    # batches the flushing rows' launch of staggered cursors runs alone
    split = state_bytes == 1 and Bt >= (256 if fp8 else 128)
    # the split's flush launch on 2 warps: on the output launch's 1 its 8-bit flush spills
    flush_warps = 2 if split else None
    hc = program_split(LaunchConfig(block_p, hc, block_n, block_nf, warps, flush_fma), H, P, G)[0]
    return LaunchConfig(block_p, hc, block_n, block_nf, warps, flush_fma=flush_fma, specialize=specialize,
                        flush_first=flush_first, split_routes=split, flush_warps=flush_warps)


@dataclass(frozen=True)
class StepConfig:
    """Knobs of the per-step baseline launch: lanes per program, state-dim tile, warps."""

    block_p: int
    block_n: int
    num_warps: int = 4

    def __post_init__(self):
        for name in ("block_p", "block_n", "num_warps"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"StepConfig.{name} must be a power of two; got {getattr(self, name)!r}")


@functools.lru_cache(maxsize=1024)
def step_config(Bt: int, H: int, P: int, N: int, state_bytes: int, n_sm: int) -> StepConfig:
    """The per-step launch for ``Bt`` rows of a layer (H, P, N) with a ``state_bytes`` state."""
    block_n = max(16, min(pow2(N), 256)) if N <= 256 else 128
    if state_bytes == 4:  # fp32 state: small tiles, two warps (best of the sweep, 95% of the byte floor)
        return StepConfig(max(1, min(pow2(P), 1024 // block_n)), block_n, num_warps=2)
    block_p = max(4, min(pow2(P), 4096 // block_n))
    while block_p > 8 and Bt * H * triton.cdiv(P, block_p) < 4 * n_sm:  # at least 4 programs per SM
        block_p //= 2
    return StepConfig(block_p, block_n)


@dataclass(frozen=True)
class VerifyConfig:
    """Knobs of one verify launch (``verify_programs.py``).

    block_p: head-dim lanes per program (a power of two, at least 16: the products are ``tl.dot``).
    heads_per_program: heads of one group a program walks (rounded to chunks of equal size).
    block_n: state-dim tile (at least 16); ``>= N`` holds a head's checkpoint lanes in one tile.
    num_warps: warps per program.
    dot_precision: the ``tl.dot`` products on fp32 operands: a ``tl.dot`` input precision, or ``bf16x2`` /
        ``bf16x3`` (``replayssm.kernels.split_dot``; a flush-first fold takes ``bf16x3`` for ``bf16x2``);
        None: ``tf32x3`` (``ieee`` under the interpreter).
    """

    block_p: int
    heads_per_program: int
    block_n: int
    num_warps: int
    dot_precision: str | None = None

    def __post_init__(self):
        for name in ("block_p", "block_n", "num_warps"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"VerifyConfig.{name} must be a power of two; got {getattr(self, name)!r}")
        if self.block_p < 16 or self.block_n < 16:
            raise ValueError(f"VerifyConfig tiles must be at least 16 wide (tl.dot); got block_p={self.block_p}, "
                             f"block_n={self.block_n}")
        if self.heads_per_program < 1:
            raise ValueError(f"VerifyConfig.heads_per_program must be positive; got {self.heads_per_program!r}")
        if self.dot_precision not in DOT_PRECISIONS:
            raise ValueError(f"VerifyConfig.dot_precision must be one of {DOT_PRECISIONS}; got {self.dot_precision!r}")


@functools.lru_cache(maxsize=1024)
def verify_config(Bt: int, H: int, P: int, N: int, G: int, n_sm: int) -> VerifyConfig:
    """The verify launch for ``Bt`` rows of a layer (H, P, N, G) on ``n_sm`` multiprocessors: 16 lanes
    (every warp of the ``C . S0`` product holds the whole C tile, so wider lane blocks only add
    registers; P = 80 splits evenly), one state tile per head up to N = 256; 4 heads per program on
    2 warps once that gives 4 programs per SM, else one head on 4 warps; the fp32 products as two
    bf16 parts (``split_dot``: the outputs are rounded to the activation dtype after them; a
    flush-first fold takes three). Timings: ``examples/benchmarks/TUNING.md``."""
    block_n = max(16, min(pow2(N), 256)) if N <= 256 else 128
    block_p = 16
    n_pb = triton.cdiv(P, block_p)
    HPG = H // G
    if Bt * G * n_pb * triton.cdiv(HPG, 4) >= 4 * n_sm:
        return VerifyConfig(block_p, min(4, HPG), block_n, 2, "bf16x2")
    return VerifyConfig(block_p, 1, block_n, 4, "bf16x2")
