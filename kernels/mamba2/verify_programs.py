"""Triton program of the Mamba-2 multi-token verify step (speculative decoding).

Semantics: ``verify.py``. As in the replay decode (``programs.py``), a program owns one row b, one
group g, a chunk of heads and a block of head-dim lanes, and reads the row's cursor ``c`` on the
device. A row whose ring cannot take the T window tokens (``c + T > L``) first folds its c entries
into each checkpoint tile (``S = abar S0 + X^T diag(w) B``, a ``tl.dot`` over the ring), stores it
rounded to the checkpoint dtype and starts the window at slot ``s = 0``; the other rows start at
``s = c`` and only read the checkpoint. Either way the checkpoint tile is read once for all T
outputs (output-only route over a causal window of ``L`` slots: ring entries ``j < s``, then the
window tokens, taken from the inputs):

    y_t = exp(A Pcum_{s+t}) (S0 . C_t) + sum_{j <= s+t} dt_j exp(A (Pcum_{s+t} - Pcum_j)) (B_j . C_t) x_j

``C_t . S0`` for every t is one ``tl.dot`` per (head, state tile), ``C_t . B_j`` one per program
(shared by the group's heads), the causal sum over the slots one more per head; every mask is a
selection, so a rejected draft's NaN inputs never reach an earlier token's output (``_head_outputs``).
The loads that do not depend on the cursor (the first head's checkpoint tile and ring, the group's
ring B, the window's C) go out before it, and each head's tiles while the previous head computes.
Launch: ``verify_launch.py``.

Appends: each program writes its heads' and lanes' window ``x`` at slots ``s .. s+T-1``. ``dt``
(one entry per head, read by every lane block) and ``B`` (one per group, read by every head chunk)
go straight in where nobody reads those slots this step (``s = c``: the ring is read below c only);
on a flushing row the fold reads the very slots the window overwrites, so the row's last program to
arrive writes them, once every program of the row has done its reads. That program also moves the
cursor on to ``s + T``. Arrivals are counted on the cursor word (``kernels/cursor.py``) where it can
carry them (int32 cursors, ``L <= 127``), else in a vector of per-row counters.
"""

from __future__ import annotations

from collections import namedtuple

import triton
import triton.language as tl

from ..cursor import count_arrival, cursor_of_word
from ..quant_triton import codes_to_f32
from ..split_dot import dot_f32 as _dot
from .heads import decay, head_constants, head_scale, process_dt, round_state_tile

#: the tensors of a verify launch (optional ones replaced by ``x``, with zero strides; ``arrivals``
#: by ``cursor`` when the cursor word counts the arrivals)
Tensors = namedtuple("Tensors", "x dt B C state x_buf dt_buf B_buf cursor A dt_bias D z out arrivals scale rng")
#: the window length T and the strides of the per-step inputs and the output (``_t``: the window
#: token), runtime arguments: a speculative run verifies windows of many lengths, and every T that
#: rounds up to the same BLOCK_T shares one compiled program
IoStrides = namedtuple("IoStrides", "T x_b x_t x_h x_p dt_b dt_t dt_h B_b B_t B_g B_n C_b C_t C_g C_n cur A "
                                    "dt_bias D z_b z_t z_h z_p out_b out_t out_h out_p sc_b sc_h sc_p rng_b")
#: sizes, program split and the checkpoint / ring strides (compiled in)
Layout = namedtuple("Layout", "P N L G H HPG HC n_hc n_pb s_b s_h s_p s_n xb_b xb_h xb_l xb_p db_b db_h db_l "
                              "Bb_b Bb_g Bb_l Bb_n")
#: compile-time switches and block sizes (``verify_launch.verify_flags``). LOWP_S0C / LOWP_BC: the
#: ``C . S0`` / ``C . B`` products on 16-bit operands of one dtype (exact products, fp32 sums; an
#: int8 / fp8 checkpoint's codes converted to C's dtype, which holds them exactly);
#: otherwise on fp32 operands at DOT_PREC. BLOCK_T: T rounded up to a power of two, at least 8. FMT:
#: the checkpoint's format (``quant_triton``: int8 / fp8 ones are read through their lane scales, and
#: a flush-first fold, one state tile wide, stores their codes and scales); SR: stochastic rounding
#: of that fold under the row's counter (advanced before the launch)
Flags = namedtuple("Flags", "HAS_DT_BIAS HAS_D HAS_Z DT_SOFTPLUS ZERO_IDLE ON_CURSOR LOWP_S0C LOWP_BC DOT_PREC "
                            "BLOCK_P BLOCK_N BLOCK_L BLOCK_T BLOCK_G BLOCK_H FMT SR")


