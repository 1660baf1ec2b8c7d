"""Triton program of the delta-rule verify step (speculative decoding): T window tokens per row
from one read of the checkpoint. Semantics: ``verify.delta_replay_verify_reference``; host side:
``verify_launch.py``.

One program per (row b, value head h, block of BV value columns) holds the whole key dim
(K <= 256). With ``c = cursor[b]`` it reads ``cc = max(c, 0)`` ring entries, their last running
decay ``G_base = G_{cc-1}``, and forms the state after them in fp32 with one matrix product:

    S = exp(G_base) S0 + sum_{j<cc} (exp(G_base - G_j) k_j) u_j^T        (every factor <= 1)

A flush-first row (``c + T > L``) stores S as its new checkpoint, rounded once, and runs its
window from the rounded S at slot 0; any other row runs it from S at slot c (S is the state
``A`` of the output-only route, never written). The window's T tokens then follow, as T single
steps would run,

    S <- exp(g_t) S ;  r = S^T k_t ;  u_t = beta_t (v_t - r) ;
    o_t = S^T q_t + (k_t . q_t) u_t ;  S <- S + k~_t u~_t^T

with ``k~_t``, ``u~_t`` the ring copies (rounded to the ring dtypes), which is what later tokens
read in the reference; a token never reads a later one, so rejected (even non-finite) tokens
cannot reach an earlier output. The checkpoint tile is read once for all T outputs.

Appends: ``u_t`` by each program for its columns; the keys and gates of a non-flush row by one
program per key head / value head (slots past the history: nobody reads them); those of a flush
row overwrite slots that every program of the row reads for its fold, so the row's last program
to arrive at the cursor word (``kernels/cursor.py``) writes them, and the cursor (``ARRIVE``);
without arrivals a second launch does (``commit_kernel``).

An int8 / fp8 checkpoint (FMT >= 3) is read through its column scales, and a flush-first row
stores its codes and scales (``tiles.round_state_tile``; SR: stochastically, under the row's
counter, which the launch advances first).
"""

from __future__ import annotations

from collections import namedtuple

import triton
import triton.language as tl

from ..cursor import count_arrival, cursor_of_word
from ..quant_triton import codes_to_f32
from ..split_dot import dot_f32
from .gates import previous_gate_sum
from .tiles import column_scale, head_block, round_state_tile

#: strides of the window inputs (Bt, T, heads, dim), the output, the cursor, the checkpoint's scales
#: and the rows' random-number state (runtime arguments)
VerifyStrides = namedtuple("VerifyStrides", "q_b q_t q_h q_k k_b k_t k_h k_k v_b v_t v_h v_v g_b g_t g_h g_k "
                                            "beta_b beta_t beta_h out_b out_t out_h out_v cur sc_b sc_h sc_v rng_b")


