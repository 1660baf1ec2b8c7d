"""Triton kernel of the delta-rule ReplaySSM decode step (Gated DeltaNet and KDA).

One program owns one (row b, value head h, block of BV value columns) and the whole key
dim (one K tile up to 256; larger K is walked tile by tile). With ``c = cursor[b]``
buffered entries, the decayed history state is
``A = exp(G_c) S0 + sum_{j<c} (exp(G_c - G_j) k_j) u_j^T`` and the step needs
``r = A^T k_c``, ``u_c = beta (v - r)``, ``o = A^T q + (k_c . q) u_c`` (fp32; the current
token enters its own output unrounded, as in ``reference.py``).

Routes (``route``, constexpr):

* 0, state-and-output on every row: rebuild A tile by tile over K with a tensor-core dot
  of the cached keys and the decay-weighted u's (``input_precision="tf32x3"``; plain tf32
  drifts ~1e-2) plus the decayed checkpoint tile, and reduce it against k and q.
* 1, output-only on non-flush rows: ``A^T x = S0^T (exp(G_c) x) + sum_j (w_j k_j . x) u_j``
  without forming A; flush rows as route 0.
* 2 (default), output-only on non-flush rows; flush rows rebuild A with fp32 rank-1
  updates over the buffered entries (exact fp32, and far fewer registers than the dot,
  which sets the occupancy of every step; see the benchmark notes).

Flush rows (``cursor == L - 1``, decided per row on the device) write ``A + k_c u_c^T``
back as the new checkpoint, rounded once; other active rows append ``(u_c, k_c, g_c)`` at
ring slot ``cursor`` (k by one program per key head). Ring slots ``>= cursor`` are never
read. Rows with a negative cursor read and write nothing (``out`` untouched, or zeros in a
freshly allocated output); with ``eager=True`` (not the default) their current-token
inputs and checkpoint tile are still loaded, and ignored, so that those loads need not
wait for the cursor load.
The cursors are advanced by a second tiny launch after every program has read them. No
host-side decision depends on tensor values, so the launches can be captured in a CUDA
graph. The interpreter runs dots with ``"ieee"`` precision.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import triton_interpreter_on
from .reference import _check_shapes

__all__ = ["delta_replay_decode_triton", "advance_cursor_triton"]

#: 0 state-and-output on every row (tf32x3 dot); 1 output-only on non-flush rows, dot on
#: flush rows; 2 output-only on non-flush rows, fp32 rank-1 updates on flush rows.
DEFAULT_ROUTE = 2
#: load the current token and the checkpoint tile without waiting for the cursor (idle
#: rows then read them too). Off by default so that idle rows read nothing: on the H200 it
#: gained only 1-2% (batch 256, L=16).
DEFAULT_EAGER = False


@triton.jit
def _load_current(q_base, k_base, s_base, g_base, offs_k, offs_v, mv_in,
                  sq_k, sk_k, ss_k, ss_v, sg_k, k_lim_in, KDA: tl.constexpr):
    """The current token's q, k (and KDA g) and the checkpoint tile (BK, BV), in fp32.

    ``k_lim_in`` is K, or 0 to skip the loads (idle rows when not loading eagerly).
    """
    mk_in = offs_k < k_lim_in
    s0 = tl.load(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                 mask=mk_in[:, None] & mv_in[None, :], other=0.0).to(tl.float32)
    qv = tl.load(q_base + offs_k * sq_k, mask=mk_in, other=0.0).to(tl.float32)
    kv = tl.load(k_base + offs_k * sk_k, mask=mk_in, other=0.0).to(tl.float32)
    if KDA:
        gv = tl.load(g_base + offs_k * sg_k, mask=mk_in, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros_like(qv)
    return s0, kv, qv, gv


@triton.jit
def _load_ring_keys(kb_base, gb_base, offs_k, offs_l, ml, skb_l, skb_k, sgb_l, sgb_k, K, gv, gtot_s,
                    KDA: tl.constexpr):
    """Cached keys^T (BK, LP) of entries j < cursor, and G_c per key channel (BK,).

    For KDA the keys come back scaled by exp(G_c - G_j) per channel; for GDN the per-entry
    weights go on the u side and ``gt`` is the head's scalar G_c broadcast.
    """
    mk = offs_k < K
    kw = tl.load(kb_base + offs_k[:, None] * skb_k + offs_l[None, :] * skb_l,
                 mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)
    if KDA:
        gh = tl.load(gb_base + offs_k[:, None] * sgb_k + offs_l[None, :] * sgb_l,
                     mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP)
        gcum = tl.cumsum(gh, axis=1)
        gt = tl.sum(gh, axis=1) + gv  # G_c per key channel
        kw = kw * tl.exp(gt[:, None] - gcum)
    else:
        gt = tl.zeros_like(gv) + gtot_s
    return kw, gt, mk


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
    ROUTE: tl.constexpr, EAGER: tl.constexpr, WRITE_IDLE: tl.constexpr, DOT_PREC: tl.constexpr,
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
    # Scalar conditions become bounds (0 disables every lane) rather than being and-ed
    # with vector masks.
    k_lim_flush = tl.where(flush, K, 0)
    v_lim_append = tl.where(append, V, 0)
    lead = (i_v == 0) & (h % GROUP == 0)
    k_lim_kbuf = tl.where(lead, tl.where(append, K, 0), 0)  # one program per key head writes k
    k_lim_gbuf = tl.where(i_v == 0, tl.where(append, K, 0), 0)

    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < V
    mv_act = offs_v < tl.where(active, V, 0)
    if EAGER:
        # The current token and the checkpoint tile are loaded without waiting for the
        # cursor (an idle row's are read and ignored); ring loads always wait for it.
        mv_in = mv
        k_lim_in = K
    else:
        mv_in = mv_act
        k_lim_in = tl.where(active, K, 0)
    offs_l = tl.arange(0, LP)
    ml = offs_l < cc  # buffered entries j < c (never reads slots >= c; cc = 0 on idle rows)

    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    g_base = g_ptr + b * sg_b + h * sg_h
    s_base = s_ptr + b * ss_b + h * ss_h
    ub_base = ub_ptr + b * sub_b + h * sub_h
    kb_base = kb_ptr + b * skb_b + hk * skb_h
    gb_base = gb_ptr + b * sgb_b + h * sgb_h

    # 1. The current token and the checkpoint (with EAGER these loads do not wait for the
    #    cursor load), 2. the ring (entries j < cursor).
    if NK == 1:
        offs_k = tl.arange(0, BK)
        s0, kv, qv, gv = _load_current(q_base, k_base, s_base, g_base, offs_k, offs_v, mv_in,
                                       sq_k, sk_k, ss_k, ss_v, sg_k, k_lim_in, KDA)
    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv_in, other=0.0).to(tl.float32)
    if EAGER:
        beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h).to(tl.float32)
    else:
        beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h, mask=active, other=0.0).to(tl.float32)
    if KDA:
        gc = 0.0
    else:
        if EAGER:
            gc = tl.load(g_base).to(tl.float32)
        else:
            gc = tl.load(g_base, mask=active, other=0.0).to(tl.float32)

    ub = tl.load(ub_base + offs_l[:, None] * sub_l + offs_v[None, :] * sub_v,
                 mask=ml[:, None] & mv[None, :], other=0.0).to(tl.float32)  # (LP, BV)
    if KDA:
        rhs = ub
        gtot = 0.0
    else:
        gh = tl.load(gb_base + offs_l * sgb_l, mask=ml, other=0.0).to(tl.float32)  # (LP,)
        gcum = tl.cumsum(gh, axis=0)
        gtot = tl.sum(gh, axis=0) + gc
        w = tl.where(ml, tl.exp(gtot - gcum), 0.0)
        rhs = ub * w[:, None]  # decay-weighted u's

    if NK == 1:
        kw, gt, mk = _load_ring_keys(kb_base, gb_base, offs_k, offs_l, ml, skb_l, skb_k, sgb_l, sgb_k, K, gv, gtot,
                                     KDA)
        dvec = tl.exp(gt)
        kq = tl.sum(kv * qv, axis=0)
        s_ptrs = s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
        s_mask_flush = (offs_k < k_lim_flush)[:, None] & mv[None, :]
        if ROUTE == 0:
            acc = s0 * dvec[:, None] + tl.dot(kw, rhs, input_precision=DOT_PREC)  # A tile (BK, BV)
            r = tl.sum(acc * kv[:, None], axis=0)
            hq = tl.sum(acc * qv[:, None], axis=0)
            u = beta * (vv - r)
            o = hq + kq * u
            tl.store(s_ptrs, (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty), mask=s_mask_flush)
        else:
            if flush:
                if ROUTE == 1:
                    acc = s0 * dvec[:, None] + tl.dot(kw, rhs, input_precision=DOT_PREC)
                else:
                    # fp32 rank-1 updates over the L-1 buffered entries (exact fp32, no
                    # tensor-core operand staging; flush rows are 1/L of the work). The
                    # ring entries are re-read one by one (L1/L2 hits: this program just
                    # loaded them as tiles), which keeps register use, and so occupancy on
                    # every other step, low.
                    acc = s0 * dvec[:, None]
                    gcum_j = tl.zeros([BK], dtype=tl.float32)
                    for j in range(0, L - 1):
                        kj = tl.load(kb_base + j * skb_l + offs_k * skb_k, mask=mk, other=0.0).to(tl.float32)
                        uj = tl.load(ub_base + j * sub_l + offs_v * sub_v, mask=mv, other=0.0).to(tl.float32)
                        if KDA:
                            gj = tl.load(gb_base + j * sgb_l + offs_k * sgb_k, mask=mk, other=0.0).to(tl.float32)
                        else:
                            gj = tl.load(gb_base + j * sgb_l).to(tl.float32)
                        gcum_j += gj
                        acc += (kj * tl.exp(gt - gcum_j))[:, None] * uj[None, :]
                r = tl.sum(acc * kv[:, None], axis=0)
                hq = tl.sum(acc * qv[:, None], axis=0)
                u = beta * (vv - r)
                o = hq + kq * u
                tl.store(s_ptrs, (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty), mask=s_mask_flush)
            else:
                # Output only: S0^T (exp(G_c) x) plus the ring's inner products.
                ak = tl.sum(kw * kv[:, None], axis=0)  # (LP,) weighted k_j . k_c
                aq = tl.sum(kw * qv[:, None], axis=0)
                r = tl.sum(s0 * (dvec * kv)[:, None], axis=0) + tl.sum(ak[:, None] * rhs, axis=0)
                hq = tl.sum(s0 * (dvec * qv)[:, None], axis=0) + tl.sum(aq[:, None] * rhs, axis=0)
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
            s0, kv, qv, gv = _load_current(q_base, k_base, s_base, g_base, offs_k, offs_v, mv_in,
                                           sq_k, sk_k, ss_k, ss_v, sg_k, k_lim_in, KDA)
            kw, gt, mk = _load_ring_keys(kb_base, gb_base, offs_k, offs_l, ml, skb_l, skb_k, sgb_l, sgb_k, K, gv,
                                         gtot, KDA)
            acc = s0 * tl.exp(gt)[:, None] + tl.dot(kw, rhs, input_precision=DOT_PREC)
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
                s0, kv, qv, gv = _load_current(q_base, k_base, s_base, g_base, offs_k, offs_v, mv_in,
                                               sq_k, sk_k, ss_k, ss_v, sg_k, k_lim_in, KDA)
                kw, gt, mk = _load_ring_keys(kb_base, gb_base, offs_k, offs_l, ml, skb_l, skb_k, sgb_l, sgb_k, K,
                                             gv, gtot, KDA)
                acc = s0 * tl.exp(gt)[:, None] + tl.dot(kw, rhs, input_precision=DOT_PREC)
                tl.store(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                         (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty),
                         mask=(offs_k < k_lim_flush)[:, None] & mv[None, :])

    tl.store(ub_base + cc * sub_l + offs_v * sub_v, u.to(ub_ptr.dtype.element_ty), mask=offs_v < v_lim_append)
    if not KDA:
        tl.store(gb_base + cc * sgb_l, gc.to(gb_ptr.dtype.element_ty), mask=k_lim_gbuf > 0)
    if WRITE_IDLE:
        o = tl.where(active, o, 0.0)
        o_mask = mv
    else:
        o_mask = mv_act
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
    """(block_v, num_warps) per shape, from the launch sweep of examples/benchmarks/bench_delta.py
    on an H200 (2026-11-30, batch 256, L=16; see examples/benchmarks/results/delta_h200_2026-11-30.md):
    32 value columns and 4 warps, except 64 columns for Gated DeltaNet with a 16-bit
    checkpoint (262 vs 315 µs)."""
    bk = triton.next_power_of_2(K)
    if bk >= 256:
        return 16, 8
    if not kda and state_dtype in (torch.bfloat16, torch.float16) and bk <= 128:
        return 64, 4
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
    route: int | None = None,
    eager: bool | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Triton version of ``delta_replay_decode_reference`` (same arguments and result).

    Keyword-only extras: ``write_idle`` (store zeros for idle rows; defaults to
    ``out is None``), and tuning knobs ``route`` (0 state-and-output with a tf32x3 dot on
    every row; 1 output-only on non-flush rows, dot on flush rows; 2, the default,
    output-only on non-flush rows and fp32 rank-1 updates on flush rows), ``eager``
    (load the current token and checkpoint before the cursor is known; idle rows then read
    them too), ``block_v``, ``block_k`` (K tile; default the whole key dim up to 256; more
    than one tile forces route 0), ``num_warps``.
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
    if route is None:
        route = DEFAULT_ROUTE
    if eager is None:
        eager = DEFAULT_EAGER
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
        KDA=kda, BK=BK, NK=NK, BV=BV, LP=LP, ROUTE=int(route), EAGER=bool(eager), WRITE_IDLE=bool(write_idle),
        DOT_PREC="ieee" if triton_interpreter_on() else "tf32x3",
        num_warps=num_warps or nw_def,
    )
    advance_cursor_triton(cursor, L)
    return out