@triton.jit
def _non_finite(v):
    """NaN or +-inf, elementwise."""
    return (v != v) | (tl.abs(v) == float("inf"))


@triton.jit
def _pair_loads(b, h, nn, rem, offs_p, mask_p, t, io, lay, k):
    """The loads of one (head, state tile) pair that do not depend on the cursor: the checkpoint tile
    transposed (BLOCK_N, BLOCK_P), the head's ring x (BLOCK_L, BLOCK_P) and dt (BLOCK_L,) over every
    slot (the cursor selects among them later: a stale slot may hold anything), and the head's
    constants. Everything is masked off unless ``rem > 0`` (vector masks: the interpreter mis-types
    bool & 0-d bool)."""
    offs_l = tl.arange(0, k.BLOCK_L)
    okp = mask_p & ((tl.zeros([k.BLOCK_P], dtype=tl.int32) + rem) > 0)
    okn = (nn < lay.N) & ((tl.zeros([k.BLOCK_N], dtype=tl.int32) + rem) > 0)
    okl = (offs_l < lay.L) & ((tl.zeros([k.BLOCK_L], dtype=tl.int32) + rem) > 0)
    s0 = tl.load(t.state + b * lay.s_b + h * lay.s_h + nn[:, None] * lay.s_n + offs_p[None, :] * lay.s_p,
                 mask=okn[:, None] & okp[None, :], other=0.0)
    sc = head_scale(b, h, offs_p, okp, t, io, k)  # int8 / fp8: the lanes' scales (the codes stay as loaded)
    xr = tl.load(t.x_buf + b * lay.xb_b + h * lay.xb_h + offs_l[:, None] * lay.xb_l + offs_p[None, :] * lay.xb_p,
                 mask=okl[:, None] & okp[None, :], other=0.0)
    dtr = tl.load(t.dt_buf + b * lay.db_b + h * lay.db_h + offs_l * lay.db_l, mask=okl, other=0.0)
    a_h, dtb, dco = head_constants(h, rem > 0, t, io, k)
    return s0, sc, xr, dtr, a_h, dtb, dco


@triton.jit
def _s0_products(ct, s0, sc, k):
    """``C_t . S0`` (BLOCK_T, BLOCK_P) of a transposed checkpoint tile ``s0`` (BLOCK_N, BLOCK_P) as
    stored. int8 / fp8: the product of the codes (exact in C's 16-bit dtype, LOWP_S0C), times the
    lanes' scales ``sc`` after it."""
    if k.FMT >= 3:
        codes = codes_to_f32(s0, k.FMT)
        if k.LOWP_S0C:
            codes = codes.to(ct.dtype)
        acc = _dot(ct, codes, k.LOWP_S0C, k.DOT_PREC) * sc[None, :]
    else:
        acc = _dot(ct, s0, k.LOWP_S0C, k.DOT_PREC)
    return acc


@triton.jit
def _window_loads(b, h, s, win_l, rem, offs_p, mask_p, t, io, lay, k):
    """Head ``h``'s window inputs, by slot: raw dt (BLOCK_L,) and x (BLOCK_L, BLOCK_P) at slots
    ``s .. s+T-1``; by token: x and z (BLOCK_T, BLOCK_P) (z: 0 without a gate). Masked off unless
    ``rem > 0``."""
    offs_l = tl.arange(0, k.BLOCK_L)
    offs_t = tl.arange(0, k.BLOCK_T)
    tw = offs_l - s  # window token of each slot
    okl = win_l & ((tl.zeros([k.BLOCK_L], dtype=tl.int32) + rem) > 0)
    okt = (offs_t < io.T) & ((tl.zeros([k.BLOCK_T], dtype=tl.int32) + rem) > 0)
    dr = tl.load(t.dt + b * io.dt_b + tw * io.dt_t + h * io.dt_h, mask=okl, other=0.0)
    xin = tl.load(t.x + b * io.x_b + tw[:, None] * io.x_t + h * io.x_h + offs_p[None, :] * io.x_p,
                  mask=okl[:, None] & mask_p[None, :], other=0.0)
    m_tp = okt[:, None] & mask_p[None, :]
    xt = tl.load(t.x + b * io.x_b + offs_t[:, None] * io.x_t + h * io.x_h + offs_p[None, :] * io.x_p, mask=m_tp,
                 other=0.0)
    zv = tl.zeros([k.BLOCK_T, k.BLOCK_P], dtype=tl.float32)
    if k.HAS_Z:
        zv = tl.load(t.z + b * io.z_b + offs_t[:, None] * io.z_t + h * io.z_h + offs_p[None, :] * io.z_p, mask=m_tp,
                     other=0.0).to(tl.float32)
    return dr, xin, xt, zv


