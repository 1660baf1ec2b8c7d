"""Triton helpers of the delta-rule programs that own a block of value columns of one (row, value
head): which block a program owns (``head_block``), and the column scales and rounded store of its
checkpoint tile (``quant_triton``). Shared by the multi-launch (``programs.py``), one-launch
(``small_batch.py``), verify (``verify_programs.py``) and per-step (``step.py``) programs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant_triton import quantize_tile, row_key, uniform_bits


@triton.jit
def head_block(NV, lay):
    """(column block, row x value head, row (int64), value head, key head) of a program that owns one
    block of value columns of one (row, value head)."""
    pid = tl.program_id(0)
    i_bh = pid // NV
    h = i_bh % lay.HV
    return pid % NV, i_bh, (i_bh // lay.HV).to(tl.int64), h, h // lay.GROUP


@triton.jit
def column_scale(b, h, offs_v, mv, t, io, FMT: tl.constexpr):
    """fp32 scales (BV,) of value columns ``offs_v`` of (row b, value head h)'s checkpoint: one per
    column over the key dim (1 for unscaled checkpoints, FMT < 3)."""
    if FMT >= 3:
        return tl.load(t.scale + b * io.sc_b + h * io.sc_h + offs_v * io.sc_v, mask=mv, other=0.0)
    else:
        return tl.full(offs_v.shape, 1.0, tl.float32)


@triton.jit
def round_state_tile(s_new, m2, b, h, offs_k, offs_v, t, io, lay, FMT: tl.constexpr, SR: tl.constexpr,
                     CAST_E4M3: tl.constexpr = False):
    """``quant_triton.quantize_tile`` of a checkpoint tile (BK, BV) that spans the key dim (lanes off
    ``m2`` count as zero): (values whose cast to the stored dtype is exact, column scales), with the
    random bits of element ``(h K + k) V + v`` under the row's key (``state_rng`` [seed, counter], the
    counter advanced before the launch) when SR."""
    if SR:
        key = row_key(tl.load(t.rng + b * io.rng_b), tl.load(t.rng + b * io.rng_b + 1))
        u = uniform_bits(key, (h * lay.K + offs_k[:, None]) * lay.V + offs_v[None, :])
    else:
        u = 0
    return quantize_tile(tl.where(m2, s_new, 0.0), u, 0, FMT, SR, CAST_E4M3)


@triton.jit
def store_state_tile(ptrs, s_new, mk, mv, b, h, offs_k, offs_v, t, io, lay, FMT: tl.constexpr, SR: tl.constexpr,
                     CAST_E4M3: tl.constexpr = False):
    """Store a checkpoint tile (BK, BV) that spans the key dim: a plain cast, or (FMT >= 3 / SR)
    through ``round_state_tile`` (the column scales stored too). CAST_E4M3: ``quant_triton.round_to``."""
    m2 = mk[:, None] & mv[None, :]
    if (FMT >= 3) | SR:
        q, d = round_state_tile(s_new, m2, b, h, offs_k, offs_v, t, io, lay, FMT, SR, CAST_E4M3)
        tl.store(ptrs, q.to(t.state.dtype.element_ty), mask=m2)
        if FMT >= 3:
            tl.store(t.scale + b * io.sc_b + h * io.sc_h + offs_v * io.sc_v, d, mask=mv)
    else:
        tl.store(ptrs, s_new.to(t.state.dtype.element_ty), mask=m2)
