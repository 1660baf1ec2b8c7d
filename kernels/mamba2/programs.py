"""Triton program of the Mamba-2 ReplaySSM decode step.

Semantics: ``reference.py``. A replay program owns one row, one group, a chunk of heads and a
block of head-dim lanes. It reads the row's cursor ``c`` on the device: ``0 <= c < L - 1`` takes
the output-only route (``y = abar (S0 . C) + sum_j w_j (B_j . C) x_j``; the checkpoint is only
read), ``c == L - 1`` the state-and-output route (``S = abar S0 + X^T diag(w) B`` over the window,
stored as the new checkpoint, ``y`` read from the fp32 ``S``). Both append ``(x, dt, B)`` at slot
``c``; the row's last program to arrive moves the cursor on. Per-head helpers: ``heads.py``.
Launch and tuning: ``launch.py``, ``config.py`` (reasons: examples/benchmarks/TUNING.md).
"""

from __future__ import annotations

from collections import namedtuple

import triton
import triton.language as tl

from ..persistent import flush_first_row
from ..int8_dot import c_planes, planes_dot
from ..quant_triton import biased_words, codes_to_f32, word_code_to_f32
from ..split_dot import dot_f32
from .heads import decay, head_constants, head_scale, process_dt, store_state_tile, window_weights

#: the tensors of a replay launch (optional ones replaced by ``x``, with zero strides)
Tensors = namedtuple("Tensors", "x dt B C state x_buf dt_buf B_buf cursor A dt_bias D z out arrivals scale rng "
                                "words")
#: strides of the per-step inputs and output: always runtime arguments
IoStrides = namedtuple("IoStrides", "x_b x_h x_p dt_b dt_h B_b B_g B_n C_b C_g C_n cur A dt_bias D z_b z_h z_p "
                                    "out_b out_h out_p sc_b sc_h sc_p rng_b")
#: sizes, program split and the strides of the checkpoint and the rings: compile-time constants
#: in ``replay_kernel``, runtime arguments in ``replay_kernel_dyn``
Layout = namedtuple("Layout", "P N L G HPG HC n_hc n_pb s_b s_h s_p s_n xb_b xb_h xb_l xb_p db_b db_h db_l "
                              "Bb_b Bb_g Bb_l Bb_n")
#: compile-time switches and block sizes (``launch.replay_flags``); FMT: the checkpoint's format
#: (``quant_triton``: >= 3 scaled, one scale per head-dim lane over N), SR: stochastic rounding
#: ROUTE: 0 both routes; 1 the output-only rows alone (no flush code, no cursor advance); 2 the flushing
#: rows alone, with the launch-wide cursor advance of every row (after a ROUTE 1 launch)
#: WORDS (ROUTE 1, one tile): an int8 checkpoint read as int32 words of 4 codes (``Tensors.words``: its
#: int32 view); 1: decoded by shifts and masks (a quarter of the loads, fewer instructions a code), 2:
#: ``S0 . C`` as ``dp4a`` integer products against C in byte planes (``LaunchConfig.word_dots``)
Flags = namedtuple("Flags", "HAS_DT_BIAS HAS_D HAS_Z DT_SOFTPLUS ZERO_IDLE DOT_LOWP DOT_PREC FLUSH_FMA EARLY "
                            "FLUSH_FROM_EARLY FLUSH_FIRST_BB BLOCK_P BLOCK_N BLOCK_NF BLOCK_L FMT SR ROUTE WORDS")