@triton.jit
def _ring_B(b, g, nn, t, lay, k):
    """The group's ring B transposed (BLOCK_N, BLOCK_L) over every slot (cursor-independent)."""
    offs_l = tl.arange(0, k.BLOCK_L)
    return tl.load(t.B_buf + b * lay.Bb_b + g * lay.Bb_g + nn[:, None] * lay.Bb_n + offs_l[None, :] * lay.Bb_l,
                   mask=(nn < lay.N)[:, None] & (offs_l < lay.L)[None, :], other=0.0)


@triton.jit
def _window_C(b, g, nn, t, io, lay, k):
    """The window tokens' C (BLOCK_T, BLOCK_N) over the state tile ``nn``."""
    offs_t = tl.arange(0, k.BLOCK_T)
    return tl.load(t.C + b * io.C_b + g * io.C_g + offs_t[:, None] * io.C_t + nn[None, :] * io.C_n,
                   mask=(offs_t < io.T)[:, None] & (nn < lay.N)[None, :], other=0.0)


@triton.jit
def _window_BC(b, g, s, append_b, br0, ct0, offs_l, hist_l, win_l, t, io, lay, k):
    """``C_t . B_j`` (BLOCK_T, BLOCK_L) fp32 over the window's slots: ring entries ``j < s``, then the
    window tokens' B (rounded to the ring's dtype) at ``s .. s+T-1``; 0 elsewhere (selected: stale
    slots may hold NaN). ``br0``, ``ct0``: the first state tile's ``_ring_B`` and ``_window_C``. With
    ``append_b`` the window's B are appended on the way."""
    tw = offs_l - s  # window token of each slot
    app_l = win_l & (offs_l < tl.where(append_b, lay.L, 0))  # a bound, not a scalar and-ed into a vector
    bc = tl.zeros([k.BLOCK_T, k.BLOCK_L], dtype=tl.float32)
    for n0 in range(0, lay.N, k.BLOCK_N):
        nn = n0 + tl.arange(0, k.BLOCK_N)
        mn = nn < lay.N
        if n0 == 0:
            br, ct = br0, ct0
        else:
            br, ct = _ring_B(b, g, nn, t, lay, k), _window_C(b, g, nn, t, io, lay, k)
        bwin = tl.load(t.B + b * io.B_b + g * io.B_g + nn[:, None] * io.B_n + tw[None, :] * io.B_t,
                       mask=mn[:, None] & win_l[None, :], other=0.0).to(t.B_buf.dtype.element_ty)
        bw = tl.where(win_l[None, :], bwin, tl.where(hist_l[None, :], br, 0.0).to(t.B_buf.dtype.element_ty))
        bc += _dot(ct, bw, k.LOWP_BC, k.DOT_PREC)
        tl.store(t.B_buf + b * lay.Bb_b + g * lay.Bb_g + nn[:, None] * lay.Bb_n + offs_l[None, :] * lay.Bb_l, bwin,
                 mask=mn[:, None] & app_l[None, :])
    return bc


