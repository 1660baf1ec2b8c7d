"""One-launch Triton program of the delta-rule ReplaySSM decode step, for small batches (where the
multi-launch step of ``programs.py`` is bound by launch latency). Host side: ``launch.py``.

One program per (row b, value head h, block of BV value columns) holds the whole key dim
(K <= 256). With ``c = cursor[b]``: non-flush rows compute ``A^T x = S0^T (exp(G_c) x) +
sum_j (w_j k_j . x) u_j`` for x in (k_c, q) without forming A, then ``u_c``, ``o`` and the
appends; flush rows (``c == L - 1``) rebuild ``A`` with fp32 rank-1 updates over the L - 1
buffered entries, read r and o from it and store ``A + k_c u_c^T``. Ring slots ``>= c`` are
never read; idle rows read and write nothing (zeros into a fresh output). The cursors move on
inside the launch: every program arrives at its row's cursor word (``kernels/cursor.py``) and
the row's last program stores the next cursor.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..cursor import advanced_cursor, arrive_on_cursor, count_arrival, cursor_of_word
from ..quant_triton import codes_to_f32
from .gates import previous_gate_sum
from .tiles import column_scale, head_block, store_state_tile


@triton.jit
def _decayed_ring(kb_base, ub_base, gb_base, offs_k, mk, offs_v, mv, offs_l, ml, cc, gv, gc, lay, KDA: tl.constexpr):
    """The ring's entries ``j < c`` with their decays: (keys^T (BK, LP), u's (LP, BV), ``G_c`` (BK,)); KDA
    weights the keys by ``exp(G_c - G_j)`` per channel, Gated DeltaNet the u's by its scalar decays."""
    ub = tl.load(ub_base + offs_l[:, None] * lay.u_l + offs_v[None, :] * lay.u_v,
                 mask=ml[:, None] & mv[None, :], other=0.0).to(tl.float32)  # (LP, BV)
    kw = tl.load(kb_base + offs_k[:, None] * lay.kb_k + offs_l[None, :] * lay.kb_l,
                 mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP) keys^T
    if KDA:  # the gate ring holds the running sums G_j
        rhs = ub
        gcum = tl.load(gb_base + offs_k[:, None] * lay.gb_k + offs_l[None, :] * lay.gb_l,
                       mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP)
        gt = previous_gate_sum(gb_base, lay.gb_l, lay.gb_k, offs_k, mk, cc) + gv  # G_c per key channel
        kw = kw * tl.exp(gt[:, None] - gcum)
    else:
        gh = tl.load(gb_base + offs_l * lay.gb_l, mask=ml, other=0.0).to(tl.float32)  # (LP,)
        gcum = tl.cumsum(gh, axis=0)
        gtot = tl.sum(gh, axis=0) + gc
        w = tl.where(ml, tl.exp(gtot - gcum), 0.0)
        rhs = ub * w[:, None]  # decay-weighted u's
        gt = tl.zeros_like(gv) + gtot
    return kw, rhs, gt


@triton.jit
def _rebuilt_history(acc, gt, kb_base, ub_base, gb_base, offs_k, mk, offs_v, mv, lay, KDA: tl.constexpr,
                     BK: tl.constexpr):
    """A flush row's history ``A`` (BK, BV): ``acc`` (the decayed checkpoint tile) plus fp32 rank-1
    updates over the L - 1 buffered entries, re-read one by one (few registers: this branch sets
    the occupancy of every step)."""
    gcum_j = tl.zeros([BK], dtype=tl.float32)
    for j in range(0, lay.L - 1):
        kj = tl.load(kb_base + j * lay.kb_l + offs_k * lay.kb_k, mask=mk, other=0.0).to(tl.float32)
        uj = tl.load(ub_base + j * lay.u_l + offs_v * lay.u_v, mask=mv, other=0.0).to(tl.float32)
        if KDA:  # G_j itself
            gcum_j = tl.load(gb_base + j * lay.gb_l + offs_k * lay.gb_k, mask=mk, other=0.0).to(tl.float32)
        else:
            gcum_j += tl.load(gb_base + j * lay.gb_l).to(tl.float32)
        acc += (kj * tl.exp(gt - gcum_j))[:, None] * uj[None, :]
    return acc


@triton.jit
def _append_entry(cc, kv, gt, gc, u, kb_base, gb_base, ub_base, offs_k, offs_v, k_lim_kbuf, k_lim_gbuf, v_lim_append,
                  t, lay, KDA: tl.constexpr):
    """Append ``(u_c, k_c, g_c)`` at slot ``cc`` (KDA: the running sum ``G_c``) where the bounds allow."""
    tl.store(kb_base + cc * lay.kb_l + offs_k * lay.kb_k, kv.to(t.k_buf.dtype.element_ty), mask=offs_k < k_lim_kbuf)
    if KDA:  # G_c
        tl.store(gb_base + cc * lay.gb_l + offs_k * lay.gb_k, gt.to(t.g_buf.dtype.element_ty),
                 mask=offs_k < k_lim_gbuf)
    else:
        tl.store(gb_base + cc * lay.gb_l, gc.to(t.g_buf.dtype.element_ty), mask=k_lim_gbuf > 0)
    tl.store(ub_base + cc * lay.u_l + offs_v * lay.u_v, u.to(t.u_buf.dtype.element_ty), mask=offs_v < v_lim_append)


