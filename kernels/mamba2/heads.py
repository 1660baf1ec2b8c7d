"""Triton helpers of the Mamba-2 programs for one head: its dt (``softplus``, ``process_dt``), its
constants ``(A, dt_bias, D)``, the replay window's weights, and its checkpoint's scales and rounded
store (``quant_triton``). Used by the replay (``programs.py``), verify (``verify_programs.py``) and
per-step (``step.py``) programs; ``k`` is the calling program's ``Flags``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant_triton import quantize_tile, row_key, uniform_bits


@triton.jit
def softplus(d):
    """softplus(d) = log1p(exp(d)) with identity above 20 (torch's threshold), accurate for small values."""
    u = tl.exp(-tl.abs(d))
    v = 1.0 + u
    # log1p(u) via log(v) * u / (v - 1): exact to a few ulp even when u << 1.
    lp = tl.where(v == 1.0, u, tl.log(v) * (u / tl.where(v == 1.0, 1.0, v - 1.0)))
    sp = tl.maximum(d, 0.0) + lp
    return tl.where(d > 20.0, d, sp)


@triton.jit
def process_dt(d_raw, dtb, k):
    """``reference.process_dt`` of one head: the raw dt in fp32, plus dt_bias ``dtb`` (HAS_DT_BIAS),
    through ``softplus`` (DT_SOFTPLUS)."""
    d = d_raw.to(tl.float32)
    if k.HAS_DT_BIAS:
        d += dtb
    if k.DT_SOFTPLUS:
        d = softplus(d)
    return d


@triton.jit
def head_constants(h, ok, t, io, k):
    """Head ``h``'s ``(A, dt_bias, D)`` as fp32 scalars (0 where absent or ``ok`` is false), loaded
    together so that a caller can issue them early (before the cursor, or with the next head's tiles)."""
    a_h = tl.load(t.A + h * io.A, mask=ok, other=0.0).to(tl.float32)
    dtb = 0.0
    if k.HAS_DT_BIAS:
        dtb = tl.load(t.dt_bias + h * io.dt_bias, mask=ok, other=0.0).to(tl.float32)
    dco = 0.0
    if k.HAS_D:
        dco = tl.load(t.D + h * io.D, mask=ok, other=0.0).to(tl.float32)
    return a_h, dtb, dco


@triton.jit
def decay(x):
    """exp(min(x, 0)): a decay factor exp(A P) (A <= 0, P >= 0; masked slots clamp to 1), NaN kept (the
    GPU's plain minimum would return 0 for a NaN A or dt, a silently finite decay of 1)."""
    return tl.exp(tl.minimum(x, 0.0, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def window_weights(dtw, d, cur_l, a_h):
    """Put the current dt at slot c; weights w_j = dt_j exp(A (Pcum_c - Pcum_j)) and abar = exp(A Pcum_c)."""
    dtw = tl.where(cur_l, d, dtw.to(tl.float32))
    pcum = tl.cumsum(dtw, 0)
    p_c = tl.sum(tl.where(cur_l, pcum, 0.0), 0)
    w = dtw * decay(a_h * (p_c - pcum))
    abar = decay(a_h * p_c)
    return w, abar


@triton.jit
def head_scale(b, h, offs_p, mask_p, t, io, k):
    """fp32 scales (BLOCK_P,) of head ``h``'s checkpoint lanes (1 for unscaled checkpoints)."""
    if k.FMT >= 3:
        return tl.load(t.scale + b * io.sc_b + h * io.sc_h + offs_p * io.sc_p, mask=mask_p, other=0.0)
    else:
        return tl.full([k.BLOCK_P], 1.0, tl.float32)


@triton.jit
def round_state_tile(s_new, m2, b, h, offs_p, nn, t, io, lay, k, AXIS: tl.constexpr):
    """``quant_triton.quantize_tile`` of a checkpoint tile that spans N (lanes off ``m2`` count as
    zero): (BLOCK_P, N-tile) over AXIS 1, or transposed (N-tile, BLOCK_P) over AXIS 0. Returns
    (values whose cast to the stored dtype is exact, lane scales), with the random bits of element
    ``(h P + p) N + n`` under the row's key (``state_rng`` [seed, counter], the counter advanced
    before the launch) when SR."""
    u = 0
    if k.SR:
        key = row_key(tl.load(t.rng + b * io.rng_b), tl.load(t.rng + b * io.rng_b + 1))
        if AXIS == 1:
            u = uniform_bits(key, (h * lay.P + offs_p[:, None]) * lay.N + nn[None, :])
        else:
            u = uniform_bits(key, (h * lay.P + offs_p[None, :]) * lay.N + nn[:, None])
    return quantize_tile(tl.where(m2, s_new, 0.0), u, AXIS, k.FMT, k.SR)


@triton.jit
def store_state_tile(ptrs, s_new, m2, b, h, offs_p, mask_p, nn, t, io, lay, k):
    """Store a flush tile (BLOCK_P, N-tile) of the new checkpoint: a plain cast, or (FMT >= 3 / SR)
    through ``round_state_tile`` (its lane scales stored too)."""
    if (k.FMT >= 3) | k.SR:
        q, d = round_state_tile(s_new, m2, b, h, offs_p, nn, t, io, lay, k, 1)
        tl.store(ptrs, q.to(t.state.dtype.element_ty), mask=m2)
        if k.FMT >= 3:
            tl.store(t.scale + b * io.sc_b + h * io.sc_h + offs_p * io.sc_p, d, mask=mask_p)
    else:
        tl.store(ptrs, s_new.to(t.state.dtype.element_ty), mask=m2)
