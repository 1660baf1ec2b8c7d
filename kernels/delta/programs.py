"""Triton programs of the delta-rule ReplaySSM decode step (Gated DeltaNet and KDA), multi-launch.

Semantics: ``reference.py``. With ``c`` buffered entries and the decayed history
``A = exp(G_c) S0 + sum_{j<c} (exp(G_c - G_j) k_j) u_j^T``, a step needs ``r = A^T k_c``,
``u_c = beta (v - r)`` and ``o = A^T q + (k_c . q) u_c``, without forming ``A``:
``A^T x = S0^T (exp(G_c) x) + sum_j (k_j . (exp(G_c - G_j) x)) u_j``. Three launches:
ring coefficients (``coef_kernel`` / ``gdn_coef_kernel``, which also write the advanced
cursors to a scratch), a read-only output launch (``output_kernel``), and a persistent flush
launch (``flush_kernel``) over the rows whose cursor is ``L - 1``, which rebuilds their
checkpoint (and computes their step with ``OUTPUT``) and copies the cursors back. Helpers shared
with the other delta-rule programs: ``tiles.py``, ``gates.py``. Host side: ``launch.py``; reasons
for the defaults: examples/benchmarks/TUNING.md.
"""

from __future__ import annotations

from collections import namedtuple

import triton
import triton.language as tl

from ..cursor import advanced_cursor
from ..dependent import gdc_launch_dependents, gdc_wait
from ..persistent import flush_row_prefix, nth_flush_row
from ..quant_triton import biased_words, codes_to_f32, word_code_to_f32
from ..split_dot import bf16_parts
from .gates import append_gate_sum, gdn_decay_window, previous_gate_sum
from .tiles import column_scale, head_block, store_state_tile

#: a step's tensors (``words``: an int8 checkpoint viewed as int32, for the output launch's WORDS);
#: ``Scratch``: the fp32 scratch of the coefficient launch (x, cw), the flush
#: rows' u_c (uf) and the advanced cursors (cn, int32)
Tensors = namedtuple("Tensors", "q k v g beta state u_buf k_buf g_buf cursor out scale rng words")
Scratch = namedtuple("Scratch", "x cw uf cn")
#: strides of the per-step inputs, the output and the cursor: always runtime arguments
IoStrides = namedtuple("IoStrides", "q_b q_h q_k k_b k_h k_k v_b v_h v_v g_b g_h g_k beta_b beta_h out_b out_h out_v "
                                    "cur sc_b sc_h sc_v rng_b")
#: sizes and the strides of the checkpoint and the rings: compile-time constants in the
#: coefficient and output launches, runtime arguments elsewhere
Layout = namedtuple("Layout", "HV GROUP K V L s_b s_h s_k s_v u_b u_h u_l u_v kb_b kb_h kb_l kb_k gb_b gb_h gb_l "
                              "gb_k")


@triton.jit
def _key_tiles(q_base, k_base, kb_base, offs_k, mk, offs_l, inl, io, lay):
    """fp32 key-dim tile ``offs_k`` of k_c, of q, and of the ring keys transposed (BK, LP)
    (slots bounded by ``inl``; the caller selects stale ones away)."""
    kv = tl.load(k_base + offs_k * io.k_k, mask=mk, other=0.0).to(tl.float32)
    qv = tl.load(q_base + offs_k * io.q_k, mask=mk, other=0.0).to(tl.float32)
    kw = tl.load(kb_base + offs_k[:, None] * lay.kb_k + offs_l[None, :] * lay.kb_l,
                 mask=mk[:, None] & inl[None, :], other=0.0).to(tl.float32)
    return kv, qv, kw



