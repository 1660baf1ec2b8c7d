"""Triton programs of the delta-rule verify step (speculative decoding): T window tokens per row
from one read of the checkpoint. Semantics: ``verify.delta_replay_verify_reference``; host side:
``verify_launch.py``.

One program per (row b, value head h, group of NB column blocks of BV value columns) holds the
whole key dim (K <= 256). With ``c = cursor[b]``, ``cc = max(c, 0)`` ring entries are read (the
same slots serve both routes), their last running decay ``G_base = G_{cc-1}`` and, per entry,
``F_j = exp(G_base - G_j) <= 1``:

* a flush-first row (``c + T > L``) folds them, ``S0 <- exp(G_base) S0 + sum_j (F_j k_j) u_j^T``
  rounded once to the checkpoint dtype (the window then reads the rounded checkpoint and starts
  at slot 0 with no history);
* otherwise the window starts at slot ``c`` and token t (decay ``E_t = exp(Gw_t)`` over the
  window's own gates, so ``exp(G_p - G_j) = E_t F_j`` with both factors <= 1) reads the history
  through ``A_t^T x = S0^T (exp(G_base) E_t x) + sum_j ((E_t x) . (F_j k_j)) u_j``.

Per column block the checkpoint tile is read once: its products with the T decayed keys and
queries and the history's are matrix products; the window's own coupling (the delta rule's
correction, a T x T strictly lower-triangular system) is forward substitution over the tokens:

    u_t = beta_t (v_t - R0_t - sum_{s<t} WK[t, s] u~_s) ;
    o_t = Q0_t + sum_{s<t} WQ[t, s] u~_s + (k_t . q_t) u_t

with ``WK[t, s] = k~_s . (exp(G_t - G_s) k_t)`` (``WQ`` with q_t) and ``u~``, ``k~`` the ring
copies (rounded to the ring dtypes), as a sequence of single steps would read them. KDA's
``exp(G_t - G_s)`` is per key channel and is taken pair by pair (no factorisation that could
overflow on fast-decaying channels). A window token never reads a later token's values, so
rejected (even non-finite) later tokens cannot reach an earlier output.

Appends: ``u_t`` by each program for its columns (after a CTA barrier on flush rows, whose fold
read the same slots); the keys and gates of a non-flush row by one program per key head / value
head (slots past the history: nobody reads them); those of a flush row overwrite slots that every
program of the row reads for its fold, so the row's last program to arrive at the cursor word
(``kernels/cursor.py``) writes them, and the cursor (``ARRIVE``); without arrivals a second
launch does (``commit_kernel``).
"""

from __future__ import annotations

from collections import namedtuple

import triton
import triton.language as tl

from ..cursor import count_arrival, cursor_of_word
from .gates import previous_gate_sum
from .programs import head_block

#: strides of the window inputs (Bt, T, heads, dim), the output and the cursor (runtime arguments)
VerifyStrides = namedtuple("VerifyStrides", "q_b q_t q_h q_k k_b k_t k_h k_k v_b v_t v_h v_v g_b g_t g_h g_k "
                                            "beta_b beta_t beta_h out_b out_t out_h out_v cur")