@triton.jit
def _program_row(t, io, lay, k):
    """(row b, cursor c, group, head chunk, lane block, and for the flush-first order all the rows'
    cursors, their offsets and the batch) of this program. Row order, or with FLUSH_FIRST_BB the
    programs of the rows whose cursor is ``L - 1`` first (``persistent.flush_first_row``)."""
    pid = tl.program_id(0)
    n_row = lay.G * lay.n_hc * lay.n_pb  # programs per row
    if k.FLUSH_FIRST_BB > 0:
        n_rows = tl.num_programs(0) // n_row
        b, cur_all, offs_r = flush_first_row(pid, n_row, t.cursor, io.cur, n_rows, lay.L - 1, k.FLUSH_FIRST_BB)
        r = pid % n_row
        c = tl.load(t.cursor + b * io.cur)  # (an L2 hit: it was just read with the others)
    else:
        r = pid
        cur_all, offs_r, n_rows = 0, 0, 0
    pb = r % lay.n_pb
    r = r // lay.n_pb
    hc = r % lay.n_hc
    r = r // lay.n_hc
    g = r % lay.G
    if k.FLUSH_FIRST_BB == 0:
        b = (r // lay.G).to(tl.int64)
        c = tl.load(t.cursor + b * io.cur)
    return b, c, g, hc, pb, cur_all, offs_r, n_rows


@triton.jit
def _load_words(b, h, offs_p, mask_p, t, lay, k):
    """Head ``h``'s int8 checkpoint lanes as int32 words (BLOCK_P, BLOCK_N // 4): word m holds the codes
    of columns 4m .. 4m + 3, the first in its low byte."""
    offs_w = tl.arange(0, k.BLOCK_N // 4)
    return tl.load(t.words + b * (lay.s_b // 4) + h * (lay.s_h // 4) + offs_p[:, None] * (lay.s_p // 4)
                   + offs_w[None, :], mask=mask_p[:, None] & (offs_w < lay.N // 4)[None, :], other=0)


@triton.jit
def _words_dot(wt, c0, c1, c2, c3):
    """(BLOCK_P,) sums ``S0 . C`` of int8 words ``wt`` (BLOCK_P, BLOCK_N // 4) against C split by column
    mod 4 (``c0`` .. ``c3``, (BLOCK_N // 4,) fp32): one xor a word, a fused multiply-add a code."""
    u = biased_words(wt)
    acc = word_code_to_f32(u, 0) * c0[None, :]
    acc += word_code_to_f32(u, 8) * c1[None, :]
    acc += word_code_to_f32(u, 16) * c2[None, :]
    acc += word_code_to_f32(u, 24) * c3[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _early_loads(b, g, h0, offs_p, mask_p, mask_s, t, io, lay, k):
    """Every load of the first head, its constants included, issued before the cursor is known
    (the compiler does not hoist loads above the branch on it). Window loads are bounded by L, not
    by the cursor; stale slots are selected away once it is known (NaN there is harmless)."""
    offs_n0 = tl.arange(0, k.BLOCK_N)
    mn0 = offs_n0 < lay.N
    offs_l0 = tl.arange(0, k.BLOCK_L)
    in_l = offs_l0 < lay.L
    if k.WORDS:
        s_e = _load_words(b, h0, offs_p, mask_s, t, lay, k)
    else:
        s_e = tl.load(t.state + b * lay.s_b + h0 * lay.s_h + offs_p[:, None] * lay.s_p + offs_n0[None, :] * lay.s_n,
                      mask=mask_s[:, None] & mn0[None, :], other=0.0)
    cv_e = tl.load(t.C + b * io.C_b + g * io.C_g + offs_n0 * io.C_n, mask=mn0, other=0.0)
    bc_e = tl.load(t.B + b * io.B_b + g * io.B_g + offs_n0 * io.B_n, mask=mn0, other=0.0)
    bw_e = tl.load(t.B_buf + b * lay.Bb_b + g * lay.Bb_g + offs_l0[:, None] * lay.Bb_l + offs_n0[None, :] * lay.Bb_n,
                   mask=in_l[:, None] & mn0[None, :], other=0.0)
    xw_e = tl.load(t.x_buf + b * lay.xb_b + h0 * lay.xb_h + offs_l0[:, None] * lay.xb_l + offs_p[None, :] * lay.xb_p,
                   mask=in_l[:, None] & mask_p[None, :], other=0.0)
    dtw_e = tl.load(t.dt_buf + b * lay.db_b + h0 * lay.db_h + offs_l0 * lay.db_l, mask=in_l, other=0.0)
    xc_e = tl.load(t.x + b * io.x_b + h0 * io.x_h + offs_p * io.x_p, mask=mask_p, other=0.0)
    dr_e = tl.load(t.dt + b * io.dt_b + h0 * io.dt_h)
    a_e, dtb_e, dco_e = head_constants(h0, True, t, io, k)
    return s_e, bw_e, bc_e, cv_e, xw_e, dtw_e, xc_e, dr_e, a_e, dtb_e, dco_e


@triton.jit
def _row_pointers(b, g, c, offs_p, mask_p, t, io, lay, k):
    """Window slots (buffered ``j < c``, current ``j == c``) and the row's base pointers."""
    offs_l = tl.arange(0, k.BLOCK_L)
    valid_l = offs_l < c  # buffered entries of this row
    cur_l = offs_l == c  # the current token's slot
    x_rel = offs_l[:, None] * lay.xb_l + offs_p[None, :] * lay.xb_p  # (BLOCK_L, BLOCK_P) window
    mx = valid_l[:, None] & mask_p[None, :]
    return (offs_l, valid_l, cur_l, t.x_buf + b * lay.xb_b, t.B_buf + b * lay.Bb_b + g * lay.Bb_g,
            t.B + b * io.B_b + g * io.B_g, t.C + b * io.C_b + g * io.C_g, t.x + b * io.x_b, t.state + b * lay.s_b,
            t.dt_buf + b * lay.db_b, t.dt + b * io.dt_b, t.z + b * io.z_b, t.out + b * io.out_b, x_rel, mx)


@triton.jit
def _head_output_and_append(y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, rows, t, io, lay, k):
    """Finish head ``h``: ``y += D x`` (``dco`` = the head's D), ``y *= silu(z)``, store ``y``; append
    the current ``x`` (already in the buffer dtype, ``xcb``) at slot ``c``, and ``dt`` from lane block 0."""
    _, _, _, xb_row, _, _, _, _, _, db_row, _, z_row, o_row, _, _ = rows
    if k.HAS_D:
        y += dco * xc.to(tl.float32)
    if k.HAS_Z:
        zv = tl.load(z_row + h * io.z_h + offs_p * io.z_p, mask=mask_p, other=0.0).to(tl.float32)
        y = y * (zv * tl.sigmoid(zv))
    tl.store(o_row + h * io.out_h + offs_p * io.out_p, y.to(t.out.dtype.element_ty), mask=mask_p)
    tl.store(xb_row + h * lay.xb_h + c * lay.xb_l + offs_p * lay.xb_p, xcb, mask=mask_p)
    if pb == 0:
        tl.store(db_row + h * lay.db_h + c * lay.db_l, d.to(t.dt_buf.dtype.element_ty))


@triton.jit
def _append_B(c, rows, t, io, lay, k):
    """Append the current ``B`` of one (row, group) at slot ``c`` (nobody reads slot c this step)."""
    _, _, _, _, Bb_row, B_row, _, _, _, _, _, _, _, _, _ = rows
    offs_n = tl.arange(0, k.BLOCK_N)
    for n0 in range(0, lay.N, k.BLOCK_N):
        nn = n0 + offs_n
        mn = nn < lay.N
        bcur = tl.load(B_row + nn * io.B_n, mask=mn, other=0.0)
        tl.store(Bb_row + c * lay.Bb_l + nn * lay.Bb_n, bcur.to(t.B_buf.dtype.element_ty), mask=mn)


@triton.jit
def _fma_window_update(s0, bcur, d, xcb, a_h, h, offs_p, mask_p, nn, mn, rows, t, lay, k):
    """One flush tile by rank-1 fp32 updates: ``abar * s0 + sum_j w_j x_j B_j^T`` over the whole
    window (buffered slots ``0 .. L - 2`` and the current token, ``xcb`` / ``bcur``, weight ``d``).
    s0: (BLOCK_P, BLOCK_NF) fp32; bcur: the current B over ``nn`` (rounded to the buffer's dtype).
    The weights walk the slots from ``L - 2`` down to 0 with a running sum of the later dt's:
    ``w_j = dt_j exp(A sum_{r>j} dt_r)``, ``abar = exp(A sum_r dt_r)``."""
    _, _, _, xb_row, Bb_row, _, _, _, _, db_row, _, _, _, _, _ = rows
    bc = bcur.to(t.B_buf.dtype.element_ty).to(tl.float32)
    upd = (d * xcb.to(tl.float32))[:, None] * bc[None, :]  # the current token: weight dt_c, no decay
    later = d  # sum of the dt's of the slots after j
    for jj in tl.static_range(k.BLOCK_L - 1):
        j = k.BLOCK_L - 2 - jj
        # a buffered slot? (slots past the window read nothing and weigh 0; vector masks:
        # the interpreter mis-types bool & 0-d bool)
        ok = (tl.zeros([], dtype=tl.int32) + j) < lay.L - 1
        okp = (tl.zeros([k.BLOCK_P], dtype=tl.int32) + j) < lay.L - 1
        okn = (tl.zeros([k.BLOCK_NF], dtype=tl.int32) + j) < lay.L - 1
        dj = tl.load(db_row + h * lay.db_h + j * lay.db_l, mask=ok, other=0.0).to(tl.float32)
        xj = tl.load(xb_row + h * lay.xb_h + j * lay.xb_l + offs_p * lay.xb_p, mask=mask_p & okp, other=0.0)
        bj = tl.load(Bb_row + j * lay.Bb_l + nn * lay.Bb_n, mask=mn & okn, other=0.0)
        wj = dj * decay(a_h * later)
        upd += (wj * xj.to(tl.float32))[:, None] * bj.to(tl.float32)[None, :]
        later += dj
    abar = decay(a_h * later)
    return abar * s0 + upd


@triton.jit
def _flush_heads_fma(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k):
    """State-and-output route, window update by rank-1 fp32 updates (``_fma_window_update``): any
    ``BLOCK_P``, fp32 products for every operand dtype, few registers. With FLUSH_FROM_EARLY (one
    flush tile spans the state dim) the first head starts from the early loads ``e``."""
    _, _, _, _, _, B_row, C_row, x_row, st_row, _, dt_row, _, _, _, _ = rows
    offs_nf = tl.arange(0, k.BLOCK_NF)
    i0 = 0
    if k.FLUSH_FROM_EARLY:
        s_e, _, bc_e, cv_e, _, _, xc_e, dr_e, a_e, dtb_e, dco_e = e
        d = process_dt(dr_e, dtb_e, k)
        xcb = xc_e.to(t.x_buf.dtype.element_ty)
        mn = offs_nf < lay.N
        s_ptrs = st_row + h0 * lay.s_h + offs_p[:, None] * lay.s_p + offs_nf[None, :] * lay.s_n
        sc = head_scale(b, h0, offs_p, mask_p, t, io, k)
        s_new = _fma_window_update(codes_to_f32(s_e, k.FMT) * sc[:, None], bc_e, d, xcb, a_e, h0, offs_p, mask_p,
                                   offs_nf, mn, rows, t, lay, k)
        store_state_tile(s_ptrs, s_new, mask_p[:, None] & mn[None, :], b, h0, offs_p, mask_p, offs_nf, t, io, lay, k)
        acc_y = tl.sum(s_new * cv_e.to(tl.float32)[None, :], 1)
        _head_output_and_append(acc_y, h0, c, pb, xc_e, xcb, d, dco_e, offs_p, mask_p, rows, t, io, lay, k)
        i0 = 1
    for i in range(i0, nh):
        h = h0 + i
        a_h, dtb, dco = head_constants(h, True, t, io, k)
        d = process_dt(tl.load(dt_row + h * io.dt_h), dtb, k)
        xc = tl.load(x_row + h * io.x_h + offs_p * io.x_p, mask=mask_p, other=0.0)
        xcb = xc.to(t.x_buf.dtype.element_ty)
        acc_y = tl.zeros([k.BLOCK_P], dtype=tl.float32)
        sc = head_scale(b, h, offs_p, mask_p, t, io, k)
        for n0 in range(0, lay.N, k.BLOCK_NF):
            nn = n0 + offs_nf
            mn = nn < lay.N
            m2 = mask_p[:, None] & mn[None, :]
            s_ptrs = st_row + h * lay.s_h + offs_p[:, None] * lay.s_p + nn[None, :] * lay.s_n
            s0 = codes_to_f32(tl.load(s_ptrs, mask=m2, other=0.0), k.FMT) * sc[:, None]
            cv = tl.load(C_row + nn * io.C_n, mask=mn, other=0.0).to(tl.float32)
            bcur = tl.load(B_row + nn * io.B_n, mask=mn, other=0.0)
            s_new = _fma_window_update(s0, bcur, d, xcb, a_h, h, offs_p, mask_p, nn, mn, rows, t, lay, k)
            store_state_tile(s_ptrs, s_new, m2, b, h, offs_p, mask_p, nn, t, io, lay, k)
            acc_y += tl.sum(s_new * cv[None, :], 1)
        _head_output_and_append(acc_y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, rows, t, io, lay, k)


@triton.jit
def _flush_heads_dot(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k):
    """State-and-output route with a ``tl.dot`` over the window (``tf32x3`` for fp32 operands, the
    16-bit type with DOT_LOWP), one loop over (head, state-dim tile) pairs that issues every load of
    the next pair (and the next head's window) before computing the current one."""
    (offs_l, valid_l, cur_l, xb_row, Bb_row, B_row, C_row, x_row, st_row, db_row, dt_row, _, _, x_rel,
     mx) = rows
    offs_nf = tl.arange(0, k.BLOCK_NF)
    NT = tl.cdiv(lay.N, k.BLOCK_NF)
    total = nh * NT
    s_rel = offs_p[:, None] * lay.s_p + offs_nf[None, :] * lay.s_n
    b_rel = offs_l[:, None] * lay.Bb_l + offs_nf[None, :] * lay.Bb_n
    mb = valid_l[:, None]
    h = h0
    mn = offs_nf < lay.N
    if k.FLUSH_FROM_EARLY:
        s_t, bw_t, bc_t, cv_t, xw_t, dtw_t, xc_t, dr_t, _, _, _ = e
    else:
        s_t = tl.load(st_row + h * lay.s_h + s_rel, mask=mask_p[:, None] & mn[None, :], other=0.0)
        bw_t = tl.load(Bb_row + b_rel, mask=mb & mn[None, :], other=0.0)
        bc_t = tl.load(B_row + offs_nf * io.B_n, mask=mn, other=0.0)
        cv_t = tl.load(C_row + offs_nf * io.C_n, mask=mn, other=0.0)
        xw_t = tl.load(xb_row + h * lay.xb_h + x_rel, mask=mx, other=0.0)
        dtw_t = tl.load(db_row + h * lay.db_h + offs_l * lay.db_l, mask=valid_l, other=0.0)
        xc_t = tl.load(x_row + h * io.x_h + offs_p * io.x_p, mask=mask_p, other=0.0)
        dr_t = tl.load(dt_row + h * io.dt_h)
    acc_y = tl.zeros([k.BLOCK_P], dtype=tl.float32)
    for it in range(0, total):
        i = it // NT
        kt = it - i * NT
        h = h0 + i
        nn = kt * k.BLOCK_NF + offs_nf
        mn = nn < lay.N
        # next pair's loads (masked off past the end)
        t1 = it + 1
        i1 = t1 // NT
        h1 = h0 + i1
        nn1 = (t1 - i1 * NT) * k.BLOCK_NF + offs_nf
        okp = (tl.zeros([k.BLOCK_P], dtype=tl.int32) + t1) < total
        okl = (tl.zeros([k.BLOCK_L], dtype=tl.int32) + t1) < total
        okn = (tl.zeros([k.BLOCK_NF], dtype=tl.int32) + t1) < total
        mn1 = (nn1 < lay.N) & okn
        s_n = tl.load(st_row + h1 * lay.s_h + offs_p[:, None] * lay.s_p + nn1[None, :] * lay.s_n,
                      mask=(mask_p & okp)[:, None] & mn1[None, :], other=0.0)
        bw_n = tl.load(Bb_row + offs_l[:, None] * lay.Bb_l + nn1[None, :] * lay.Bb_n, mask=mb & mn1[None, :],
                       other=0.0)
        bc_n = tl.load(B_row + nn1 * io.B_n, mask=mn1, other=0.0)
        cv_n = tl.load(C_row + nn1 * io.C_n, mask=mn1, other=0.0)
        xw_n = tl.load(xb_row + h1 * lay.xb_h + x_rel, mask=mx & okp[None, :], other=0.0)
        dtw_n = tl.load(db_row + h1 * lay.db_h + offs_l * lay.db_l, mask=valid_l & okl, other=0.0)
        xc_n = tl.load(x_row + h1 * io.x_h + offs_p * io.x_p, mask=mask_p & okp, other=0.0)
        dr_n = tl.load(dt_row + h1 * io.dt_h, mask=t1 < total, other=0.0)

        a_h, dtb, dco = head_constants(h, True, t, io, k)
        d = process_dt(dr_t, dtb, k)
        w, abar = window_weights(dtw_t, d, cur_l, a_h)
        xcb = xc_t.to(t.x_buf.dtype.element_ty)
        xw = tl.where(cur_l[:, None], xcb[None, :], xw_t)  # (BLOCK_L, BLOCK_P), buffer dtype
        bw = tl.where(cur_l[:, None], bc_t.to(t.B_buf.dtype.element_ty)[None, :], bw_t).to(tl.float32)
        wb = w[:, None] * bw  # (BLOCK_L, BLOCK_NF)
        if k.DOT_LOWP:
            upd = tl.dot(tl.trans(xw), wb.to(t.x_buf.dtype.element_ty), out_dtype=tl.float32)
        else:
            upd = dot_f32(tl.trans(xw), wb, False, k.DOT_PREC)
        sc = head_scale(b, h, offs_p, mask_p, t, io, k)
        s_new = codes_to_f32(s_t, k.FMT) * (abar * sc)[:, None] + upd  # one multiply-add an element
        store_state_tile(st_row + h * lay.s_h + offs_p[:, None] * lay.s_p + nn[None, :] * lay.s_n, s_new,
                          mask_p[:, None] & mn[None, :], b, h, offs_p, mask_p, nn, t, io, lay, k)
        acc_y += tl.sum(s_new * cv_t.to(tl.float32)[None, :], 1)
        if kt == NT - 1:  # the head's last tile: output and appends
            _head_output_and_append(acc_y, h, c, pb, xc_t, xcb, d, dco, offs_p, mask_p, rows, t, io, lay, k)
        acc_y = tl.where((tl.zeros([k.BLOCK_P], dtype=tl.int32) + kt) == NT - 1, 0.0, acc_y)
        s_t, bw_t, bc_t, cv_t, xw_t, dtw_t, xc_t, dr_t = s_n, bw_n, bc_n, cv_n, xw_n, dtw_n, xc_n, dr_n


@triton.jit
def _output_window_products(rows, e, t, io, lay, k):
    """bc_j = B_j . C for the buffered entries and the current token (slot c), once per program."""
    offs_l, valid_l, cur_l, _, Bb_row, B_row, C_row, _, _, _, _, _, _, _, _ = rows
    offs_n = tl.arange(0, k.BLOCK_N)
    bc = tl.zeros([k.BLOCK_L], dtype=tl.float32)
    if k.EARLY:
        _, bw_e, bc_e, cv_e, _, _, _, _, _, _, _ = e
        bw = tl.where(valid_l[:, None], bw_e, 0.0)
        bw = tl.where(cur_l[:, None], bc_e.to(t.B_buf.dtype.element_ty)[None, :], bw).to(tl.float32)
        bc += tl.sum(bw * cv_e.to(tl.float32)[None, :], 1)
    else:
        for n0 in range(0, lay.N, k.BLOCK_N):
            nn = n0 + offs_n
            mn = nn < lay.N
            cvn = tl.load(C_row + nn * io.C_n, mask=mn, other=0.0).to(tl.float32)
            bw = tl.load(Bb_row + offs_l[:, None] * lay.Bb_l + nn[None, :] * lay.Bb_n,
                         mask=valid_l[:, None] & mn[None, :], other=0.0)
            bcur = tl.load(B_row + nn * io.B_n, mask=mn, other=0.0).to(t.B_buf.dtype.element_ty)
            bw = tl.where(cur_l[:, None], bcur[None, :], bw).to(tl.float32)
            bc += tl.sum(bw * cvn[None, :], 1)
    return bc


@triton.jit
def _output_heads_one_tile(b, h0, nh, pb, c, bc, offs_p, mask_p, rows, e, t, io, lay, k):
    """Output-only route when one tile spans the state dim: the first head from the early loads
    ``e``, and each next head's tiles loaded while the current head is computed."""
    offs_l, valid_l, cur_l, xb_row, _, _, _, x_row, st_row, db_row, dt_row, _, _, x_rel, mx = rows
    offs_n = tl.arange(0, k.BLOCK_N)
    mn = offs_n < lay.N
    m2 = mask_p[:, None] & mn[None, :]
    s_rel = offs_p[:, None] * lay.s_p + offs_n[None, :] * lay.s_n
    h = h0
    s_e, _, _, cv_e, xw_e, dtw_e, xc_e, dr_e, a_e, dtb_e, dco_e = e
    cv = cv_e.to(tl.float32)
    if k.WORDS:  # C by column mod 4, beside the words
        C_row = rows[6]
        offs_w = tl.arange(0, k.BLOCK_N // 4)
        mw = offs_w < lay.N // 4
        c0 = tl.load(C_row + (4 * offs_w) * io.C_n, mask=mw, other=0.0).to(tl.float32)
        c1 = tl.load(C_row + (4 * offs_w + 1) * io.C_n, mask=mw, other=0.0).to(tl.float32)
        c2 = tl.load(C_row + (4 * offs_w + 2) * io.C_n, mask=mw, other=0.0).to(tl.float32)
        c3 = tl.load(C_row + (4 * offs_w + 3) * io.C_n, mask=mw, other=0.0).to(tl.float32)
        if k.WORDS == 2:
            c_hi, c_mid, c_lo, c_down, c_nan = c_planes(c0, c1, c2, c3)
    s_t = s_e
    xw_t = tl.where(mx, xw_e, 0.0)
    dtw_t = tl.where(valid_l, dtw_e, 0.0)
    xc_t = xc_e
    dr_t = dr_e
    a_t, dtb_t, dco_t = a_e, dtb_e, dco_e
    for i in range(0, nh):
        h = h0 + i
        hn = h + 1
        ok = (tl.zeros([], dtype=tl.int32) + i + 1) < nh
        okp = (tl.zeros([k.BLOCK_P], dtype=tl.int32) + i + 1) < nh  # vector masks (the interpreter
        okl = (tl.zeros([k.BLOCK_L], dtype=tl.int32) + i + 1) < nh  # mis-types bool & 0-d bool)
        # next head's loads first, so they are in flight while this head computes
        if k.WORDS:
            s_n = _load_words(b, hn, offs_p, mask_p & okp, t, lay, k)
        else:
            s_n = tl.load(st_row + hn * lay.s_h + s_rel, mask=m2 & okp[:, None], other=0.0)
        xw_n = tl.load(xb_row + hn * lay.xb_h + x_rel, mask=mx & okp[None, :], other=0.0)
        dtw_n = tl.load(db_row + hn * lay.db_h + offs_l * lay.db_l, mask=valid_l & okl, other=0.0)
        xc_n = tl.load(x_row + hn * io.x_h + offs_p * io.x_p, mask=mask_p & okp, other=0.0)
        dr_n = tl.load(dt_row + hn * io.dt_h, mask=ok, other=0.0)
        a_n, dtb_n, dco_n = head_constants(hn, ok, t, io, k)

        if k.WORDS:
            if k.WORDS == 2:
                acc = planes_dot(s_t, c_hi, c_mid, c_lo, c_down, c_nan)  # S0 . C
            else:
                acc = _words_dot(s_t, c0, c1, c2, c3)
        else:
            acc = tl.sum(codes_to_f32(s_t, k.FMT) * cv[None, :], 1)  # S0 . C
        if k.FMT >= 3:
            acc = acc * head_scale(b, h, offs_p, mask_p, t, io, k)
        d = process_dt(dr_t, dtb_t, k)
        w, abar = window_weights(dtw_t, d, cur_l, a_t)
        xcb = xc_t.to(t.x_buf.dtype.element_ty)
        xw = tl.where(cur_l[:, None], xcb[None, :], xw_t).to(tl.float32)
        y = abar * acc + tl.sum((w * bc)[:, None] * xw, 0)
        _head_output_and_append(y, h, c, pb, xc_t, xcb, d, dco_t, offs_p, mask_p, rows, t, io, lay, k)
        a_t, dtb_t, dco_t = a_n, dtb_n, dco_n
        s_t = s_n
        xw_t = xw_n
        dtw_t = dtw_n
        xc_t = xc_n
        dr_t = dr_n


@triton.jit
def _output_heads_tiled(b, h0, nh, pb, c, bc, offs_p, mask_p, rows, t, io, lay, k):
    """Output-only route over several state-dim tiles per head (``BLOCK_N < N``)."""
    offs_l, valid_l, cur_l, xb_row, _, _, C_row, x_row, st_row, db_row, dt_row, _, _, x_rel, mx = rows
    offs_n = tl.arange(0, k.BLOCK_N)
    for i in range(0, nh):
        h = h0 + i
        dtw = tl.load(db_row + h * lay.db_h + offs_l * lay.db_l, mask=valid_l, other=0.0)
        xc = tl.load(x_row + h * io.x_h + offs_p * io.x_p, mask=mask_p, other=0.0)
        xw = tl.load(xb_row + h * lay.xb_h + x_rel, mask=mx, other=0.0)
        acc = tl.zeros([k.BLOCK_P], dtype=tl.float32)
        for n0 in range(0, lay.N, k.BLOCK_N):
            nn = n0 + offs_n
            mn = nn < lay.N
            s0 = codes_to_f32(tl.load(st_row + h * lay.s_h + offs_p[:, None] * lay.s_p + nn[None, :] * lay.s_n,
                                      mask=mask_p[:, None] & mn[None, :], other=0.0), k.FMT)
            cvn = tl.load(C_row + nn * io.C_n, mask=mn, other=0.0).to(tl.float32)
            acc += tl.sum(s0 * cvn[None, :], 1)
        if k.FMT >= 3:
            acc = acc * head_scale(b, h, offs_p, mask_p, t, io, k)
        a_h, dtb, dco = head_constants(h, True, t, io, k)
        d = process_dt(tl.load(dt_row + h * io.dt_h), dtb, k)
        w, abar = window_weights(dtw, d, cur_l, a_h)
        xcb = xc.to(t.x_buf.dtype.element_ty)
        xw = tl.where(cur_l[:, None], xcb[None, :], xw).to(tl.float32)
        y = abar * acc + tl.sum((w * bc)[:, None] * xw, 0)
        _head_output_and_append(y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, rows, t, io, lay, k)


@triton.jit
def _advance_all_if_last(arrived, cur_all, offs_r, n_rows, t, io, lay):
    """Launch-wide cursor advance (flush-first order): the last program of the launch to arrive moves
    every active row's cursor on (from the cursors it mapped itself with) and clears the count."""
    if arrived == tl.num_programs(0) - 1:
        tl.store(t.cursor + offs_r * io.cur, ((cur_all + 1) % lay.L).to(t.cursor.dtype.element_ty),
                 mask=(offs_r < n_rows) & (cur_all >= 0))
        tl.store(t.arrivals, 0)


@triton.jit
def _flush_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k):
    """State-and-output route of a flushing row's program (rank-1 fp32 or ``tl.dot`` window update)."""
    if k.FLUSH_FMA:
        _flush_heads_fma(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)
    else:
        _flush_heads_dot(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)


@triton.jit
def _output_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k):
    """Output-only route of a row's program: the window products once, then its heads."""
    bc = _output_window_products(rows, e, t, io, lay, k)
    if k.EARLY:
        if k.BLOCK_N >= lay.N:  # (a runtime test in replay_kernel_dyn; true whenever EARLY)
            _output_heads_one_tile(b, h0, nh, pb, c, bc, offs_p, mask_p, rows, e, t, io, lay, k)
        else:
            _output_heads_tiled(b, h0, nh, pb, c, bc, offs_p, mask_p, rows, t, io, lay, k)
    else:
        _output_heads_tiled(b, h0, nh, pb, c, bc, offs_p, mask_p, rows, t, io, lay, k)


@triton.jit
def _replay_program(t, io, lay, k):
    """One replay step of one program (module notes). The cursor advance needs every program of a
    row to have read ``c``: each arrives (a relaxed ``atomic_add`` after a CTA barrier: every thread
    has branched on ``c`` first, so its read has returned) and the last one to arrive writes
    ``(c + 1) % L`` at its end. Per-row counts at ``arrivals[b]``, or with the flush-first order
    one launch-wide count at ``arrivals[0]`` (idle rows' programs arrive too). With ROUTE 1 / 2 a
    program skips the rows of the other route (ROUTE 1: no arrivals; ROUTE 2: flush-first order)."""
    b, c, g, hc, pb, cur_all, offs_r, n_rows = _program_row(t, io, lay, k)
    offs_p = pb * k.BLOCK_P + tl.arange(0, k.BLOCK_P)
    mask_p = offs_p < lay.P
    h0 = g * lay.HPG + hc * lay.HC
    nh = tl.minimum(lay.HC, lay.HPG - hc * lay.HC)
    is_flush = c == lay.L - 1
    if k.EARLY:
        if k.ROUTE == 1:  # a flushing row's checkpoint is read by the ROUTE 2 launch
            mask_s = mask_p & ((tl.zeros([k.BLOCK_P], dtype=tl.int32) + c) != lay.L - 1)
        else:
            mask_s = mask_p
        e = _early_loads(b, g, h0, offs_p, mask_p, mask_s, t, io, lay, k)
    else:  # placeholders: the routes load their own tiles then
        e = (0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0)
    if c < 0:
        # idle row: nothing written (except zeros into a freshly allocated out); its early loads
        # are discarded
        if k.ZERO_IDLE and k.ROUTE != 2:
            for i in range(0, nh):
                h = h0 + i
                tl.store(t.out + b * io.out_b + h * io.out_h + offs_p * io.out_p,
                         tl.zeros([k.BLOCK_P], dtype=t.out.dtype.element_ty), mask=mask_p)
        if k.FLUSH_FIRST_BB > 0:  # launch-wide count: idle rows' programs arrive too
            tl.debug_barrier()
            _advance_all_if_last(tl.atomic_add(t.arrivals, 1, sem="relaxed"), cur_all, offs_r, n_rows, t, io, lay)
        return
    if k.ROUTE == 1:
        if is_flush:
            return
    if k.ROUTE == 2:
        if c != lay.L - 1:
            tl.debug_barrier()
            _advance_all_if_last(tl.atomic_add(t.arrivals, 1, sem="relaxed"), cur_all, offs_r, n_rows, t, io, lay)
            return

    tl.debug_barrier()
    arrived = 0
    if k.ROUTE != 1:
        if k.FLUSH_FIRST_BB > 0:
            arrived = tl.atomic_add(t.arrivals, 1, sem="relaxed")
        else:
            arrived = tl.atomic_add(t.arrivals + b, 1, sem="relaxed")

    rows = _row_pointers(b, g, c, offs_p, mask_p, t, io, lay, k)
    if k.ROUTE == 1:
        _output_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)
    elif k.ROUTE == 2:
        _flush_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)
    else:
        if is_flush:
            _flush_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)
        else:
            _output_route(b, h0, nh, pb, c, offs_p, mask_p, rows, e, t, io, lay, k)
    if (hc == 0) & (pb == 0):  # one program per (row, group) appends B
        _append_B(c, rows, t, io, lay, k)

    if k.ROUTE != 1:
        if k.FLUSH_FIRST_BB > 0:
            _advance_all_if_last(arrived, cur_all, offs_r, n_rows, t, io, lay)
        else:
            if arrived == lay.G * lay.n_hc * lay.n_pb - 1:
                tl.store(t.cursor + b * io.cur, ((c + 1) % lay.L).to(t.cursor.dtype.element_ty))
                tl.store(t.arrivals + b, 0)


@triton.jit
def replay_kernel(t, io, lay: tl.constexpr, k: tl.constexpr):
    """One replay step, the layout (sizes, checkpoint and ring strides) compiled in."""
    _replay_program(t, io, lay, k)


@triton.jit
def replay_kernel_dyn(t, io, lay, k: tl.constexpr):
    """One replay step, the layout as runtime arguments (the same program)."""
    _replay_program(t, io, lay, k)
