"""Triton kernel of the delta-rule ReplaySSM decode step (Gated DeltaNet and KDA).

One program owns one (row b, value head h, block of BV value columns). It rebuilds the
decayed history state ``A = exp(G_c) S0 + sum_{j<c} (exp(G_c - G_j) k_j) u_j^T`` tile by
tile over the key dim (a tensor-core dot of the cached keys, decay-weighted, with the
cached u's, plus the decayed checkpoint tile), accumulates ``A^T k_c`` and ``A^T q``
across K tiles, then forms ``u_c = beta (v - A^T k_c)`` and ``o = A^T q + (k_c . q) u_c``
in fp32 (see ``reference.py``: the current token enters its own output unrounded).

Flush rows (``cursor == L - 1``, decided per row on the device) write
``A + k_c u_c^T`` back as the new checkpoint (when the key dim spans several tiles, a
second walk over the K tiles rebuilds each tile for the write); other active rows append
``(u_c, k_c, g_c)`` at ring slot ``cursor``. Rows with a negative cursor load nothing and
store nothing (except zeros into a freshly allocated output). The cursors are advanced
by a second tiny launch, after every program has read them. No host-side decision
depends on tensor values, so the launches can be captured in a CUDA graph.

``route`` (constexpr): 0 = state-and-output on every row (the default); 1 = on non-flush
rows read the output without forming A (``S0^T x`` plus inner products with the cached
keys), on flush rows as route 0. Both give the same result up to rounding.

fp32 dots use ``input_precision="tf32x3"`` (plain tf32 drifts ~1e-2); the interpreter
uses ``"ieee"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import triton_interpreter_on
from .reference import _check_shapes

__all__ = ["delta_replay_decode_triton", "advance_cursor_triton"]


@triton.jit
def _load_tile(q_base, k_base, s_base, kb_base, g_base, gb_base,
               offs_k, offs_v, offs_l, mv, ml,
               sq_k, sk_k, ss_k, ss_v, skb_l, skb_k, sg_k, sgb_l, sgb_k, k_lim, dec_s,
               KDA: tl.constexpr):
    """Loads one K tile: returns (decayed S0 tile, decay-weighted cached keys^T, k, q, g, key mask).

    ``a0`` (BK, BV) = exp(G_c) * S0 tile; ``kw`` (BK, LP) = cached keys^T, times
    exp(G_c - G_j) per channel for KDA (for GDN the per-entry weights go on the u side).
    ``k_lim`` is K on active rows and 0 on idle ones (scalar conditions are folded into
    bounds rather than and-ed with vector masks).
    """
    mk = offs_k < k_lim
    qv = tl.load(q_base + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32)
    kv = tl.load(k_base + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32)
    kw = tl.load(kb_base + offs_k[:, None] * skb_k + offs_l[None, :] * skb_l,
                 mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)
    s0 = tl.load(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                 mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
    if KDA:
        gv = tl.load(g_base + offs_k * sg_k, mask=mk, other=0.0).to(tl.float32)
        gh = tl.load(gb_base + offs_k[:, None] * sgb_k + offs_l[None, :] * sgb_l,
                     mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP)
        gcum = tl.cumsum(gh, axis=1)
        gtot = tl.sum(gh, axis=1) + gv  # G_c per key channel
        kw = kw * tl.exp(gtot[:, None] - gcum)
        a0 = s0 * tl.exp(gtot)[:, None]
    else:
        gv = tl.zeros_like(qv)
        a0 = s0 * dec_s
    return a0, kw, kv, qv, gv, mk


@triton.jit
def _delta_replay_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, ub_ptr, kb_ptr, gb_ptr, cur_ptr, o_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    sv_b, sv_h, sv_v,
    sg_b, sg_h, sg_k,
    sbt_b, sbt_h,
    ss_b, ss_h, ss_k, ss_v,
    sub_b, sub_h, sub_l, sub_v,
    skb_b, skb_h, skb_l, skb_k,
    sgb_b, sgb_h, sgb_l, sgb_k,
    so_b, so_h, so_v,
    sc_b,
    HV, GROUP, K, V, L, NV,
    KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr,
    ROUTE: tl.constexpr, WRITE_IDLE: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    i_v = pid % NV
    i_bh = pid // NV
    b = (i_bh // HV).to(tl.int64)
    h = i_bh % HV
    hk = h // GROUP

    c = tl.load(cur_ptr + b * sc_b)
    active = c >= 0
    cc = tl.maximum(c, 0)
    flush = c == L - 1
    append = active & (c != L - 1)
    # Scalar conditions become bounds: 0 disables every lane.
    k_lim = tl.where(active, K, 0)
    k_lim_flush = tl.where(flush, K, 0)
    v_lim_append = tl.where(append, V, 0)
    lead = (i_v == 0) & (h % GROUP == 0)
    k_lim_kbuf = tl.where(lead, tl.where(append, K, 0), 0)  # one program per key head writes k
    k_lim_gbuf = tl.where(i_v == 0, tl.where(append, K, 0), 0)

    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < tl.where(active, V, 0)
    offs_l = tl.arange(0, LP)
    ml = offs_l < cc  # buffered entries j < c (never reads slots >= c; cc = 0 on idle rows)

    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    g_base = g_ptr + b * sg_b + h * sg_h
    s_base = s_ptr + b * ss_b + h * ss_h
    ub_base = ub_ptr + b * sub_b + h * sub_h
    kb_base = kb_ptr + b * skb_b + hk * skb_h
    gb_base = gb_ptr + b * sgb_b + h * sgb_h

    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h, mask=active, other=0.0).to(tl.float32)
    ub = tl.load(ub_base + offs_l[:, None] * sub_l + offs_v[None, :] * sub_v,
                 mask=ml[:, None] & mv[None, :], other=0.0).to(tl.float32)  # (LP, BV)
    if KDA:
        rhs = ub
        dec_s = 1.0
        gc = 0.0
    else:
        gc = tl.load(g_base, mask=active, other=0.0).to(tl.float32)
        gh = tl.load(gb_base + offs_l * sgb_l, mask=ml, other=0.0).to(tl.float32)  # (LP,)
        gcum = tl.cumsum(gh, axis=0)
        gtot = tl.sum(gh, axis=0) + gc
        w = tl.where(ml, tl.exp(gtot - gcum), 0.0)
        rhs = ub * w[:, None]  # decay-weighted u's
        dec_s = tl.exp(gtot)

    if NK == 1:
        offs_k = tl.arange(0, BK)
        a0, kw, kv, qv, gv, mk = _load_tile(q_base, k_base, s_base, kb_base, g_base, gb_base,
                                            offs_k, offs_v, offs_l, mv, ml,
                                            sq_k, sk_k, ss_k, ss_v, skb_l, skb_k, sg_k, sgb_l, sgb_k, k_lim, dec_s,
                                            KDA)
        kq = tl.sum(kv * qv, axis=0)
        s_ptrs = s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
        s_mask_flush = (offs_k < k_lim_flush)[:, None] & mv[None, :]
        if ROUTE == 0:
            acc = a0 + tl.dot(kw, rhs, input_precision=DOT_PREC)  # A tile (BK, BV)
            r = tl.sum(acc * kv[:, None], axis=0)
            hq = tl.sum(acc * qv[:, None], axis=0)
            u = beta * (vv - r)
            o = hq + kq * u
            tl.store(s_ptrs, (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty), mask=s_mask_flush)
        else:
            if flush:
                acc = a0 + tl.dot(kw, rhs, input_precision=DOT_PREC)
                r = tl.sum(acc * kv[:, None], axis=0)
                hq = tl.sum(acc * qv[:, None], axis=0)
                u = beta * (vv - r)
                o = hq + kq * u
                tl.store(s_ptrs, (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty), mask=s_mask_flush)
            else:
                ak = tl.sum(kw * kv[:, None], axis=0)  # (LP,) weighted k_j . k_c
                aq = tl.sum(kw * qv[:, None], axis=0)
                r = tl.sum(a0 * kv[:, None], axis=0) + tl.sum(ak[:, None] * rhs, axis=0)
                hq = tl.sum(a0 * qv[:, None], axis=0) + tl.sum(aq[:, None] * rhs, axis=0)
                u = beta * (vv - r)
                o = hq + kq * u
        tl.store(kb_base + cc * skb_l + offs_k * skb_k, kv.to(kb_ptr.dtype.element_ty), mask=offs_k < k_lim_kbuf)
        if KDA:
            tl.store(gb_base + cc * sgb_l + offs_k * sgb_k, gv.to(gb_ptr.dtype.element_ty), mask=offs_k < k_lim_gbuf)
    else:
        r = tl.zeros([BV], dtype=tl.float32)
        hq = tl.zeros([BV], dtype=tl.float32)
        kqv = tl.zeros([BK], dtype=tl.float32)
        for i_k in range(NK):
            offs_k = i_k * BK + tl.arange(0, BK)
            a0, kw, kv, qv, gv, mk = _load_tile(q_base, k_base, s_base, kb_base, g_base, gb_base,
                                                offs_k, offs_v, offs_l, mv, ml,
                                                sq_k, sk_k, ss_k, ss_v, skb_l, skb_k, sg_k, sgb_l, sgb_k, k_lim,
                                                dec_s, KDA)
            acc = a0 + tl.dot(kw, rhs, input_precision=DOT_PREC)
            r += tl.sum(acc * kv[:, None], axis=0)
            hq += tl.sum(acc * qv[:, None], axis=0)
            kqv += kv * qv
            tl.store(kb_base + cc * skb_l + offs_k * skb_k, kv.to(kb_ptr.dtype.element_ty), mask=offs_k < k_lim_kbuf)
            if KDA:
                tl.store(gb_base + cc * sgb_l + offs_k * sgb_k, gv.to(gb_ptr.dtype.element_ty), mask=offs_k < k_lim_gbuf)
        u = beta * (vv - r)
        o = hq + tl.sum(kqv, axis=0) * u
        if flush:
            for i_k in range(NK):
                offs_k = i_k * BK + tl.arange(0, BK)
                a0, kw, kv, qv, gv, mk = _load_tile(q_base, k_base, s_base, kb_base, g_base, gb_base,
                                                    offs_k, offs_v, offs_l, mv, ml,
                                                    sq_k, sk_k, ss_k, ss_v, skb_l, skb_k, sg_k, sgb_l, sgb_k,
                                                    k_lim, dec_s, KDA)
                acc = a0 + tl.dot(kw, rhs, input_precision=DOT_PREC)
                tl.store(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                         (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty),
                         mask=(offs_k < k_lim_flush)[:, None] & mv[None, :])

    tl.store(ub_base + cc * sub_l + offs_v * sub_v, u.to(ub_ptr.dtype.element_ty), mask=offs_v < v_lim_append)
    if not KDA:
        tl.store(gb_base + cc * sgb_l, gc.to(gb_ptr.dtype.element_ty), mask=k_lim_gbuf > 0)
    if WRITE_IDLE:
        o_mask = offs_v < V  # idle rows: every load was masked, so o == 0 there
    else:
        o_mask = mv
    tl.store(o_ptr + b * so_b + h * so_h + offs_v * so_v, o.to(o_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _advance_cursor_kernel(cur_ptr, sc_b, Bt, L, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < Bt
    c = tl.load(cur_ptr + offs * sc_b, mask=m, other=-1)
    tl.store(cur_ptr + offs * sc_b, tl.where(c >= 0, (c + 1) % L, c), mask=m)


def advance_cursor_triton(cursor: torch.Tensor, L: int) -> None:
    """``cursor <- (cursor + 1) % L`` where ``cursor >= 0`` (in place, one small launch)."""
    Bt = cursor.shape[0]
    if Bt == 0:
        return
    BLOCK = 256
    _advance_cursor_kernel[(triton.cdiv(Bt, BLOCK),)](cursor, cursor.stride(0), Bt, L, BLOCK=BLOCK)


def _default_config(K: int, V: int, state_dtype: torch.dtype, kda: bool):
    """(block_v, num_warps) picked per shape; see examples/benchmarks/bench_delta.py."""
    bk = triton.next_power_of_2(K)
    if bk >= 256:
        return 16, 8
    return 32, 4


def delta_replay_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    u_buf: torch.Tensor,
    k_buf: torch.Tensor,
    g_buf: torch.Tensor,
    cursor: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    write_idle: bool | None = None,
    route: int = 0,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Triton version of ``delta_replay_decode_reference`` (same arguments and result).

    Keyword-only extras: ``write_idle`` (store zeros for idle rows; defaults to
    ``out is None``), and tuning knobs ``route`` (0 state-and-output, 1 output-only on
    non-flush rows), ``block_v``, ``block_k`` (K tile; default the whole key dim up to
    256), ``num_warps``.
    """
    Bt, HV, Hk, L, K, V = _check_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf)
    if cursor.dtype != torch.int32 or tuple(cursor.shape) != (Bt,):
        raise ValueError("cursor must be a (Bt,) int32 tensor")
    kda = g.dim() == 3
    if write_idle is None:
        write_idle = out is None
    if out is None:
        out = torch.empty((Bt, HV, V), dtype=v.dtype, device=v.device)
    if Bt == 0:
        return out
    bv_def, nw_def = _default_config(K, V, state.dtype, kda)
    BV = block_v or min(bv_def, triton.next_power_of_2(V))
    BV = max(BV, 16)
    BK = block_k or min(triton.next_power_of_2(K), 256)
    BK = max(BK, 16)
    NK = triton.cdiv(K, BK)
    LP = max(16, triton.next_power_of_2(L))
    NV = triton.cdiv(V, BV)
    if NK > 1:
        route = 0
    sg = (g.stride(0), g.stride(1), g.stride(2) if kda else 0)
    sgb = (g_buf.stride(0), g_buf.stride(1), g_buf.stride(2), g_buf.stride(3) if kda else 0)
    grid = (Bt * HV * NV,)
    _delta_replay_kernel[grid](
        q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out,
        *q.stride(), *k.stride(), *v.stride(), *sg, *beta.stride(),
        *state.stride(), *u_buf.stride(), *k_buf.stride(), *sgb, *out.stride(), cursor.stride(0),
        HV, HV // Hk, K, V, L, NV,
        KDA=kda, BK=BK, NK=NK, BV=BV, LP=LP, ROUTE=route, WRITE_IDLE=bool(write_idle),
        DOT_PREC="ieee" if triton_interpreter_on() else "tf32x3",
        num_warps=num_warps or nw_def,
    )
    advance_cursor_triton(cursor, L)
    return out