@triton.jit
def _window_tile(base, s_t, s_k, offs_t, mt, offs_k, mk):
    """fp32 (TP, BK) tile of a window input: token rows ``offs_t``, channels ``offs_k``."""
    return tl.load(base + offs_t[:, None] * s_t + offs_k[None, :] * s_k, mask=mt[:, None] & mk[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def window_gate_sums(b, h, T, offs_t, offs_k, mk, t, io, KDA: tl.constexpr):
    """The window's running log-decays from its first token: (TP, BK) (KDA) or (TP,) (GDN) fp32;
    rows past T repeat the last."""
    mt = offs_t < T
    g_base = t.g + b * io.g_b + h * io.g_h
    if KDA:
        gw = _window_tile(g_base, io.g_t, io.g_k, offs_t, mt, offs_k, mk)
    else:
        gw = tl.load(g_base + offs_t * io.g_t, mask=mt, other=0.0).to(tl.float32)
    return tl.cumsum(gw, axis=0)


@triton.jit
def append_window_entries(b, h, slot0, g_base_sum, keys, T, offs_t, offs_k, mk, t, io, lay, KDA: tl.constexpr):
    """Store the window's gates of value head h at slots ``slot0 ..`` (KDA: running sums from
    ``g_base_sum`` (BK,), the sum before the window) and, if ``keys``, the keys of key head
    h // GROUP (rounded to the ring dtype)."""
    mt = offs_t < T
    slots = slot0 + offs_t
    gb = t.g_buf + b * lay.gb_b + h * lay.gb_h
    if KDA:
        gs = window_gate_sums(b, h, T, offs_t, offs_k, mk, t, io, KDA) + g_base_sum[None, :]
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
def append_flush_row(b, T, offs_t, offs_k, mk, t, io, lay, KDA: tl.constexpr):
    """A flush-first row's window keys and gates, every head, at slots 0 .. T-1 (its ring restarts)."""
    zero = tl.zeros(offs_k.shape, dtype=tl.float32)
    for hk in range(lay.HV // lay.GROUP):
        for j in range(lay.GROUP):  # the key head's value heads; the first also stores its keys
            append_window_entries(b, hk * lay.GROUP + j, 0, zero, j == 0, T, offs_t, offs_k, mk, t, io, lay, KDA)


@triton.jit
def _window_coupling(Kw, Kr_w, Qw, Gw, T, offs_t, KDA: tl.constexpr, DOT_PREC: tl.constexpr):
    """(WK, WQ) (TP, TP): ``k~_s . (exp(G_t - G_s) x_t)`` for s < t (x = k, q), zero elsewhere;
    ``Kr_w`` the window keys rounded to the ring dtype. GDN: one scalar decay per pair, KDA: one
    per pair and key channel (a loop over the tokens)."""
    lower = offs_t[None, :] < offs_t[:, None]  # [t, s]: s < t
    if KDA:
        WK = tl.zeros([Kw.shape[0], Kw.shape[0]], dtype=tl.float32)
        WQ = tl.zeros([Kw.shape[0], Kw.shape[0]], dtype=tl.float32)
        for i in range(1, T):
            sel = offs_t == i
            before = offs_t < i
            dec = tl.where(before[:, None], tl.exp(tl.sum(tl.where(sel[:, None], Gw, 0.0), axis=0)[None, :] - Gw), 0.0)  # (TP, BK) rows s < i
            kd = Kr_w * dec
            wk = tl.where(before, tl.sum(kd * tl.sum(tl.where(sel[:, None], Kw, 0.0), axis=0)[None, :], axis=1), 0.0)
            wq = tl.where(before, tl.sum(kd * tl.sum(tl.where(sel[:, None], Qw, 0.0), axis=0)[None, :], axis=1), 0.0)
            WK = tl.where(sel[:, None], wk[None, :], WK)
            WQ = tl.where(sel[:, None], wq[None, :], WQ)
    else:
        dec = tl.exp(Gw[:, None] - Gw[None, :])
        kt = tl.trans(Kr_w)
        WK = tl.where(lower, tl.dot(Kw, kt, input_precision=DOT_PREC) * dec, 0.0)
        WQ = tl.where(lower, tl.dot(Qw, kt, input_precision=DOT_PREC) * dec, 0.0)
    return WK, WQ


@triton.jit
def verify_kernel(t, io, lay, T, NG, KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NB: tl.constexpr,
                  LP: tl.constexpr, TP: tl.constexpr, WRITE_IDLE: tl.constexpr, ARRIVE: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """One verify step (module notes); NG column groups of NB blocks per value head. ARRIVE: every
    program arrives at its row's cursor word once the ring's keys and gates are read, and the last
    one writes a flush row's keys and gates and the next cursor; otherwise ``commit_kernel`` does."""
    i_g, i_bh, b, h, hk = head_block(NG, lay)
    cur_ptr = t.cursor + b * io.cur
    c = tl.load(cur_ptr)
    if ARRIVE:
        c = cursor_of_word(c)
    active = c >= 0
    flush = active & (c + T > lay.L)
    cc = tl.maximum(c, 0)  # ring entries read: folded (flush rows) or the window's history
    c0 = tl.where(flush, 0, cc)  # the window's first slot
    k_lim = tl.where(active, lay.K, 0)  # idle rows read nothing

    offs_k = tl.arange(0, BK)
    mk = offs_k < lay.K
    mk_in = offs_k < k_lim
    offs_l = tl.arange(0, LP)
    ml = offs_l < cc
    offs_t = tl.arange(0, TP)
    mt = offs_t < T

    # the ring's keys (BK, LP) and decays, weighted to the last entry: F_j = exp(G_base - G_j)
    kb_base = t.k_buf + b * lay.kb_b + hk * lay.kb_h
    gb_base = t.g_buf + b * lay.gb_b + h * lay.gb_h
    Kr = tl.load(kb_base + offs_k[:, None] * lay.kb_k + offs_l[None, :] * lay.kb_l, mask=mk_in[:, None] & ml[None, :],
                 other=0.0).to(tl.float32)
    Gw = window_gate_sums(b, h, T, offs_t, offs_k, mk_in, t, io, KDA)
    if KDA:
        Gr = tl.load(gb_base + offs_k[:, None] * lay.gb_k + offs_l[None, :] * lay.gb_l,
                     mask=mk_in[:, None] & ml[None, :], other=0.0).to(tl.float32)
        g_base = previous_gate_sum(gb_base, lay.gb_l, lay.gb_k, offs_k, mk_in, cc)  # G_{cc-1} (BK,)
        KF = tl.where(ml[None, :], Kr * tl.exp(g_base[:, None] - Gr), 0.0)
        E = tl.exp(Gw)  # (TP, BK)
    else:
        gr = tl.load(gb_base + offs_l * lay.gb_l, mask=ml, other=0.0).to(tl.float32)
        g_base = tl.sum(gr, axis=0)
        KF = Kr * tl.where(ml, tl.exp(g_base - tl.cumsum(gr, axis=0)), 0.0)[None, :]
        E = tl.exp(Gw)[:, None]  # (TP, 1)
    d_base = tl.exp(g_base)
    d_read = tl.where(flush, 1.0, d_base)  # a flush row reads its new checkpoint, no decay before the window

    # the window's keys and queries (fp32; the keys' ring copies rounded), its coupling, the history's
    Kw = _window_tile(t.k + b * io.k_b + hk * io.k_h, io.k_t, io.k_k, offs_t, mt, offs_k, mk_in)
    Qw = _window_tile(t.q + b * io.q_b + hk * io.q_h, io.q_t, io.q_k, offs_t, mt, offs_k, mk_in)
    Kr_w = Kw.to(t.k_buf.dtype.element_ty).to(tl.float32)
    WK, WQ = _window_coupling(Kw, Kr_w, Qw, Gw, T, offs_t, KDA, DOT_PREC)
    kq = tl.sum(Kw * Qw, axis=1)  # (TP,) the token's own k . q, fp32
    beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h + offs_t * io.beta_t, mask=offs_t < tl.where(active, T, 0),
                   other=0.0).to(tl.float32)
    WKb = beta[:, None] * WK
    KE = Kw * E
    QE = Qw * E
    if KDA:
        XK = KE * d_read[None, :]
        XQ = QE * d_read[None, :]
    else:
        XK = KE * d_read
        XQ = QE * d_read
    CK = tl.where(flush, 0.0, tl.dot(KE, KF, input_precision=DOT_PREC))  # (TP, LP)
    CQ = tl.where(flush, 0.0, tl.dot(QE, KF, input_precision=DOT_PREC))

    if active & (c + T <= lay.L) & (i_g == 0):  # keys and gates past the history: nobody reads those slots
        append_window_entries(b, h, c0, g_base, h % lay.GROUP == 0, T, offs_t, offs_k, mk, t, io, lay, KDA)
    if ARRIVE:
        tl.debug_barrier()  # every thread's ring reads are done before the arrival releases them
        arrived = count_arrival(cur_ptr, c, "release")
        if arrived == lay.HV * NG - 1:
            if flush:
                tl.atomic_add(cur_ptr, 0, sem="acquire")  # the other programs' ring reads come first
                append_flush_row(b, T, offs_t, offs_k, mk, t, io, lay, KDA)
            tl.store(cur_ptr, tl.where(active, c0 + T, c))

    s_base = t.state + b * lay.s_b + h * lay.s_h
    ub_base = t.u_buf + b * lay.u_b + h * lay.u_h
    v_base = t.v + b * io.v_b + h * io.v_h
    o_base = t.out + b * io.out_b + h * io.out_h
    for jb in range(NB):
        offs_v = (i_g * NB + jb) * BV + tl.arange(0, BV)
        mv = offs_v < lay.V
        mv_in = offs_v < tl.where(active, lay.V, 0)
        s_ptrs = s_base + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v
        S0 = tl.load(s_ptrs, mask=mk_in[:, None] & mv_in[None, :], other=0.0).to(tl.float32)
        Ur = tl.load(ub_base + offs_l[:, None] * lay.u_l + offs_v[None, :] * lay.u_v, mask=ml[:, None] & mv_in[None, :],
                     other=0.0).to(tl.float32)  # (LP, BV)
        if flush:
            if KDA:
                S1 = S0 * d_base[:, None]
            else:
                S1 = S0 * d_base
            S1 = tl.dot(KF, Ur, S1, input_precision=DOT_PREC).to(t.state.dtype.element_ty)  # rounded once
            tl.store(s_ptrs, S1, mask=mk[:, None] & mv[None, :])
            S0 = S1.to(tl.float32)
            tl.debug_barrier()  # the fold's u reads are done before the window's u stores
        R0 = tl.dot(XK, S0, input_precision=DOT_PREC)
        R0 = tl.dot(CK, Ur, R0, input_precision=DOT_PREC)  # (TP, BV)
        Q0 = tl.dot(XQ, S0, input_precision=DOT_PREC)
        Q0 = tl.dot(CQ, Ur, Q0, input_precision=DOT_PREC)
        Vw = _window_tile(v_base, io.v_t, io.v_v, offs_t, mt, offs_v, mv_in)  # (TP, BV)

        # forward substitution: token i's u_i, rounded to the ring copy, enters the later tokens only
        B = beta[:, None] * (Vw - R0)  # (TP, BV) u_t before the window's corrections
        O = Q0
        U = tl.zeros([TP, BV], dtype=tl.float32)
        for i in range(T):
            sel = offs_t == i
            later = (offs_t > i)[:, None]
            u = tl.sum(tl.where(sel[:, None], B, 0.0), axis=0)
            u_ring = u.to(t.u_buf.dtype.element_ty).to(tl.float32)[None, :]
            B = tl.where(later, B - tl.sum(tl.where(sel[None, :], WKb, 0.0), axis=1)[:, None] * u_ring, B)
            O = tl.where(later, O + tl.sum(tl.where(sel[None, :], WQ, 0.0), axis=1)[:, None] * u_ring, O)
            U = tl.where(sel[:, None], u[None, :], U)
        O += kq[:, None] * U

        m_out = mt[:, None] & (mv if WRITE_IDLE else mv_in)[None, :]
        tl.store(o_base + offs_t[:, None] * io.out_t + offs_v[None, :] * io.out_v,
                 tl.where(active, O, 0.0).to(t.out.dtype.element_ty), mask=m_out)
        tl.store(ub_base + (c0 + offs_t)[:, None] * lay.u_l + offs_v[None, :] * lay.u_v,
                 U.to(t.u_buf.dtype.element_ty), mask=mt[:, None] & mv_in[None, :])


@triton.jit
def commit_kernel(t, io, lay, T, KDA: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr):
    """After a verify launch without arrivals, one program per row: a flush-first row's window keys
    and gates, and every row's next cursor (``c + T``, or ``T`` after a flush; idle rows keep theirs)."""
    b = tl.program_id(0).to(tl.int64)
    cur_ptr = t.cursor + b * io.cur
    c = tl.load(cur_ptr)
    offs_k = tl.arange(0, BK)
    offs_t = tl.arange(0, TP)
    if c + T > lay.L:
        append_flush_row(b, T, offs_t, offs_k, offs_k < lay.K, t, io, lay, KDA)
        tl.store(cur_ptr, T)
    elif c >= 0:
        tl.store(cur_ptr, c + T)
