"""Triton program of the ordinary per-step delta-rule recurrence (the baseline; semantics:
``delta_step_decode_reference``, Hugging Face's order, fp32 arithmetic, the state rounded once).
Host side: ``launch.launch_step``."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import head_block


@triton.jit
def step_kernel(t, io, lay, NV, KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """One program per (row, value head, block of BV value columns) with the whole key dim: load the
    state tile, decay it, ``r = S^T k``, ``u = beta (v - r)``, ``S += k u^T``, ``o = S^T q``, store
    the state tile. The state is read and written every step."""
    i_v, i_bh, b, h, hk = head_block(NV, lay)

    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < lay.K
    mv = offs_v < lay.V
    s_ptrs = t.state + b * lay.s_b + h * lay.s_h + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v
    s_mask = mk[:, None] & mv[None, :]

    s = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    qv = tl.load(t.q + b * io.q_b + hk * io.q_h + offs_k * io.q_k, mask=mk, other=0.0).to(tl.float32)
    kv = tl.load(t.k + b * io.k_b + hk * io.k_h + offs_k * io.k_k, mask=mk, other=0.0).to(tl.float32)
    vv = tl.load(t.v + b * io.v_b + h * io.v_h + offs_v * io.v_v, mask=mv, other=0.0).to(tl.float32)
    beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h).to(tl.float32)
    if KDA:
        gv = tl.load(t.g + b * io.g_b + h * io.g_h + offs_k * io.g_k, mask=mk, other=0.0).to(tl.float32)
        s = s * tl.exp(gv)[:, None]
    else:
        gs = tl.load(t.g + b * io.g_b + h * io.g_h).to(tl.float32)
        s = s * tl.exp(gs)
    r = tl.sum(s * kv[:, None], axis=0)
    u = (vv - r) * beta
    s = s + kv[:, None] * u[None, :]
    o = tl.sum(s * qv[:, None], axis=0)
    tl.store(s_ptrs, s.to(t.state.dtype.element_ty), mask=s_mask)
    tl.store(t.out + b * io.out_b + h * io.out_h + offs_v * io.out_v, o.to(t.out.dtype.element_ty), mask=mv)