@triton.jit
def _window_tile(base, s_t, s_k, offs_t, mt, offs_k, mk):
    """fp32 (TP, BK) tile of a window input: token rows ``offs_t``, channels ``offs_k``."""
    return tl.load(base + offs_t[:, None] * s_t + offs_k[None, :] * s_k, mask=mt[:, None] & mk[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def window_gate_sums(b, h, T, offs_t, offs_k, mk, t, io, KDA: tl.constexpr):
    """The window's running log-decays from its first token: (TP, BK) (KDA, channels ``offs_k``)
    or (TP,) (GDN) fp32; rows past T repeat the last."""
    mt = offs_t < T
    g_base = t.g + b * io.g_b + h * io.g_h
    if KDA:
        gw = _window_tile(g_base, io.g_t, io.g_k, offs_t, mt, offs_k, mk)
    else:
        gw = tl.load(g_base + offs_t * io.g_t, mask=mt, other=0.0).to(tl.float32)
    return tl.cumsum(gw, axis=0)


@triton.jit
def append_window_entries(b, h, slot0, keys, T, offs_t, offs_k, mk, t, io, lay, KDA: tl.constexpr):
    """Store the window's gates of value head h at slots ``slot0 ..`` (KDA: running sums on from
    slot ``slot0 - 1``'s) and, if ``keys``, the keys of key head h // GROUP (rounded to the ring
    dtype)."""
    mt = offs_t < T
    slots = slot0 + offs_t
    gb = t.g_buf + b * lay.gb_b + h * lay.gb_h
    if KDA:
        gs = window_gate_sums(b, h, T, offs_t, offs_k, mk, t, io, KDA)
        gs += previous_gate_sum(gb, lay.gb_l, lay.gb_k, offs_k, mk, slot0)[None, :]
        tl.store(gb + slots[:, None] * lay.gb_l + offs_k[None, :] * lay.gb_k, gs.to(t.g_buf.dtype.element_ty),
                 mask=mt[:, None] & mk[None, :])
    else:
        gv = tl.load(t.g + b * io.g_b + h * io.g_h + offs_t * io.g_t, mask=mt)
        tl.store(gb + slots * lay.gb_l, gv.to(t.g_buf.dtype.element_ty), mask=mt)
    if keys:
        hk = h // lay.GROUP
        kv = tl.load(t.k + b * io.k_b + hk * io.k_h + offs_t[:, None] * io.k_t + offs_k[None, :] * io.k_k,
                     mask=mt[:, None] & mk[None, :])
        tl.store(t.k_buf + b * lay.kb_b + hk * lay.kb_h + slots[:, None] * lay.kb_l + offs_k[None, :] * lay.kb_k,
                 kv.to(t.k_buf.dtype.element_ty), mask=mt[:, None] & mk[None, :])


@triton.jit
def append_flush_row(b, T, t, io, lay, KDA: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr, HC: tl.constexpr,
                     HP: tl.constexpr):
    """A flush-first row's window keys and gates, every head, at slots 0 .. T-1 (its ring restarts):
    tiles of HC heads x TP tokens x BK channels (GDN's gates: one (HP, TP) tile, HP >= HV)."""
    offs_h = tl.arange(0, HC)[:, None, None]
    offs_t = tl.arange(0, TP)[None, :, None]
    offs_k = tl.arange(0, BK)[None, None, :]
    m_tk = (offs_t < T) & (offs_k < lay.K)
    for h0 in tl.static_range(0, lay.HV // lay.GROUP, HC):  # key heads
        hk = h0 + offs_h
        m = m_tk & (hk < lay.HV // lay.GROUP)
        kv = tl.load(t.k + b * io.k_b + hk * io.k_h + offs_t * io.k_t + offs_k * io.k_k, mask=m)
        tl.store(t.k_buf + b * lay.kb_b + hk * lay.kb_h + offs_t * lay.kb_l + offs_k * lay.kb_k,
                 kv.to(t.k_buf.dtype.element_ty), mask=m)
    if KDA:  # running sums from the window's first token
        for h0 in tl.static_range(0, lay.HV, HC):
            h = h0 + offs_h
            m = m_tk & (h < lay.HV)
            gw = tl.load(t.g + b * io.g_b + h * io.g_h + offs_t * io.g_t + offs_k * io.g_k, mask=m, other=0.0)
            tl.store(t.g_buf + b * lay.gb_b + h * lay.gb_h + offs_t * lay.gb_l + offs_k * lay.gb_k,
                     tl.cumsum(gw.to(tl.float32), axis=1).to(t.g_buf.dtype.element_ty), mask=m)
    else:
        h = tl.arange(0, HP)[:, None]
        tt = tl.arange(0, TP)[None, :]
        m = (h < lay.HV) & (tt < T)
        gw = tl.load(t.g + b * io.g_b + h * io.g_h + tt * io.g_t, mask=m)
        tl.store(t.g_buf + b * lay.gb_b + h * lay.gb_h + tt * lay.gb_l, gw.to(t.g_buf.dtype.element_ty), mask=m)


@triton.jit
def _ring_state(s_ptrs, s_mask, colsc, kb_base, gb_base, ub_base, offs_k, mk, offs_v, mv, offs_l, ml, cc, lay,
                KDA: tl.constexpr, DOT_PREC: tl.constexpr, FMT: tl.constexpr):
    """fp32 (BK, BV): the checkpoint tile (int8 / fp8 codes times their column scales ``colsc``)
    advanced over the ring's entries ``j < cc`` (module notes)."""
    S0 = codes_to_f32(tl.load(s_ptrs, mask=s_mask, other=0.0), FMT)
    if FMT >= 3:
        S0 = S0 * colsc[None, :]
    Kr = tl.load(kb_base + offs_k[:, None] * lay.kb_k + offs_l[None, :] * lay.kb_l, mask=mk[:, None] & ml[None, :],
                 other=0.0).to(tl.float32)  # (BK, LP) keys^T
    Ur = tl.load(ub_base + offs_l[:, None] * lay.u_l + offs_v[None, :] * lay.u_v, mask=ml[:, None] & mv[None, :],
                 other=0.0)  # (LP, BV), ring dtype
    if KDA:  # the gate ring holds the running sums G_j
        Gr = tl.load(gb_base + offs_k[:, None] * lay.gb_k + offs_l[None, :] * lay.gb_l,
                     mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)
        g_last = previous_gate_sum(gb_base, lay.gb_l, lay.gb_k, offs_k, mk, cc)  # G_base (BK,)
        KF = tl.where(ml[None, :], Kr * tl.exp(g_last[:, None] - Gr), 0.0)
        S0 = S0 * tl.exp(g_last)[:, None]
    else:
        gr = tl.load(gb_base + offs_l * lay.gb_l, mask=ml, other=0.0).to(tl.float32)
        g_sum = tl.sum(gr, axis=0)
        KF = Kr * tl.where(ml, tl.exp(g_sum - tl.cumsum(gr, axis=0)), 0.0)[None, :]
        S0 = S0 * tl.exp(g_sum)
    return S0 + dot_f32(KF, Ur, False, DOT_PREC)


@triton.jit
def _window_loop(S, b, h, hk, c0, T, offs_k, mk_in, offs_v, mv_in, o_cols, active, ub_base, t, io, lay,
                 KDA: tl.constexpr):
    """The T window outputs and ring ``u`` from the state tile S (BK, BV) fp32, advanced token by
    token (module notes)."""
    k_base = t.k + b * io.k_b + hk * io.k_h
    q_base = t.q + b * io.q_b + hk * io.q_h
    g_base = t.g + b * io.g_b + h * io.g_h
    o_base = t.out + b * io.out_b + h * io.out_h + offs_v * io.out_v
    for i in range(T):
        kv = tl.load(k_base + i * io.k_t + offs_k * io.k_k, mask=mk_in, other=0.0).to(tl.float32)
        qv = tl.load(q_base + i * io.q_t + offs_k * io.q_k, mask=mk_in, other=0.0).to(tl.float32)
        vv = tl.load(t.v + b * io.v_b + h * io.v_h + i * io.v_t + offs_v * io.v_v, mask=mv_in, other=0.0)
        beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h + i * io.beta_t, mask=active, other=0.0)
        if KDA:
            S *= tl.exp(tl.load(g_base + i * io.g_t + offs_k * io.g_k, mask=mk_in, other=0.0).to(tl.float32))[:, None]
        else:
            S *= tl.exp(tl.load(g_base + i * io.g_t, mask=active, other=0.0).to(tl.float32))
        u = beta.to(tl.float32) * (vv.to(tl.float32) - tl.sum(S * kv[:, None], axis=0))
        o = tl.sum(S * qv[:, None], axis=0) + tl.sum(kv * qv, axis=0) * u
        u_ring = u.to(t.u_buf.dtype.element_ty)
        tl.store(o_base + i * io.out_t, tl.where(active, o, 0.0).to(t.out.dtype.element_ty), mask=o_cols)
        tl.store(ub_base + (c0 + i) * lay.u_l + offs_v * lay.u_v, u_ring, mask=mv_in)
        S += kv.to(t.k_buf.dtype.element_ty).to(tl.float32)[:, None] * u_ring.to(tl.float32)[None, :]


@triton.jit
def verify_kernel(t, io, lay, NV, T, KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  LP: tl.constexpr, TP: tl.constexpr, HC: tl.constexpr, HP: tl.constexpr, WRITE_IDLE: tl.constexpr,
                  ARRIVE: tl.constexpr, DOT_PREC: tl.constexpr, FMT: tl.constexpr, SR: tl.constexpr):
    """One verify step (module notes) of T tokens, NV column blocks per value head; TP >= T, HC, HP:
    the appends' tiles (``append_flush_row``). ARRIVE: every program arrives at its row's cursor word once the
    ring's keys and gates are read; the last one stores the next cursor and, at its end, a flush
    row's keys and gates. Otherwise ``commit_kernel`` does both."""
    i_v, i_bh, b, h, hk = head_block(NV, lay)
    cur_ptr = t.cursor + b * io.cur
    c = tl.load(cur_ptr)
    if ARRIVE:
        c = cursor_of_word(c)
    active = c >= 0
    flush = active & (c + T > lay.L)
    cc = tl.maximum(c, 0)  # ring entries read: folded (flush rows) or the window's history
    c0 = tl.where(flush, 0, cc)  # the window's first slot

    offs_k = tl.arange(0, BK)
    mk = offs_k < lay.K
    mk_in = offs_k < tl.where(active, lay.K, 0)  # idle rows read nothing
    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < lay.V
    mv_in = offs_v < tl.where(active, lay.V, 0)
    offs_l = tl.arange(0, LP)
    offs_t = tl.arange(0, TP)
    s_ptrs = t.state + b * lay.s_b + h * lay.s_h + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v
    ub_base = t.u_buf + b * lay.u_b + h * lay.u_h

    S = _ring_state(s_ptrs, mk_in[:, None] & mv_in[None, :], column_scale(b, h, offs_v, mv_in, t, io, FMT),
                    t.k_buf + b * lay.kb_b + hk * lay.kb_h, t.g_buf + b * lay.gb_b + h * lay.gb_h, ub_base, offs_k,
                    mk_in, offs_v, mv_in, offs_l, offs_l < cc, cc, lay, KDA, DOT_PREC, FMT)
    # a flush row's checkpoint, rounded once (its scales too), and the window runs from what it stored
    if (FMT >= 3) | SR:
        mv_flush = offs_v < tl.where(flush, lay.V, 0)
        q, d = round_state_tile(S, mk[:, None] & mv[None, :], b, h, offs_k, offs_v, t, io, lay, FMT, SR)
        S_new = q.to(t.state.dtype.element_ty)
        tl.store(s_ptrs, S_new, mask=mk[:, None] & mv_flush[None, :])
        S_stored = codes_to_f32(S_new, FMT)
        if FMT >= 3:
            tl.store(t.scale + b * io.sc_b + h * io.sc_h + offs_v * io.sc_v, d, mask=mv_flush)
            S_stored = S_stored * d[None, :]
        S = tl.where(flush, S_stored, S)
    else:
        S_new = S.to(t.state.dtype.element_ty)
        tl.store(s_ptrs, S_new, mask=mk[:, None] & (offs_v < tl.where(flush, lay.V, 0))[None, :])
        S = tl.where(flush, S_new.to(tl.float32), S)

    if active & (c + T <= lay.L) & (i_v == 0):  # keys and gates past the history: nobody reads those slots
        append_window_entries(b, h, c0, h % lay.GROUP == 0, T, offs_t, offs_k, mk, t, io, lay, KDA)
    last = False
    if ARRIVE:
        tl.debug_barrier()  # every thread's reads of the cursor and the ring have returned
        if flush:  # release the ring reads; the last arrival acquires them all before its appends
            arrived = count_arrival(cur_ptr, c, "acq_rel")
        else:
            arrived = count_arrival(cur_ptr, c, "relaxed")
        last = arrived == lay.HV * NV - 1
        if last:
            tl.store(cur_ptr, tl.where(active, c0 + T, c))

    o_cols = mv if WRITE_IDLE else mv_in
    tl.debug_barrier()  # (flush rows) the fold's u reads are done before the window's u stores
    _window_loop(S, b, h, hk, c0, T, offs_k, mk_in, offs_v, mv_in, o_cols, active, ub_base, t, io, lay, KDA)

    if last & flush:  # every program of the row has read the slots these overwrite
        append_flush_row(b, T, t, io, lay, KDA, BK, TP, HC, HP)


@triton.jit
def commit_kernel(t, io, lay, T, KDA: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr, HC: tl.constexpr,
                  HP: tl.constexpr):
    """After a verify launch without arrivals, one program per row: a flush-first row's window keys
    and gates, and every row's next cursor (``c + T``, or ``T`` after a flush; idle rows keep theirs)."""
    b = tl.program_id(0).to(tl.int64)
    cur_ptr = t.cursor + b * io.cur
    c = tl.load(cur_ptr)
    if c + T > lay.L:
        append_flush_row(b, T, t, io, lay, KDA, BK, TP, HC, HP)
        tl.store(cur_ptr, T)
    elif c >= 0:
        tl.store(cur_ptr, c + T)