@triton.jit
def small_batch_kernel(t, io, lay, NV, KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr,
                       WRITE_IDLE: tl.constexpr, ARRIVE: tl.constexpr, FMT: tl.constexpr = 0, SR: tl.constexpr = False):
    """ARRIVE 1: the arrival's atomic reads the cursor (one trip, before anything else); 2: a load
    reads it and the arrival follows once the ring loads that depend on it are issued (after a
    CTA barrier, so every thread's read has returned); 0: no arrival (a second launch advances)."""
    i_v, i_bh, b, h, hk = head_block(NV, lay)

    if ARRIVE == 1:
        c, arrived = arrive_on_cursor(t.cursor + b * io.cur, "relaxed")
    elif ARRIVE == 2:
        c = cursor_of_word(tl.load(t.cursor + b * io.cur))
    else:
        c = tl.load(t.cursor + b * io.cur)
    active = c >= 0
    cc = tl.maximum(c, 0)
    flush = c == lay.L - 1
    append = active & (c != lay.L - 1)
    # scalar conditions become bounds (0 disables every lane) rather than being and-ed
    # with vector masks
    k_lim_in = tl.where(active, lay.K, 0)
    k_lim_flush = tl.where(flush, lay.K, 0)
    v_lim_append = tl.where(append, lay.V, 0)
    lead = (i_v == 0) & (h % lay.GROUP == 0)
    k_lim_kbuf = tl.where(lead, tl.where(append, lay.K, 0), 0)  # one program per key head writes k
    k_lim_gbuf = tl.where(i_v == 0, tl.where(append, lay.K, 0), 0)

    offs_k = tl.arange(0, BK)
    mk = offs_k < lay.K
    mk_in = offs_k < k_lim_in
    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < lay.V
    mv_act = offs_v < tl.where(active, lay.V, 0)
    offs_l = tl.arange(0, LP)
    ml = offs_l < cc  # buffered entries j < c (cc = 0 on idle rows)

    q_base = t.q + b * io.q_b + hk * io.q_h
    k_base = t.k + b * io.k_b + hk * io.k_h
    g_base = t.g + b * io.g_b + h * io.g_h
    s_base = t.state + b * lay.s_b + h * lay.s_h
    ub_base = t.u_buf + b * lay.u_b + h * lay.u_h
    kb_base = t.k_buf + b * lay.kb_b + hk * lay.kb_h
    gb_base = t.g_buf + b * lay.gb_b + h * lay.gb_h
    s_ptrs = s_base + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v

    # the current token and the checkpoint tile (predicated on the cursor), then the ring (j < c)
    s0 = codes_to_f32(tl.load(s_ptrs, mask=mk_in[:, None] & mv_act[None, :], other=0.0), FMT)
    if FMT >= 3:  # int8 / fp8: one scale per value column
        s0 = s0 * column_scale(b, h, offs_v, mv_act, t, io, FMT)[None, :]
    qv = tl.load(q_base + offs_k * io.q_k, mask=mk_in, other=0.0).to(tl.float32)
    kv = tl.load(k_base + offs_k * io.k_k, mask=mk_in, other=0.0).to(tl.float32)
    if KDA:
        gv = tl.load(g_base + offs_k * io.g_k, mask=mk_in, other=0.0).to(tl.float32)
        gc = 0.0
    else:
        gv = tl.zeros_like(qv)
        gc = tl.load(g_base, mask=active, other=0.0).to(tl.float32)
    vv = tl.load(t.v + b * io.v_b + h * io.v_h + offs_v * io.v_v, mask=mv_act, other=0.0).to(tl.float32)
    beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h, mask=active, other=0.0).to(tl.float32)

    kw, rhs, gt = _decayed_ring(kb_base, ub_base, gb_base, offs_k, mk, offs_v, mv, offs_l, ml, cc, gv, gc, lay, KDA)
    dvec = tl.exp(gt)
    kq = tl.sum(kv * qv, axis=0)
    if ARRIVE == 2:
        # the ring loads above are predicated on c, so every thread's read has returned by the barrier
        tl.debug_barrier()
        arrived = count_arrival(t.cursor + b * io.cur, c, "relaxed")

    if flush:
        acc = _rebuilt_history(s0 * dvec[:, None], gt, kb_base, ub_base, gb_base, offs_k, mk, offs_v, mv, lay, KDA,
                               BK)
        r = tl.sum(acc * kv[:, None], axis=0)
        hq = tl.sum(acc * qv[:, None], axis=0)
        u = beta * (vv - r)
        o = hq + kq * u
        store_state_tile(s_ptrs, acc + kv[:, None] * u[None, :], offs_k < k_lim_flush, mv, b, h, offs_k, offs_v, t,
                         io, lay, FMT, SR)
    else:
        ak = tl.sum(kw * kv[:, None], axis=0)  # (LP,) weighted k_j . k_c
        aq = tl.sum(kw * qv[:, None], axis=0)
        r = tl.sum(s0 * (dvec * kv)[:, None], axis=0) + tl.sum(ak[:, None] * rhs, axis=0)
        hq = tl.sum(s0 * (dvec * qv)[:, None], axis=0) + tl.sum(aq[:, None] * rhs, axis=0)
        u = beta * (vv - r)
        o = hq + kq * u
    _append_entry(cc, kv, gt, gc, u, kb_base, gb_base, ub_base, offs_k, offs_v, k_lim_kbuf, k_lim_gbuf, v_lim_append,
                  t, lay, KDA)
    if WRITE_IDLE:
        o = tl.where(active, o, 0.0)
        o_mask = mv
    else:
        o_mask = mv_act
    tl.store(t.out + b * io.out_b + h * io.out_h + offs_v * io.out_v, o.to(t.out.dtype.element_ty), mask=o_mask)
    if ARRIVE != 0:  # the row's last arrival advances its cursor (and clears the count)
        if arrived == lay.HV * NV - 1:
            tl.store(t.cursor + b * io.cur, advanced_cursor(c, lay.L))
