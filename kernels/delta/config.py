"""Launch configuration of the delta-rule replay kernels and its defaults.

``LaunchConfig`` holds the knobs of one replay step (the one-launch kernel for small batches, or
the coefficient, output and flush launches); ``default_config`` picks them from the shapes alone,
one rule per line with its reason. ``VerifyConfig`` / ``default_verify_config``: the same for the
verify step of speculative decoding (``verify_programs.py``). The measurements behind each rule:
examples/benchmarks/TUNING.md, section "Delta rule".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from ..backend import is_pow2

__all__ = ["LaunchConfig", "SMALL_BATCH_MAX", "VerifyConfig", "default_config", "default_verify_config"]

#: batches up to this many rows run the one-launch kernel (launch latency dominates there)
SMALL_BATCH_MAX = 4
#: largest batch whose one-launch kernel reads the cursor with the arrival's atomic
SMALL_BATCH_ARRIVE_FIRST = 2


@dataclass(frozen=True)
class LaunchConfig:
    """Knobs of one delta-rule replay step.

    one_launch: the one-launch kernel (K <= 256) instead of the three launches.
    arrive_first: (one launch) the arrival's atomic also reads the cursor, before any load.
    block_v, num_warps: value columns and warps of an output program (or one-launch program).
    block_k: key-dim tile of the output launch, and of the flush launch unless ``flush_output``
        (which takes the whole key dim in one tile); at most 256.
    flush_block_v, flush_warps, flush_stages: the flush launch's column block, warps and
        software-pipelining stages; flush_programs: its programs per multiprocessor.
    coef_block_k: key-dim tile of the coefficient launch.
    coef_per_key_head: (Gated DeltaNet) one coefficient program per key head, shared by its value
        heads; coef_write_x: that launch also writes the decay-scaled k_c and q.
    coef_windows: (KDA) ring windows, 1-3, a coefficient program picks from by its cursor.
    flush_bf16_split: the flush's matrix product as three bf16 products of a hi/mid/lo split
        (where the exact operand's ring is bf16; never under the interpreter).
    flush_head_items: flush work items of a whole value head (its column blocks walked in turn).
    flush_output: the flush launch computes the flush rows' step (the checkpoint read once).
    flush_prefetch: the flush loads each column block's checkpoint tile one block ahead.
    dependent_launch: the output launch starts under the coefficient launch's tail (programmatic
        dependent launch, where the device supports it); otherwise the flush launch starts
        under the output launch's.
    """

    one_launch: bool
    block_v: int
    num_warps: int
    arrive_first: bool = False
    block_k: int = 128
    flush_block_v: int = 32
    flush_warps: int = 2
    flush_programs: int = 8
    flush_stages: int = 1
    coef_block_k: int = 128
    coef_per_key_head: bool = False
    coef_write_x: bool = True
    coef_windows: int = 1
    flush_bf16_split: bool = True
    flush_head_items: bool = True
    flush_output: bool = True
    flush_prefetch: bool = False
    dependent_launch: bool = False

    def __post_init__(self):
        for name in ("block_v", "num_warps", "block_k", "flush_block_v", "flush_warps", "coef_block_k"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"LaunchConfig.{name} must be a power of two; got {getattr(self, name)!r}")
        if self.block_k > 256:
            raise ValueError(f"LaunchConfig.block_k must be at most 256; got {self.block_k}")
        if self.coef_windows not in (1, 2, 3):
            raise ValueError(f"LaunchConfig.coef_windows must be 1, 2 or 3; got {self.coef_windows!r}")
        if self.flush_programs < 1 or self.flush_stages < 1:
            raise ValueError(f"LaunchConfig.flush_programs and flush_stages must be positive; got "
                             f"{self.flush_programs}, {self.flush_stages}")


@functools.lru_cache(maxsize=256)
def default_config(Bt: int, K: int, V: int, state_dtype: torch.dtype, kda: bool) -> LaunchConfig:
    """The replay step for ``Bt`` rows of a layer with key / value dims ``K`` / ``V``, a checkpoint of
    ``state_dtype``, KDA (per-channel decays) or Gated DeltaNet."""
    bk = min(triton.next_power_of_2(K), 256)
    if Bt <= SMALL_BATCH_MAX and bk == triton.next_power_of_2(K):
        # one launch at batch 1-4 (launch latency); the atomic reads the cursor up to batch 2
        return LaunchConfig(one_launch=True, block_v=32 if bk <= 128 else 16, num_warps=4 if bk <= 128 else 8,
                            arrive_first=Bt <= SMALL_BATCH_ARRIVE_FIRST, block_k=bk)
    if bk >= 256:  # (not tuned: the first choices, kept)
        return LaunchConfig(one_launch=False, block_v=32, num_warps=8, block_k=bk, flush_block_v=16, flush_warps=8,
                            flush_programs=4, flush_stages=2, coef_block_k=64, flush_bf16_split=False,
                            flush_head_items=False, flush_output=False)
    fp32 = state_dtype.itemsize == 4
    # output programs of 1-2 warps (the key-dim reduction crosses warps); 64 columns for GDN fp32
    block_v, warps = (32, 1) if not fp32 else ((32, 2) if kda else (64, 2))
    # GDN with 16-bit checkpoints: the output launch keeps the flush rows (its checkpoint load would
    # wait for the cursor), and the flush runs 128-column items on 2 programs per SM with 4 warps
    gdn16 = not kda and not fp32
    # GDN with 8-bit checkpoints: 64-column output programs, and 32-column flush items on 8 programs
    # per SM (the flush's absmax and rounding span whole key-dim columns); KDA int8: 64 columns too
    gdn8 = gdn16 and state_dtype.itemsize == 1
    if gdn8 or (kda and state_dtype == torch.int8):
        block_v = 64
    # e4m3 from batch 256: 128 columns over 32-key tiles (no int32-word read to keep the key dim whole for)
    if state_dtype == torch.float8_e4m3fn and Bt >= 256 and bk == 128:
        block_v, bk = 128, 32
    return LaunchConfig(
        one_launch=False, block_v=block_v, num_warps=warps, block_k=bk,
        flush_block_v=128 if gdn16 and not gdn8 else 32, flush_warps=4 if gdn16 else 2,
        flush_programs=2 if gdn16 and not gdn8 else 8,
        # 2-stage flush item loop only where neither whole-head items (KDA) nor prefetching (GDN fp32) run
        flush_stages=1 if kda or fp32 else 2,
        coef_block_k=128,
        coef_per_key_head=not kda,  # GDN: ring-key products once per key head
        coef_write_x=fp32,  # GDN fp32: the coefficient launch writes the scaled k_c and q
        coef_windows=3 if kda else 1,  # KDA: half and quarter windows for rows with few entries
        flush_output=not gdn16,  # the flush launch computes the flush rows' step
        flush_prefetch=not kda and fp32,  # GDN fp32: each column block's checkpoint tile a block ahead
        dependent_launch=kda and fp32,  # KDA fp32: the output launch under the coefficient launch's tail
    )


@dataclass(frozen=True)
class VerifyConfig:
    """Knobs of one delta-rule verify step.

    block_v, num_warps: value columns and warps of a program (whose tile spans the key dim).
    arrive: the cursors move on inside the launch (arrivals on the cursor word, ``kernels/cursor.py``)
        instead of in a second, per-row launch; needs int32 cursors and L <= 127.
    """

    block_v: int = 32
    num_warps: int = 4
    arrive: bool = True

    def __post_init__(self):
        for name in ("block_v", "num_warps"):
            if not is_pow2(getattr(self, name)):
                raise ValueError(f"VerifyConfig.{name} must be a power of two; got {getattr(self, name)!r}")


@functools.lru_cache(maxsize=256)
def default_verify_config(K: int, Bt: int = 1, kda: bool = False, rounds: bool = False) -> VerifyConfig:
    """The verify step of ``Bt`` rows of a layer with key dim ``K``, up to K = 128: Gated DeltaNet on
    one warp per program, 16 value columns below batch 32 (more programs) and 32 from there; KDA 16
    columns on 4 warps below batch 32 and 64 on 2 from there (each the fastest of a sweep). Above
    K = 128 the one-launch decode kernel's tile: 32 columns on 8 warps. ``rounds``: a checkpoint
    stored below fp32, whose fold rounds (a 16-bit cast, or ``quantize_tile`` for int8 / fp8 and
    stochastic rounding): on one or two warps those programs spill (sm_90: 280-920 bytes of stack at
    batch 256), on twice as many they do not, so they get twice the warps. Timings and compiles:
    ``examples/benchmarks/TUNING.md``."""
    if triton.next_power_of_2(K) > 128:
        return VerifyConfig(block_v=32, num_warps=8)
    if not kda:
        cfg = VerifyConfig(block_v=16 if Bt < 32 else 32, num_warps=1)
    else:
        cfg = VerifyConfig(block_v=16, num_warps=4) if Bt < 32 else VerifyConfig(block_v=64, num_warps=2)
    if rounds and cfg.num_warps <= 2:
        cfg = VerifyConfig(block_v=cfg.block_v, num_warps=2 * cfg.num_warps, arrive=cfg.arrive)
    return cfg