@triton.jit
def _fold_tile(s0, sc, br, b, h, nn, offs_p, mask_p, a_h, ring_l, xr, dtr, t, io, lay, k):
    """A flushing row's checkpoint tile (transposed, BLOCK_N x BLOCK_P) after its ``c`` ring entries:
    ``abar S0 + B^T diag(w) X`` (fp32; ``s0`` as stored, int8 / fp8 codes with their lane scales
    ``sc``; ``xr``, ``dtr``: head ``h``'s ring x (BLOCK_L, BLOCK_P) and dt (BLOCK_L,), 0 past c;
    ``br``: the group's ring B (BLOCK_N, BLOCK_L), any value past c), stored rounded; returns the
    stored tile and its lane scales (int8 / fp8: the codes and the scales it stored, for which the
    tile spans N; else 1)."""
    pc = tl.sum(dtr, 0)
    w = dtr * decay(a_h * (pc - tl.cumsum(dtr, 0)))
    wb = tl.where(ring_l[None, :], br.to(tl.float32) * w[None, :], 0.0)
    xq = xr.to(t.x_buf.dtype.element_ty)  # the ring's values: exact
    if k.DOT_PREC == "bf16x2":  # the stored checkpoint gets the 24-bit split
        upd = _dot(wb, xq, False, "bf16x3")
    else:
        upd = _dot(wb, xq, False, k.DOT_PREC)
    if k.FMT >= 3:
        s0f = codes_to_f32(s0, k.FMT) * sc[None, :]
    else:
        s0f = s0.to(tl.float32)
    s_new = decay(a_h * pc) * s0f + upd
    m2 = (nn < lay.N)[:, None] & mask_p[None, :]
    ptrs = t.state + b * lay.s_b + h * lay.s_h + nn[:, None] * lay.s_n + offs_p[None, :] * lay.s_p
    if (k.FMT >= 3) | k.SR:
        q, d = round_state_tile(s_new, m2, b, h, offs_p, nn, t, io, lay, k, 0)  # the tile is transposed
        stored = q.to(t.state.dtype.element_ty)
        tl.store(ptrs, stored, mask=m2)
        if k.FMT >= 3:
            tl.store(t.scale + b * io.sc_b + h * io.sc_h + offs_p * io.sc_p, d, mask=mask_p)
            sc = d
    else:
        stored = s_new.to(t.state.dtype.element_ty)
        tl.store(ptrs, stored, mask=m2)
    return stored, sc  # (one return: the compiler visits the code after a constexpr branch)


@triton.jit
def _head_outputs(b, h, s, flush, pb, s0c, bc, xr, dtr, wl, dtb, dco, a_h, offs_l, hist_l, win_l, offs_p, mask_p,
                  t, io, lay, k):
    """Head ``h``'s T outputs (BLOCK_T, BLOCK_P) from ``s0c`` = C_t . S0 and ``bc`` = C_t . B_j, then
    its window appends: x at slots ``s .. s+T-1``, and dt (lane block 0) unless the row flushed.
    ``wl``: the head's ``_window_loads``.

    The causal sum is a ``tl.dot`` over the slots, ``sum_j m_tj x_j`` with ``m_tj = 0`` past slot
    ``s + t``; a product ``0 * NaN`` would still carry a later token's NaN input into it, so the
    window's non-finite x enter the product as 0, and the outputs of the tokens at and after one are
    set to NaN (a running count over the tokens)."""
    offs_t = tl.arange(0, k.BLOCK_T)
    dr, xin, xt, zv = wl
    d = process_dt(dr, dtb, k).to(t.dt_buf.dtype.element_ty).to(tl.float32)
    dtw = tl.where(hist_l, dtr, tl.where(win_l, d, 0.0))  # dt of the window's slots
    pcum = tl.cumsum(dtw, 0)
    pos = s + offs_t  # slot of each token
    p_t = tl.sum(tl.where(offs_l[None, :] == pos[:, None], pcum[None, :], 0.0), 1)  # (BLOCK_T,) Pcum at the token
    vis = offs_l[None, :] <= pos[:, None]  # (BLOCK_T, BLOCK_L): slot j seen by token t
    m = tl.where(vis, dtw[None, :] * decay(a_h * (p_t[:, None] - pcum[None, :])) * bc, 0.0)
    xinb = xin.to(t.x_buf.dtype.element_ty)
    xw = tl.where(hist_l[:, None], xr, xinb.to(tl.float32))
    xw = tl.where(win_l[:, None] & _non_finite(xw), 0.0, xw)
    xw = xw.to(t.x_buf.dtype.element_ty)  # ring entries and rounded inputs: exact
    y = decay(a_h * p_t)[:, None] * s0c + _dot(m, xw, False, k.DOT_PREC)
    xt = xt.to(tl.float32)
    y = tl.where(tl.cumsum(_non_finite(xt).to(tl.int32), 0) > 0, float("nan"), y)  # a non-finite x at a token <= t
    if k.HAS_D:
        y += dco * xt
    if k.HAS_Z:
        y = y * (zv * tl.sigmoid(zv))
    tl.store(t.out + b * io.out_b + offs_t[:, None] * io.out_t + h * io.out_h + offs_p[None, :] * io.out_p,
             y.to(t.out.dtype.element_ty), mask=(offs_t < io.T)[:, None] & mask_p[None, :])
    if flush:  # the fold read this head's x at these slots (other threads' loads): all returned first
        tl.debug_barrier()
    xb = t.x_buf + b * lay.xb_b + h * lay.xb_h
    tl.store(xb + offs_l[:, None] * lay.xb_l + offs_p[None, :] * lay.xb_p, xinb, mask=win_l[:, None] & mask_p[None, :])
    app_dt = (pb == 0) & (flush == 0)
    tl.store(t.dt_buf + b * lay.db_b + h * lay.db_h + offs_l * lay.db_l, d.to(t.dt_buf.dtype.element_ty),
             mask=win_l & (offs_l < tl.where(app_dt, lay.L, 0)))