@triton.jit
def _ring_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, w, dsc, io, lay,
                KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, LW: tl.constexpr, LP: tl.constexpr):
    """Scratch of one (row, value head) from the first ``LW`` ring slots (``LW >= c``; slots
    ``LW .. LP-1`` of cw get zeros). Gated DeltaNet: ``w`` (LW,) and ``dsc`` from
    ``gdn_decay_window``; KDA: unused. Ring loads stop at the cursor; stale slots are selected
    away before anything mixes entries."""
    offs_l = tl.arange(0, LW)
    ml = offs_l < c
    ck = tl.zeros([LW], dtype=tl.float32)
    cq = tl.zeros([LW], dtype=tl.float32)
    kq = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < lay.K
        kv, qv, kw = _key_tiles(q_base, k_base, kb_base, offs_k, mk, offs_l, ml, io, lay)
        if KDA:
            gv = tl.load(g_base + offs_k * io.g_k, mask=mk, other=0.0).to(tl.float32)
            gm = tl.load(gb_base + offs_k[:, None] * lay.gb_k + offs_l[None, :] * lay.gb_l,
                         mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # running sums G_j
            gt = previous_gate_sum(gb_base, lay.gb_l, lay.gb_k, offs_k, mk, c) + gv  # G_c per key channel
            kw = kw * tl.exp(gt[:, None] - gm)  # stale slots (>= c) are selected away below
            dvec = tl.exp(gt)
        else:
            dvec = tl.zeros([BK], dtype=tl.float32) + dsc
        ck += tl.sum(kw * kv[:, None], axis=0)
        cq += tl.sum(kw * qv[:, None], axis=0)
        kq += kv * qv
        tl.store(x_base + offs_k, dvec * kv, mask=mk)
        tl.store(x_base + lay.K + offs_k, dvec * qv, mask=mk)
    ck = tl.where(ml, ck, 0.0)
    cq = tl.where(ml, cq, 0.0)
    if not KDA:
        ck = ck * w
        cq = cq * w
    tl.store(cw_base + offs_l, ck)
    tl.store(cw_base + LP + offs_l, cq)
    for i_r in tl.static_range(1, LP // LW):  # LW and LP are powers of two
        offs_r = i_r * LW + offs_l
        tl.store(cw_base + offs_r, tl.zeros([LW], dtype=tl.float32))
        tl.store(cw_base + LP + offs_r, tl.zeros([LW], dtype=tl.float32))
    offs_p = tl.arange(0, LP)
    tl.store(cw_base + 2 * LP + offs_p, tl.where(offs_p == 0, tl.sum(kq, axis=0), 0.0))


@triton.jit
def _kda_window_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, io, lay, BK: tl.constexpr,
                      NK: tl.constexpr, LP: tl.constexpr, LW: tl.constexpr, WINDOWS: tl.constexpr):
    """KDA ``_ring_coefs`` on the narrowest of ``WINDOWS`` windows (LW, LW / 2, LW / 4) that holds
    the row's ``c`` ring entries (a window's width is fixed at compile time, the cursor is not)."""
    if WINDOWS > 1:
        if c <= LW // 2:
            _kda_window_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, io, lay, BK, NK, LP,
                              LW // 2, WINDOWS - 1)
            return
    _ring_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, 0.0, 0.0, io, lay, True, BK, NK, LW,
                LP)