@triton.jit
def _shared_appends(b, t, io, lay, k):
    """A flushing row's window dt (every head) and B (every group) at slots ``0 .. T-1``, by the row's
    last program (the others have read the slots they overwrite)."""
    offs_t = tl.arange(0, k.BLOCK_T)
    mt = offs_t < io.T
    offs_h = tl.arange(0, k.BLOCK_H)
    mh = offs_h < lay.H
    dr = tl.load(t.dt + b * io.dt_b + offs_t[:, None] * io.dt_t + offs_h[None, :] * io.dt_h,
                 mask=mt[:, None] & mh[None, :], other=0.0)
    dtb = 0.0
    if k.HAS_DT_BIAS:
        dtb = tl.load(t.dt_bias + offs_h * io.dt_bias, mask=mh, other=0.0).to(tl.float32)[None, :]
    d = process_dt(dr, dtb, k)
    tl.store(t.dt_buf + b * lay.db_b + offs_h[None, :] * lay.db_h + offs_t[:, None] * lay.db_l,
             d.to(t.dt_buf.dtype.element_ty), mask=mt[:, None] & mh[None, :])
    # B: rows (group, token) of one tile
    offs_r = tl.arange(0, k.BLOCK_G * k.BLOCK_T)
    gg = offs_r // k.BLOCK_T
    tt = offs_r % k.BLOCK_T
    mr = (gg < lay.G) & (tt < io.T)
    offs_n = tl.arange(0, k.BLOCK_N)
    for n0 in range(0, lay.N, k.BLOCK_N):
        nn = n0 + offs_n
        m2 = mr[:, None] & (nn < lay.N)[None, :]
        bv = tl.load(t.B + b * io.B_b + gg[:, None] * io.B_g + tt[:, None] * io.B_t + nn[None, :] * io.B_n, mask=m2,
                     other=0.0)
        tl.store(t.B_buf + b * lay.Bb_b + gg[:, None] * lay.Bb_g + tt[:, None] * lay.Bb_l + nn[None, :] * lay.Bb_n,
                 bv.to(t.B_buf.dtype.element_ty), mask=m2)


@triton.jit
def _verify_program(t, io, lay, k):
    """One verify step of one program (module notes)."""
    pid = tl.program_id(0)
    pb = pid % lay.n_pb
    r = pid // lay.n_pb
    hc = r % lay.n_hc
    r = r // lay.n_hc
    g = r % lay.G
    b = (r // lay.G).to(tl.int64)
    offs_p = pb * k.BLOCK_P + tl.arange(0, k.BLOCK_P)
    mask_p = offs_p < lay.P
    h0 = g * lay.HPG + hc * lay.HC
    nh = tl.minimum(lay.HC, lay.HPG - hc * lay.HC)
    offs_n = tl.arange(0, k.BLOCK_N)
    offs_l = tl.arange(0, k.BLOCK_L)
    NT = (lay.N + k.BLOCK_N - 1) // k.BLOCK_N  # (a constant)
    total = nh * NT
    # everything that does not depend on the cursor goes out before it: the first pair's tiles (the
    # first head's checkpoint tile, ring x and dt over every slot) and the group's ring B and C
    s_t, sc_t, xr_t, dtr_t, a_t, dtb_t, dco_t = _pair_loads(b, h0, offs_n, 1, offs_p, mask_p, t, io, lay, k)
    br0 = _ring_B(b, g, offs_n, t, lay, k)
    ct0 = _window_C(b, g, offs_n, t, io, lay, k)
    cur_ptr = t.cursor + b * io.cur
    if k.ON_CURSOR:
        c = cursor_of_word(tl.load(cur_ptr))
    else:
        c = tl.load(cur_ptr)
    if c < 0:  # idle row: nothing written (but zeros into a freshly allocated out); the loads are dropped
        if k.ZERO_IDLE:
            offs_t = tl.arange(0, k.BLOCK_T)
            for i in range(0, nh):
                tl.store(t.out + b * io.out_b + offs_t[:, None] * io.out_t + (h0 + i) * io.out_h
                         + offs_p[None, :] * io.out_p, tl.zeros([k.BLOCK_T, k.BLOCK_P], t.out.dtype.element_ty),
                         mask=(offs_t < io.T)[:, None] & mask_p[None, :])
        return

    flush = c + io.T > lay.L
    s = tl.where(flush, 0, c)  # the window's first slot
    ring_l = offs_l < c  # ring entries read (all of them: the fold's, or the history's)
    hist_l = offs_l < s  # ring entries the outputs see
    win_l = (offs_l >= s) & (offs_l < s + io.T)
    wl_t = _window_loads(b, h0, s, win_l, 1, offs_p, mask_p, t, io, lay, k)
    bc = _window_BC(b, g, s, (hc == 0) & (pb == 0) & (flush == 0), br0, ct0, offs_l, hist_l, win_l, t, io, lay, k)

    s0c = tl.zeros([k.BLOCK_T, k.BLOCK_P], dtype=tl.float32)
    for it in range(0, total):
        i = it // NT
        kt = it - i * NT
        h = h0 + i
        nn = kt * k.BLOCK_N + offs_n
        # the next pair's tiles, in flight while this one computes
        i1 = (it + 1) // NT
        s_n, sc_n, xr_n, dtr_n, a_n, dtb_n, dco_n = _pair_loads(b, h0 + i1, (it + 1 - i1 * NT) * k.BLOCK_N + offs_n,
                                                                total - it - 1, offs_p, mask_p, t, io, lay, k)
        wl_n = _window_loads(b, h0 + i1, s, win_l, total - it - 1, offs_p, mask_p, t, io, lay, k)
        xr = tl.where(ring_l[:, None], xr_t, 0.0).to(tl.float32)
        dtr = tl.where(ring_l, dtr_t, 0.0).to(tl.float32)
        if NT == 1:
            ct = ct0
        else:
            ct = _window_C(b, g, nn, t, io, lay, k)
        if flush:
            s_t, sc_t = _fold_tile(s_t, sc_t, _ring_B(b, g, nn, t, lay, k), b, h, nn, offs_p, mask_p, a_t, ring_l,
                                   xr, dtr, t, io, lay, k)
        s0c += _s0_products(ct, s_t, sc_t, k)
        if kt == NT - 1:  # the head's last tile: its outputs and appends
            _head_outputs(b, h, s, flush, pb, s0c, bc, xr, dtr, wl_t, dtb_t, dco_t, a_t, offs_l, hist_l, win_l,
                          offs_p, mask_p, t, io, lay, k)
        s0c = tl.where((tl.zeros([k.BLOCK_T, k.BLOCK_P], dtype=tl.int32) + kt) == NT - 1, 0.0, s0c)
        s_t, sc_t, xr_t, dtr_t, a_t, dtb_t, dco_t, wl_t = s_n, sc_n, xr_n, dtr_n, a_n, dtb_n, dco_n, wl_n

    # every program arrives once its reads have returned (the barrier); the row's last one writes a
    # flushing row's shared appends and the next cursor (which clears a count on the cursor word)
    tl.debug_barrier()
    if k.ON_CURSOR:
        arrived = count_arrival(cur_ptr, c, "relaxed")
    else:
        arrived = tl.atomic_add(t.arrivals + b, 1, sem="relaxed")
    if arrived == lay.G * lay.n_hc * lay.n_pb - 1:
        if flush:
            _shared_appends(b, t, io, lay, k)
        tl.store(cur_ptr, (s + io.T).to(t.cursor.dtype.element_ty))
        if not k.ON_CURSOR:
            tl.store(t.arrivals + b, 0)


@triton.jit
def verify_kernel(t, io, lay: tl.constexpr, k: tl.constexpr):
    """One verify step (module notes); the layout compiled in."""
    _verify_program(t, io, lay, k)