@triton.jit
def coef_kernel(t, sc, io, lay, KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, LP: tl.constexpr,
                WINDOWS: tl.constexpr, PDL: tl.constexpr, SKIP_FLUSH: tl.constexpr):
    """Coefficients, one program per (row, value head). x scratch (Bt, HV, 2, K): [xk, xq]; cw
    scratch (Bt, HV, 3, LP): [ck, cq, (k_c . q, 0...)]; the head-0 program stores the row's
    advanced cursor in ``cn``. WINDOWS (KDA, 1-3): ring windows picked by cursor (whole, half,
    quarter). Idle rows, and flush rows with SKIP_FLUSH (the flush launch computes their step),
    write nothing else. PDL: let the output launch start now (it waits before the scratch)."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    b = (pid // lay.HV).to(tl.int64)
    h = pid % lay.HV
    hk = h // lay.GROUP
    c = tl.load(t.cursor + b * io.cur)
    if h == 0:
        tl.store(sc.cn + b, advanced_cursor(c, lay.L))
    if (c < 0) | ((c == lay.L - 1) & SKIP_FLUSH):
        return
    q_base = t.q + b * io.q_b + hk * io.q_h
    k_base = t.k + b * io.k_b + hk * io.k_h
    g_base = t.g + b * io.g_b + h * io.g_h
    kb_base = t.k_buf + b * lay.kb_b + hk * lay.kb_h
    gb_base = t.g_buf + b * lay.gb_b + h * lay.gb_h
    x_base = sc.x + pid.to(tl.int64) * 2 * lay.K
    cw_base = sc.cw + pid.to(tl.int64) * 3 * LP
    if not KDA:
        offs_l = tl.arange(0, LP)
        ml = offs_l < c
        w, dsc = gdn_decay_window(gb_base, g_base, offs_l, ml, ml, lay)
        _ring_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, w, dsc, io, lay, KDA, BK, NK, LP,
                    LP)
    else:
        _kda_window_coefs(q_base, k_base, g_base, kb_base, gb_base, x_base, cw_base, c, io, lay, BK, NK, LP, LP,
                          WINDOWS)


@triton.jit
def gdn_coef_kernel(t, sc, io, lay, BK: tl.constexpr, NK: tl.constexpr, LP: tl.constexpr, GP: tl.constexpr,
                    WRITE_X: tl.constexpr, PDL: tl.constexpr, SKIP_FLUSH: tl.constexpr):
    """Gated DeltaNet coefficients, one program per (row, key head): the ring-key products
    ``k_j . k_c`` and ``k_j . q`` once for the GROUP value heads sharing the key head (one (GP, ...)
    tile, GP = GROUP rounded up to a power of two), each weighted by its own decays. cw scratch:
    [ck, cq, (k_c . q, exp(G_c), 0...)]; the output launch scales k_c and q by exp(G_c) itself,
    unless WRITE_X: then the x scratch holds them. Cursor, SKIP_FLUSH and PDL: as ``coef_kernel``."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    Hk = lay.HV // lay.GROUP
    b = (pid // Hk).to(tl.int64)
    hk = pid % Hk
    c = tl.load(t.cursor + b * io.cur)
    if hk == 0:
        tl.store(sc.cn + b, advanced_cursor(c, lay.L))
    if (c < 0) | ((c == lay.L - 1) & SKIP_FLUSH):
        return
    offs_l = tl.arange(0, LP)
    ml = offs_l < c
    offs_g = tl.arange(0, GP)
    mg = offs_g < lay.GROUP
    h_g = hk * lay.GROUP + offs_g  # (GP,) value heads of this key head
    gh = tl.load(t.g_buf + b * lay.gb_b + h_g[:, None] * lay.gb_h + offs_l[None, :] * lay.gb_l,
                 mask=mg[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (GP, LP)
    gcur = tl.load(t.g + b * io.g_b + h_g * io.g_h, mask=mg, other=0.0).to(tl.float32)
    q_base = t.q + b * io.q_b + hk * io.q_h
    k_base = t.k + b * io.k_b + hk * io.k_h
    kb_base = t.k_buf + b * lay.kb_b + hk * lay.kb_h
    dk = tl.zeros([LP], dtype=tl.float32)
    dq = tl.zeros([LP], dtype=tl.float32)
    kq = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < lay.K
        kv, qv, kw = _key_tiles(q_base, k_base, kb_base, offs_k, mk, offs_l, ml, io, lay)
        dk += tl.sum(kw * kv[:, None], axis=0)
        dq += tl.sum(kw * qv[:, None], axis=0)
        kq += kv * qv
    # stale slots (>= c; NaN in the tests) are selected away before anything mixes entries
    dk = tl.where(ml, dk, 0.0)
    dq = tl.where(ml, dq, 0.0)
    kqs = tl.sum(kq, axis=0)
    gh = tl.where(ml[None, :], gh, 0.0)
    gtot = tl.sum(gh, axis=1) + gcur  # G_c per value head
    w = tl.where(ml[None, :], tl.exp(gtot[:, None] - tl.cumsum(gh, axis=1)), 0.0)  # (GP, LP)
    dsc = tl.exp(gtot)
    bh = b * lay.HV + h_g  # (GP,)
    cw_base = sc.cw + bh[:, None] * 3 * LP + offs_l[None, :]
    m2 = mg[:, None] & (offs_l < LP)[None, :]  # the value-head mask over the whole (GP, LP) tile
    tl.store(cw_base, dk[None, :] * w, mask=m2)
    tl.store(cw_base + LP, dq[None, :] * w, mask=m2)
    tl.store(cw_base + 2 * LP, tl.where(offs_l[None, :] == 0, kqs, tl.where(offs_l[None, :] == 1, dsc[:, None], 0.0)),
             mask=m2)
    if WRITE_X:
        for i_k in range(NK):
            offs_k = i_k * BK + tl.arange(0, BK)
            mk = offs_k < lay.K
            kv = tl.load(k_base + offs_k * io.k_k, mask=mk, other=0.0).to(tl.float32)  # cached: read above
            qv = tl.load(q_base + offs_k * io.q_k, mask=mk, other=0.0).to(tl.float32)
            x_base = sc.x + bh[:, None] * 2 * lay.K + offs_k[None, :]
            mx = mg[:, None] & mk[None, :]
            tl.store(x_base, dsc[:, None] * kv[None, :], mask=mx)
            tl.store(x_base + lay.K, dsc[:, None] * qv[None, :], mask=mx)


@triton.jit
def copy_vector(src, s_src, dst, s_dst, K, BK: tl.constexpr, NK: tl.constexpr):
    """dst[k] = src[k] for k < K, converted to dst's dtype (a ring append)."""
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        val = tl.load(src + offs_k * s_src, mask=mk, other=0.0)
        tl.store(dst + offs_k * s_dst, val.to(dst.dtype.element_ty), mask=mk)


@triton.jit
def _append_entry(b, h, c, i_v, u, offs_v, mv, t, io, lay, KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr):
    """Append ``(u_c, k_c, g_c)`` at slot ``c`` (k by one program per key head, g by one per value head;
    KDA: the running sum ``G_c``)."""
    tl.store(t.u_buf + b * lay.u_b + h * lay.u_h + c * lay.u_l + offs_v * lay.u_v, u.to(t.u_buf.dtype.element_ty),
             mask=mv)
    if i_v == 0:
        if h % lay.GROUP == 0:  # one program per key head appends k_c
            hk = h // lay.GROUP
            copy_vector(t.k + b * io.k_b + hk * io.k_h, io.k_k, t.k_buf + b * lay.kb_b + hk * lay.kb_h + c * lay.kb_l,
                        lay.kb_k, lay.K, BK, NK)
        if KDA:
            append_gate_sum(t.g + b * io.g_b + h * io.g_h, io.g_k, t.g_buf + b * lay.gb_b + h * lay.gb_h, lay.gb_l,
                            lay.gb_k, c, lay.K, BK, NK)
        else:
            gs = tl.load(t.g + b * io.g_b + h * io.g_h)
            tl.store(t.g_buf + b * lay.gb_b + h * lay.gb_h + c * lay.gb_l, gs.to(t.g_buf.dtype.element_ty))



@triton.jit
def _word_sums(u, xk, xq):
    """``S0^T xk`` and ``S0^T xq`` (BV,) from ``biased_words`` ``u`` (BK, BV // 4): each code plane
    (columns 4m + j) reduced alone, the four results interleaved back into column order."""
    c = word_code_to_f32(u, 0)
    r0, h0 = tl.sum(c * xk[:, None], axis=0), tl.sum(c * xq[:, None], axis=0)
    c = word_code_to_f32(u, 8)
    r1, h1 = tl.sum(c * xk[:, None], axis=0), tl.sum(c * xq[:, None], axis=0)
    c = word_code_to_f32(u, 16)
    r2, h2 = tl.sum(c * xk[:, None], axis=0), tl.sum(c * xq[:, None], axis=0)
    c = word_code_to_f32(u, 24)
    r3, h3 = tl.sum(c * xk[:, None], axis=0), tl.sum(c * xq[:, None], axis=0)
    return (tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3)),
            tl.interleave(tl.interleave(h0, h2), tl.interleave(h1, h3)))


@triton.jit
def output_kernel(t, sc, io, lay, NV: tl.constexpr, KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr,
                  LP: tl.constexpr, WRITE_IDLE: tl.constexpr, X_FROM_KEYS: tl.constexpr, PDL: tl.constexpr,
                  SKIP_FLUSH_ROWS: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr, FMT: tl.constexpr = 0,
                  WORDS: tl.constexpr = False):
    """Output, one program per (row, value head, block of BV value columns): ``r = S0^T xk + sum_j
    ck_j u_j``, ``hq = S0^T xq + sum_j cq_j u_j``, ``o``, and the appends. The checkpoint tile and
    the inputs are loaded before the cursor is known (an idle row's are discarded); the u ring
    load waits for it and stops there. SKIP_FLUSH_ROWS: flush rows are left to the flush launch
    (their checkpoint tile is then not loaded here, so that load waits for the cursor); otherwise
    a flush row's u_c goes unrounded to the ``uf`` scratch. X_FROM_KEYS (Gated DeltaNet): k_c and q
    scaled by exp(G_c) here instead of read from the x scratch. PDL: a programmatic dependent of
    the coefficient launch (the scratch is read after ``gdc_wait``). LAUNCH_DEPENDENTS: let the
    flush launch start now. WORDS (an int8 checkpoint in one key tile): its codes read as int32 words of
    four value columns (``t.words``), so the products reduce four column sets that are interleaved."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    i_v, i_bh, b, h, _ = head_block(NV, lay)
    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < lay.V
    o_base = t.out + b * io.out_b + h * io.out_h + offs_v * io.out_v

    offs_l = tl.arange(0, LP)
    x_base = sc.x + i_bh.to(tl.int64) * 2 * lay.K
    cw_base = sc.cw + i_bh.to(tl.int64) * 3 * LP
    s_base = t.state + b * lay.s_b + h * lay.s_h
    ub_base = t.u_buf + b * lay.u_b + h * lay.u_h

    c = tl.load(t.cursor + b * io.cur)
    if NK == 1:
        offs_k0 = tl.arange(0, BK)
        mvs = mv
        if SKIP_FLUSH_ROWS:
            mvs = mv & (offs_v * 0 + c != lay.L - 1)
        if WORDS:
            offs_w = i_v * (BV // 4) + tl.arange(0, BV // 4)
            mws = offs_w < lay.V // 4
            if SKIP_FLUSH_ROWS:
                mws = mws & (offs_w * 0 + c != lay.L - 1)
            s_first = tl.load(t.words + b * (lay.s_b // 4) + h * (lay.s_h // 4) + offs_k0[:, None] * (lay.s_k // 4)
                              + offs_w[None, :], mask=(offs_k0 < lay.K)[:, None] & mws[None, :], other=0)
        else:
            s_first = tl.load(s_base + offs_k0[:, None] * lay.s_k + offs_v[None, :] * lay.s_v,
                              mask=(offs_k0 < lay.K)[:, None] & mvs[None, :], other=0.0)
    if FMT >= 3:  # int8 / fp8: the column scales, with the checkpoint tile (before the cursor's branches)
        colsc = column_scale(b, h, offs_v, mv, t, io, FMT)
    if SKIP_FLUSH_ROWS:
        if c == lay.L - 1:  # before the other loads: the flush launch does this row's step
            return
    ub = tl.load(ub_base + offs_l[:, None] * lay.u_l + offs_v[None, :] * lay.u_v,
                 mask=(offs_l < c)[:, None] & mv[None, :], other=0.0)  # (LP, BV)
    vv = tl.load(t.v + b * io.v_b + h * io.v_h + offs_v * io.v_v, mask=mv, other=0.0).to(tl.float32)
    beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h).to(tl.float32)
    if PDL:
        gdc_wait()  # the coefficient launch's scratch is complete and visible after this
    ck = tl.load(cw_base + offs_l)
    cq = tl.load(cw_base + LP + offs_l)
    kq = tl.load(cw_base + 2 * LP)
    if X_FROM_KEYS:
        dsc = tl.load(cw_base + 2 * LP + 1)
    if c < 0:
        if WRITE_IDLE:
            tl.store(o_base, tl.zeros([BV], dtype=t.out.dtype.element_ty), mask=mv)
        return
    flush = c == lay.L - 1
    ml = offs_l < c
    ub = tl.where(ml[:, None], ub.to(tl.float32), 0.0)
    r = tl.zeros([BV], dtype=tl.float32)
    hq = tl.zeros([BV], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < lay.K
        if WORDS:
            s0 = biased_words(s_first)
        elif NK == 1:
            s0 = codes_to_f32(s_first, FMT)
        else:
            s0 = codes_to_f32(tl.load(s_base + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v,
                                      mask=mk[:, None] & mv[None, :], other=0.0), FMT)
        if X_FROM_KEYS:
            hk_x = h // lay.GROUP
            xk = tl.load(t.k + b * io.k_b + hk_x * io.k_h + offs_k * io.k_k, mask=mk, other=0.0).to(tl.float32) * dsc
            xq = tl.load(t.q + b * io.q_b + hk_x * io.q_h + offs_k * io.q_k, mask=mk, other=0.0).to(tl.float32) * dsc
        else:
            xk = tl.load(x_base + offs_k, mask=mk, other=0.0)
            xq = tl.load(x_base + lay.K + offs_k, mask=mk, other=0.0)
        if WORDS:
            dr, dh = _word_sums(s0, xk, xq)
            r += dr
            hq += dh
        else:
            r += tl.sum(s0 * xk[:, None], axis=0)
            hq += tl.sum(s0 * xq[:, None], axis=0)
    if FMT >= 3:  # the column scales multiply the reduced checkpoint reads
        r = r * colsc
        hq = hq * colsc
    r += tl.sum(ck[:, None] * ub, axis=0)
    hq += tl.sum(cq[:, None] * ub, axis=0)
    u = beta * (vv - r)
    o = hq + kq * u
    tl.store(o_base, o.to(t.out.dtype.element_ty), mask=mv)

    if flush:
        # the flush launch folds u_c in unrounded
        tl.store(sc.uf + i_bh.to(tl.int64) * lay.V + offs_v, u, mask=mv)
    else:
        _append_entry(b, h, c, i_v, u, offs_v, mv, t, io, lay, KDA, BK, NK)


@triton.jit
def _state_tile(s_base, offs_k, mk, offs_v, v_end, lay):
    """Checkpoint tile (BK, BV) at key rows ``offs_k`` and value columns ``offs_v < v_end``."""
    return tl.load(s_base + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v,
                   mask=mk[:, None] & (offs_v < v_end)[None, :], other=0.0)


@triton.jit
def _flush_rows(t, sc, io, row0, n_rows, BB: tl.constexpr, PDL: tl.constexpr, OUTPUT: tl.constexpr):
    """The flush rows of this launch's chunk, found from the advanced cursors of the coefficient
    launch (``cn``: 0 on a flush row); program 0 copies those to the cursors (no program of this
    launch reads them), after the output launch with PDL and OUTPUT."""
    csum, n_flush = flush_row_prefix(sc.cn, 1, row0, n_rows, 0, BB)
    if tl.program_id(0) == 0:
        if PDL and OUTPUT:
            gdc_wait()  # every program of the output launch has read the cursors
        offs_r = row0 + tl.arange(0, BB)
        mr = offs_r < row0 + n_rows
        tl.store(t.cursor + offs_r * io.cur, tl.load(sc.cn + offs_r, mask=mr), mask=mr)
    return csum, n_flush


@triton.jit
def _flush_item(w, per_row, csum, row0, NV, HEAD_ITEMS: tl.constexpr):
    """(row, value head, first column block) of flush work item ``w`` (``per_row`` items a row)."""
    rank = w // per_row
    rem = w - rank * per_row
    if HEAD_ITEMS:
        h = rem
        i_v0 = rem * 0
    else:
        h = rem // NV
        i_v0 = rem - h * NV
    return nth_flush_row(csum, rank, row0), h, i_v0


@triton.jit
def flush_kernel(t, sc, io, lay, row0, n_rows, NV, KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr,
                 BV: tl.constexpr, LP: tl.constexpr, BB: tl.constexpr, DOT_PREC: tl.constexpr,
                 BF16_SPLIT: tl.constexpr, HEAD_ITEMS: tl.constexpr, OUTPUT: tl.constexpr, PREFETCH: tl.constexpr,
                 PDL: tl.constexpr, FMT: tl.constexpr = 0, SR: tl.constexpr = False):
    """Persistent: the programs share the work items of the flush rows of ``row0 .. row0 + n_rows - 1``:
    (row, value head, column block), or with HEAD_ITEMS (row, value head) walking its column blocks.
    Each rebuilds ``A`` (a matrix product of the decay-weighted ring) and stores ``A + k_c u_c^T``.
    BF16_SPLIT: three bf16 products against a hi/mid/lo split of the weighted operand (GDN's u's,
    KDA's keys) instead of a ``DOT_PREC`` product. OUTPUT (NK == 1): the flush rows' step computed
    here (the checkpoint read once); else ``u_c`` from the ``uf`` scratch. PREFETCH: the next column
    block's checkpoint tile loaded a block ahead. PDL: a dependent of the output launch."""
    if PDL and not OUTPUT:
        gdc_wait()
    csum, n_flush = _flush_rows(t, sc, io, row0, n_rows, BB, PDL, OUTPUT)
    per_row = lay.HV if HEAD_ITEMS else lay.HV * NV
    n_cols = NV if HEAD_ITEMS else 1  # column blocks per item
    total = n_flush * per_row
    offs_l = tl.arange(0, LP)
    ml = offs_l < lay.L - 1  # the L - 1 buffered entries
    for w in range(tl.program_id(0), total, tl.num_programs(0)):
        b, h, i_v0 = _flush_item(w, per_row, csum, row0, NV, HEAD_ITEMS)
        hk = h // lay.GROUP
        i_bh = b * lay.HV + h
        v_end = tl.minimum((i_v0 + n_cols) * BV, lay.V)  # end of this item's value columns
        s_base = t.state + b * lay.s_b + h * lay.s_h
        ub_base = t.u_buf + b * lay.u_b + h * lay.u_h
        kb_base = t.k_buf + b * lay.kb_b + hk * lay.kb_h
        gb_base = t.g_buf + b * lay.gb_b + h * lay.gb_h
        g_base = t.g + b * io.g_b + h * io.g_h
        if not KDA:
            wl, dsc = gdn_decay_window(gb_base, g_base, offs_l, ml, ml, lay)  # (LP,) decay weights, exp(G_c)
        for i_k in range(NK):
            offs_k = i_k * BK + tl.arange(0, BK)
            mk = offs_k < lay.K
            kc = tl.load(t.k + b * io.k_b + hk * io.k_h + offs_k * io.k_k, mask=mk, other=0.0).to(tl.float32)
            if OUTPUT:  # (NK == 1: these are whole-key-dim vectors)
                qc = tl.load(t.q + b * io.q_b + hk * io.q_h + offs_k * io.q_k, mask=mk, other=0.0).to(tl.float32)
                kq = tl.sum(kc * qc, axis=0)
                beta = tl.load(t.beta + b * io.beta_b + h * io.beta_h).to(tl.float32)
            kw = tl.load(kb_base + offs_k[:, None] * lay.kb_k + offs_l[None, :] * lay.kb_l,
                         mask=mk[:, None] & ml[None, :], other=0.0)  # (BK, LP), ring dtype
            if KDA:
                gv = tl.load(g_base + offs_k * io.g_k, mask=mk, other=0.0).to(tl.float32)
                gm = tl.load(gb_base + offs_k[:, None] * lay.gb_k + offs_l[None, :] * lay.gb_l,
                             mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # running sums G_j
                gt = previous_gate_sum(gb_base, lay.gb_l, lay.gb_k, offs_k, mk, lay.L - 1) + gv  # G_{L-1}
                kw = kw.to(tl.float32) * tl.exp(gt[:, None] - gm)
                dk = tl.exp(gt)
                if BF16_SPLIT:
                    k_hi, k_mid, k_lo = bf16_parts(kw)
            if PREFETCH:  # the first column block's checkpoint tile, then each next one a block ahead
                s_next = _state_tile(s_base, offs_k, mk, i_v0 * BV + tl.arange(0, BV), v_end, lay)
            for j in range(n_cols):
                offs_v = (i_v0 + j) * BV + tl.arange(0, BV)
                mv = offs_v < lay.V
                m2 = mk[:, None] & mv[None, :]
                if PREFETCH:
                    s_cur = s_next
                    s_next = _state_tile(s_base, offs_k, mk, offs_v + BV, v_end, lay)
                ub = tl.load(ub_base + offs_l[:, None] * lay.u_l + offs_v[None, :] * lay.u_v,
                             mask=ml[:, None] & mv[None, :], other=0.0)  # (LP, BV), ring dtype
                if OUTPUT:
                    vv = tl.load(t.v + b * io.v_b + h * io.v_h + offs_v * io.v_v, mask=mv, other=0.0).to(tl.float32)
                else:
                    uc = tl.load(sc.uf + i_bh * lay.V + offs_v, mask=mv, other=0.0)
                if PREFETCH:
                    s0 = codes_to_f32(s_cur, FMT)
                else:
                    s0 = codes_to_f32(_state_tile(s_base, offs_k, mk, offs_v, v_end, lay), FMT)
                if FMT >= 3:
                    s0 = s0 * column_scale(b, h, offs_v, mv, t, io, FMT)[None, :]
                if KDA:
                    acc = s0 * dk[:, None]
                    if BF16_SPLIT:
                        acc = tl.dot(k_hi, ub, acc)
                        acc = tl.dot(k_mid, ub, acc)
                        acc = tl.dot(k_lo, ub, acc)
                    else:
                        acc += tl.dot(kw, ub.to(tl.float32), input_precision=DOT_PREC)
                else:
                    acc = s0 * dsc
                    ub = ub.to(tl.float32) * wl[:, None]
                    if BF16_SPLIT:
                        u_hi, u_mid, u_lo = bf16_parts(ub)
                        acc = tl.dot(kw, u_hi, acc)
                        acc = tl.dot(kw, u_mid, acc)
                        acc = tl.dot(kw, u_lo, acc)
                    else:
                        acc += tl.dot(kw.to(tl.float32), ub, input_precision=DOT_PREC)
                if OUTPUT:  # acc is the history A of this column block (whole key dim)
                    uc = beta * (vv - tl.sum(acc * kc[:, None], axis=0))
                    o = tl.sum(acc * qc[:, None], axis=0) + kq * uc
                    tl.store(t.out + b * io.out_b + h * io.out_h + offs_v * io.out_v, o.to(t.out.dtype.element_ty),
                             mask=mv)
                acc += kc[:, None] * uc[None, :]
                # Gated DeltaNet: nearest e4m3 by the store's cast (measured faster in this launch; KDA and
                # the Mamba-2 program keep the integer rounding, untimed there or slower)
                store_state_tile(s_base + offs_k[:, None] * lay.s_k + offs_v[None, :] * lay.s_v, acc, mk, mv, b, h,
                                 offs_k, offs_v, t, io, lay, FMT, SR, not KDA)
