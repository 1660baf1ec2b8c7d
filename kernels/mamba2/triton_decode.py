"""Triton kernel of the Mamba-2 ReplaySSM decode step (semantics: ``reference.py``).

One launch per step (default). Each program owns one row ``b``, one group ``g``, a chunk
of ``HC`` consecutive heads of that group and a block of ``BLOCK_P`` head-dim lanes. It
reads the row's cursor ``c`` on the device and takes one of two routes:

* **output-only** (``0 <= c < L - 1``): ``B_j . C`` for the ``c`` buffered entries and the
  current token is computed once per program (once per group when a program holds the
  whole group), then for each head ``y = abar (S0 . C) + sum_j w_j (B_j . C) x_j``, where
  ``S0 . C`` reduces the checkpoint tile over the state dim and never forms the state. The
  checkpoint is only read. The next head's tile and buffer window are loaded while the
  current head is computed.
* **state-and-output** (flush, ``c == L - 1``): ``S = abar S0 + X^T diag(w) B`` with a
  ``tl.dot`` over the window (the ``L - 1`` buffered entries plus the current token;
  ``tf32x3`` for fp32 operands, the 16-bit type when checkpoint and buffers are 16-bit), in
  ``BLOCK_NF``-column tiles walked as one loop over (head, tile) pairs that loads the next
  pair before computing the current one; stored as the new checkpoint in the state dtype,
  ``y`` is read from the fp32 ``S``. With ``flush_fma`` (the default up to batch 4 with an fp32
  checkpoint and L <= 16) the window update is one rank-1 fp32 update per slot instead
  (``_flush_heads`` with ``FMA``): no ``tl.dot``, so any ``BLOCK_P`` and fewer registers; with
  one warp its tile spans the state dim, so a program's first head flushes from the early loads.

Both routes append the current ``(x, dt, B)`` at slot ``c``: ``x`` by every program for its
own lanes, ``dt`` by the program of lane block 0 of each head, ``B`` by one program per
(row, group). A program only ever reads slots ``j < c`` and writes slot ``c``, so no load
can alias a store of the same launch.

The cursor advance needs every program of a row to have read ``c`` first. Each program of
an active row arrives (``atomic_add`` after a CTA barrier) right after reading ``c``; the last
one to arrive writes ``(c + 1) % L`` at its end. With ``advance="atomic"`` (the default) the
arrivals are counted on a separate per-row counter, which the last program resets to zero;
with ``advance="cursor"`` on the cursor word itself (``kernels/cursor.py``: the count rides
above the cursor's low byte and the last program's store clears it). The cursor word costs no
second trip to memory when cold, but there every program's cursor read queues behind the
other programs' atomics on the same line: H200, L=16 whole cycles, same run, batch 1 with an
fp32 checkpoint 1.05x slower on the Nemotron shapes and 1.38x on Mamba2-2.7B (320 programs;
1.01-1.07x at batch 4), within 0.3% at batch 32-256 and 1.04x faster with a bf16 checkpoint at
batch 1 on the Nemotron shapes (``examples/benchmarks/results/cursor_advance_h200_2026-12-02.md``);
in 64 layers stepped in model order with the L2 evicted between layers the kernel took the same
time either way (``mamba2_in_model_h200_2026-12-02.md``). So the counter stays the default.
The arrival is a relaxed atomic (``advance_sem``): every thread has branched on ``c`` (the
idle-row exit) before the barrier, so its read has returned before the atomic
is issued, and the last program's stores depend on the atomic's result; acq_rel ordering
made every later memory operation of the program wait for the atomic (H200, whole cycle,
same run: batch 1 1.06-1.08x faster relaxed, batch 8 1.07-1.10x, batch 32 1.02-1.04x, batch
256 1.004-1.01x; ``examples/benchmarks/results/mamba2_advance_sem_h200_2026-12-01.md``).
The counter is an int32 vector, zero between launches, passed as ``arrivals``
(patched models keep one per cache, shared by its layers, which run one after the other, so it
stays in the L2 from layer to layer); without it, one internal counter per device is shared
by every call, and calls on concurrent streams must then not overlap. ``advance="kernel"``
runs a separate tiny launch instead. ``"cursor"`` falls back to ``"atomic"`` for cursors that are not
int32 or buffers longer than 127.

With ``order="flush_first"`` (the default from batch 32) each program finds its row from all the
rows' cursors, so that the flush rows' programs run first; no row's cursor may then move before
every program has mapped itself, so every program (idle rows' too) arrives at one launch-wide count
(``arrivals[0]``) and the last one moves every active row's cursor (``_advance_all_if_last``; H200:
rows at staggered cursors 1.02-1.40x faster at batch 32-256,
``examples/benchmarks/results/mamba2_flush_first_h200_2026-12-02.md``).

``route="split"`` runs the two routes as two launches: first a persistent flush launch
(``_mamba2_flush_kernel``: a few programs per multiprocessor share the flush rows' work
items, found on the device from the cursors), then the output-only launch, from which
flush rows exit early. On the H200 (batch 256) it was slower than the fused launch both
with all rows flushing together and with staggered cursors (bf16 checkpoint, staggered:
290 µs fused vs 304-318 split), so the fused launch stays the default; so does it against a flush launch that is the
replay kernel specialised to the flush route (``flush=dict(persistent=False)``, measured
2026-11-30). Neither variant syncs with the host, so a
whole step can be captured in a CUDA graph. Default block sizes (``replay_config``) come
from H200 measurements (examples/benchmarks/results/). With ``early_load`` (the default)
every load of a program's first head, its constants (A, dt_bias, D) included, is issued before
the cursor is known (the flush route starts from those tiles when one flush tile spans the state
dim). Loads after the branch on the cursor wait for it: the compiler does not hoist them above it
(H200, batch 1, whole cycle, same run: the constants loaded early made Mamba2-2.7B with an fp32
checkpoint 1.057x and the Super shape with a bf16 one 1.086x faster;
``examples/benchmarks/results/mamba2_head_constants_h200_2026-12-02.md``).

The program (``_replay_program``) is launched through one of two kernels: ``_mamba2_replay_kernel``
takes the sizes and the strides of the checkpoint and of the buffers as ``tl.constexpr`` (they fold
into the address arithmetic; one compile per layer shape), ``_mamba2_replay_kernel_dyn`` as runtime
arguments (``specialize=False``). Specializing changes register allocation and scheduling, not the
bytes moved, and which is faster depends on the case (``replay_config`` notes; H200, against the
runtime kernel of before: batch 1 1.01-1.07x, batch 256 1.01-1.02x with the defaults;
``examples/benchmarks/results/mamba2_constexpr_h200_2026-12-02.md``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..backend import num_sms
from ..cursor import advance_cursor_triton, count_arrival, cursor_of_word, cursor_word_counts_arrivals
from ..persistent import FLUSH_ROWS, flush_first_row, flush_row_chunks, flush_row_prefix, nth_flush_row

__all__ = ["mamba2_replay_decode_triton", "launch_mamba2_replay_decode", "make_replay_config", "replay_config",
           "replay_knobs", "REPLAY_KNOBS", "check_arrivals", "replay_kernel_constexprs", "uses_lowp_dot",
           "flush_first_block"]


@triton.jit
def _softplus(d):
    """softplus(d) = log1p(exp(d)) with identity above 20 (torch's threshold), accurate for small values."""
    u = tl.exp(-tl.abs(d))
    v = 1.0 + u
    # log1p(u) via log(v) * u / (v - 1): exact to a few ulp even when u << 1.
    lp = tl.where(v == 1.0, u, tl.log(v) * (u / tl.where(v == 1.0, 1.0, v - 1.0)))
    sp = tl.maximum(d, 0.0) + lp
    return tl.where(d > 20.0, d, sp)


@triton.jit
def _window_weights(dtw, d, cur_l, a_h):
    """Put the current dt at slot c; weights w_j = dt_j exp(A (Pcum_c - Pcum_j)) and abar = exp(A Pcum_c)."""
    dtw = tl.where(cur_l, d, dtw.to(tl.float32))
    pcum = tl.cumsum(dtw, 0)
    p_c = tl.sum(tl.where(cur_l, pcum, 0.0), 0)
    w = dtw * tl.exp(tl.minimum(a_h * (p_c - pcum), 0.0))
    abar = tl.exp(tl.minimum(a_h * p_c, 0.0))
    return w, abar


@triton.jit
def _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h, ok, HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr):
    """Head ``h``'s ``(A, dt_bias, D)`` as fp32 scalars (0 where absent or ``ok`` is false), loaded
    together so that a caller can issue them early (before the cursor, or with the next head's tiles)."""
    a_h = tl.load(A_ptr + h * sA, mask=ok, other=0.0).to(tl.float32)
    dtb = 0.0
    if HAS_DT_BIAS:
        dtb = tl.load(dtbias_ptr + h * sdtb, mask=ok, other=0.0).to(tl.float32)
    dco = 0.0
    if HAS_D:
        dco = tl.load(D_ptr + h * sD, mask=ok, other=0.0).to(tl.float32)
    return a_h, dtb, dco


@triton.jit
def _process_dt(d_raw, dtb, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    d = d_raw.to(tl.float32)
    if HAS_DT_BIAS:
        d += dtb
    if DT_SOFTPLUS:
        d = _softplus(d)
    return d


@triton.jit
def _row_pointers(b, g, c, offs_p, mask_p, x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr,
                  z_ptr, out_ptr, sx_b, sdt_b, sB_b, sB_g, sC_b, sC_g, ss_b, sxb_b, sxb_l, sxb_p, sdb_b, sBb_b, sBb_g,
                  sz_b, so_b, BLOCK_L: tl.constexpr):
    """Window slots (buffered ``j < c``, current ``j == c``) and the row's base pointers."""
    offs_l = tl.arange(0, BLOCK_L)
    valid_l = offs_l < c  # buffered entries of this row
    cur_l = offs_l == c  # the current token's slot
    x_rel = offs_l[:, None] * sxb_l + offs_p[None, :] * sxb_p  # (BLOCK_L, BLOCK_P) window
    mx = valid_l[:, None] & mask_p[None, :]
    return (offs_l, valid_l, cur_l, xbuf_ptr + b * sxb_b, Bbuf_ptr + b * sBb_b + g * sBb_g, B_ptr + b * sB_b + g * sB_g,
            C_ptr + b * sC_b + g * sC_g, x_ptr + b * sx_b, state_ptr + b * ss_b, dtbuf_ptr + b * sdb_b,
            dt_ptr + b * sdt_b, z_ptr + b * sz_b, out_ptr + b * so_b, x_rel, mx)


@triton.jit
def _head_output_and_append(y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, z_row, sz_h, sz_p, o_row, so_h, so_p,
                            out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row, sdb_h, sdb_l, dtbuf_ptr,
                            HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """Finish head ``h``: ``y += D x`` (``dco`` = the head's D), ``y *= silu(z)``, store ``y``; append
    the current ``x`` (already in the buffer dtype, ``xcb``) at slot ``c``, and ``dt`` from lane block 0."""
    if HAS_D:
        y += dco * xc.to(tl.float32)
    if HAS_Z:
        zv = tl.load(z_row + h * sz_h + offs_p * sz_p, mask=mask_p, other=0.0).to(tl.float32)
        y = y * (zv * tl.sigmoid(zv))
    tl.store(o_row + h * so_h + offs_p * so_p, y.to(out_ptr.dtype.element_ty), mask=mask_p)
    tl.store(xb_row + h * sxb_h + c * sxb_l + offs_p * sxb_p, xcb, mask=mask_p)
    if pb == 0:
        tl.store(db_row + h * sdb_h + c * sdb_l, d.to(dtbuf_ptr.dtype.element_ty))


@triton.jit
def _append_B(B_row, sB_n, Bb_row, sBb_l, sBb_n, Bbuf_ptr, c, N, BLOCK_N: tl.constexpr):
    """Append the current ``B`` of one (row, group) at slot ``c`` (nobody reads slot c this step)."""
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(0, N, BLOCK_N):
        nn = n0 + offs_n
        mn = nn < N
        bcur = tl.load(B_row + nn * sB_n, mask=mn, other=0.0)
        tl.store(Bb_row + c * sBb_l + nn * sBb_n, bcur.to(Bbuf_ptr.dtype.element_ty), mask=mn)


@triton.jit
def _fma_window_update(s0, bcur, d, xcb, a_h, h, offs_p, mask_p, nn, mn, db_row, sdb_h, sdb_l, xb_row, sxb_h, sxb_l,
                       sxb_p, Bb_row, sBb_l, sBb_n, Bbuf_ptr, L, BLOCK_P: tl.constexpr, BLOCK_NF: tl.constexpr,
                       BLOCK_L: tl.constexpr):
    """One flush tile by rank-1 fp32 updates: ``abar * s0 + sum_j w_j x_j B_j^T`` over the whole
    window (buffered slots ``0 .. L - 2`` and the current token, ``xcb`` / ``bcur``, weight ``d``).
    s0: (BLOCK_P, BLOCK_NF) fp32; bcur: the current B over ``nn`` (any dtype, rounded to the
    buffer's). The weights are built walking the slots from ``L - 2`` down to 0 with a running sum
    of the later dt's: ``w_j = dt_j exp(A sum_{r>j} dt_r)``, ``abar = exp(A sum_r dt_r)``."""
    bc = bcur.to(Bbuf_ptr.dtype.element_ty).to(tl.float32)
    upd = (d * xcb.to(tl.float32))[:, None] * bc[None, :]  # the current token: weight dt_c, no decay
    later = d  # sum of the dt's of the slots after j
    for jj in tl.static_range(BLOCK_L - 1):
        j = BLOCK_L - 2 - jj
        # a buffered slot? (slots past the window read nothing and weigh 0; vector masks:
        # the interpreter mis-types bool & 0-d bool)
        ok = (tl.zeros([], dtype=tl.int32) + j) < L - 1
        okp = (tl.zeros([BLOCK_P], dtype=tl.int32) + j) < L - 1
        okn = (tl.zeros([BLOCK_NF], dtype=tl.int32) + j) < L - 1
        dj = tl.load(db_row + h * sdb_h + j * sdb_l, mask=ok, other=0.0).to(tl.float32)
        xj = tl.load(xb_row + h * sxb_h + j * sxb_l + offs_p * sxb_p, mask=mask_p & okp, other=0.0)
        bj = tl.load(Bb_row + j * sBb_l + nn * sBb_n, mask=mn & okn, other=0.0)
        wj = dj * tl.exp(tl.minimum(a_h * later, 0.0))
        upd += (wj * xj.to(tl.float32))[:, None] * bj.to(tl.float32)[None, :]
        later += dj
    abar = tl.exp(tl.minimum(a_h * later, 0.0))
    return abar * s0 + upd


@triton.jit
def _flush_heads(
    b, g, h0, nh, pb, c,
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, A_ptr, dtbias_ptr, D_ptr, z_ptr, out_ptr,
    P, N, L,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sxb_b, sxb_h, sxb_l, sxb_p,
    sdb_b, sdb_h, sdb_l,
    sBb_b, sBb_g, sBb_l, sBb_n,
    sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_LOWP: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_NF: tl.constexpr, BLOCK_L: tl.constexpr,
    s_e, bw_e, bc_e, cv_e, xw_e, dtw_e, xc_e, dr_e, a_e, dtb_e, dco_e, FROM_EARLY: tl.constexpr,
    FMA: tl.constexpr,
):
    """State-and-output route for heads ``h0 .. h0 + nh - 1`` of row ``b`` (group ``g``),
    head-dim lanes of block ``pb``, at cursor ``c``: builds ``S = abar S0 + X^T diag(w) B``
    over the window (buffered entries and the current token) with a ``tl.dot`` in
    ``BLOCK_NF``-column tiles, stores it as the new checkpoint, writes ``y`` and appends
    ``x`` (and ``dt`` from lane block 0) at slot ``c``. FROM_EARLY (early loads, and one flush
    tile spans the state dim: ``BLOCK_NF == BLOCK_N >= N``): the first head's tiles are the ones the caller loaded before the cursor was known
    (``s_e`` .. ``dr_e``, window loads bounded by L: slot ``c = L - 1`` is replaced by the
    current token below, slots past L are zeros), instead of loading them again.

    FMA: the window update as rank-1 fp32 updates, one per window slot, instead of the
    ``tl.dot`` (same results and appends): any ``BLOCK_P`` (the dot needs 16 or more), fp32
    products for every operand dtype, no operand layout changes, fewer registers
    (``_fma_window_update``). With FROM_EARLY the first head's checkpoint tile, B, C, x, dt
    and constants are the early ones (the window slots are loaded one by one, as always)."""
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    (offs_l, valid_l, cur_l, xb_row, Bb_row, B_row, C_row, x_row, st_row, db_row, dt_row, z_row, o_row, x_rel,
     mx) = _row_pointers(b, g, c, offs_p, mask_p, x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr,
                         Bbuf_ptr, z_ptr, out_ptr, sx_b, sdt_b, sB_b, sB_g, sC_b, sC_g, ss_b, sxb_b, sxb_l, sxb_p,
                         sdb_b, sBb_b, sBb_g, sz_b, so_b, BLOCK_L)
    if FMA:
        offs_nf = tl.arange(0, BLOCK_NF)
        i0 = 0
        if FROM_EARLY:
            # the first head's only tile from the early loads (no second round trip for it)
            d = _process_dt(dr_e, dtb_e, HAS_DT_BIAS, DT_SOFTPLUS)
            xcb = xc_e.to(xbuf_ptr.dtype.element_ty)
            mn = offs_nf < N
            s_ptrs = st_row + h0 * ss_h + offs_p[:, None] * ss_p + offs_nf[None, :] * ss_n
            s_new = _fma_window_update(s_e.to(tl.float32), bc_e, d, xcb, a_e, h0, offs_p, mask_p, offs_nf, mn,
                                       db_row, sdb_h, sdb_l, xb_row, sxb_h, sxb_l, sxb_p, Bb_row, sBb_l, sBb_n,
                                       Bbuf_ptr, L, BLOCK_P, BLOCK_NF, BLOCK_L)
            tl.store(s_ptrs, s_new.to(state_ptr.dtype.element_ty), mask=mask_p[:, None] & mn[None, :])
            acc_y = tl.sum(s_new * cv_e.to(tl.float32)[None, :], 1)
            _head_output_and_append(acc_y, h0, c, pb, xc_e, xcb, d, dco_e, offs_p, mask_p, z_row, sz_h, sz_p,
                                    o_row, so_h, so_p, out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row, sdb_h, sdb_l,
                                    dtbuf_ptr, HAS_D, HAS_Z)
            i0 = 1
        for i in range(i0, nh):
            h = h0 + i
            a_h, dtb, dco = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h, True, HAS_DT_BIAS, HAS_D)
            d = _process_dt(tl.load(dt_row + h * sdt_h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
            xc = tl.load(x_row + h * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
            xcb = xc.to(xbuf_ptr.dtype.element_ty)
            acc_y = tl.zeros([BLOCK_P], dtype=tl.float32)
            for n0 in range(0, N, BLOCK_NF):
                nn = n0 + offs_nf
                mn = nn < N
                m2 = mask_p[:, None] & mn[None, :]
                s_ptrs = st_row + h * ss_h + offs_p[:, None] * ss_p + nn[None, :] * ss_n
                s0 = tl.load(s_ptrs, mask=m2, other=0.0).to(tl.float32)
                cv = tl.load(C_row + nn * sC_n, mask=mn, other=0.0).to(tl.float32)
                bcur = tl.load(B_row + nn * sB_n, mask=mn, other=0.0)
                s_new = _fma_window_update(s0, bcur, d, xcb, a_h, h, offs_p, mask_p, nn, mn, db_row, sdb_h, sdb_l,
                                           xb_row, sxb_h, sxb_l, sxb_p, Bb_row, sBb_l, sBb_n, Bbuf_ptr, L, BLOCK_P,
                                           BLOCK_NF, BLOCK_L)
                tl.store(s_ptrs, s_new.to(state_ptr.dtype.element_ty), mask=m2)
                acc_y += tl.sum(s_new * cv[None, :], 1)
            _head_output_and_append(acc_y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, z_row, sz_h, sz_p,
                                    o_row, so_h, so_p, out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row, sdb_h, sdb_l,
                                    dtbuf_ptr, HAS_D, HAS_Z)
    else:
        # ---------------- state-and-output route (flush) ----------------
        # One loop over (head, state-dim tile) pairs; every load of the next pair (its
        # checkpoint tile, and the head's buffer window when the head changes) is issued
        # before the current pair is computed, so the tile loads overlap the tl.dot work.
        offs_nf = tl.arange(0, BLOCK_NF)
        NT = tl.cdiv(N, BLOCK_NF)
        total = nh * NT
        s_rel = offs_p[:, None] * ss_p + offs_nf[None, :] * ss_n
        b_rel = offs_l[:, None] * sBb_l + offs_nf[None, :] * sBb_n
        mb = valid_l[:, None]
        h = h0
        mn = offs_nf < N
        if FROM_EARLY:
            s_t = s_e
            bw_t = bw_e
            bc_t = bc_e
            cv_t = cv_e
            xw_t = xw_e
            dtw_t = dtw_e
            xc_t = xc_e
            dr_t = dr_e
        else:
            s_t = tl.load(st_row + h * ss_h + s_rel, mask=mask_p[:, None] & mn[None, :], other=0.0)
            bw_t = tl.load(Bb_row + b_rel, mask=mb & mn[None, :], other=0.0)
            bc_t = tl.load(B_row + offs_nf * sB_n, mask=mn, other=0.0)
            cv_t = tl.load(C_row + offs_nf * sC_n, mask=mn, other=0.0)
            xw_t = tl.load(xb_row + h * sxb_h + x_rel, mask=mx, other=0.0)
            dtw_t = tl.load(db_row + h * sdb_h + offs_l * sdb_l, mask=valid_l, other=0.0)
            xc_t = tl.load(x_row + h * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
            dr_t = tl.load(dt_row + h * sdt_h)
        acc_y = tl.zeros([BLOCK_P], dtype=tl.float32)
        for t in range(0, total):
            i = t // NT
            k = t - i * NT
            h = h0 + i
            nn = k * BLOCK_NF + offs_nf
            mn = nn < N
            # next pair's loads (masked off past the end)
            t1 = t + 1
            i1 = t1 // NT
            h1 = h0 + i1
            nn1 = (t1 - i1 * NT) * BLOCK_NF + offs_nf
            okp = (tl.zeros([BLOCK_P], dtype=tl.int32) + t1) < total
            okl = (tl.zeros([BLOCK_L], dtype=tl.int32) + t1) < total
            okn = (tl.zeros([BLOCK_NF], dtype=tl.int32) + t1) < total
            mn1 = (nn1 < N) & okn
            s_n = tl.load(st_row + h1 * ss_h + offs_p[:, None] * ss_p + nn1[None, :] * ss_n,
                          mask=(mask_p & okp)[:, None] & mn1[None, :], other=0.0)
            bw_n = tl.load(Bb_row + offs_l[:, None] * sBb_l + nn1[None, :] * sBb_n, mask=mb & mn1[None, :],
                           other=0.0)
            bc_n = tl.load(B_row + nn1 * sB_n, mask=mn1, other=0.0)
            cv_n = tl.load(C_row + nn1 * sC_n, mask=mn1, other=0.0)
            xw_n = tl.load(xb_row + h1 * sxb_h + x_rel, mask=mx & okp[None, :], other=0.0)
            dtw_n = tl.load(db_row + h1 * sdb_h + offs_l * sdb_l, mask=valid_l & okl, other=0.0)
            xc_n = tl.load(x_row + h1 * sx_h + offs_p * sx_p, mask=mask_p & okp, other=0.0)
            dr_n = tl.load(dt_row + h1 * sdt_h, mask=t1 < total, other=0.0)

            a_h, dtb, dco = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h, True, HAS_DT_BIAS, HAS_D)
            d = _process_dt(dr_t, dtb, HAS_DT_BIAS, DT_SOFTPLUS)
            w, abar = _window_weights(dtw_t, d, cur_l, a_h)
            xcb = xc_t.to(xbuf_ptr.dtype.element_ty)
            xw = tl.where(cur_l[:, None], xcb[None, :], xw_t)  # (BLOCK_L, BLOCK_P), buffer dtype
            bw = tl.where(cur_l[:, None], bc_t.to(Bbuf_ptr.dtype.element_ty)[None, :], bw_t).to(tl.float32)
            wb = w[:, None] * bw  # (BLOCK_L, BLOCK_NF)
            if DOT_LOWP:
                upd = tl.dot(tl.trans(xw), wb.to(xbuf_ptr.dtype.element_ty), out_dtype=tl.float32)
            else:
                upd = tl.dot(tl.trans(xw.to(tl.float32)), wb, input_precision=DOT_PREC, out_dtype=tl.float32)
            s_new = abar * s_t.to(tl.float32) + upd
            tl.store(st_row + h * ss_h + offs_p[:, None] * ss_p + nn[None, :] * ss_n,
                     s_new.to(state_ptr.dtype.element_ty), mask=mask_p[:, None] & mn[None, :])
            acc_y += tl.sum(s_new * cv_t.to(tl.float32)[None, :], 1)
            if k == NT - 1:  # the head's last tile: output and appends
                _head_output_and_append(acc_y, h, c, pb, xc_t, xcb, d, dco, offs_p, mask_p, z_row, sz_h, sz_p,
                                        o_row, so_h, so_p, out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row, sdb_h, sdb_l,
                                        dtbuf_ptr, HAS_D, HAS_Z)
            acc_y = tl.where((tl.zeros([BLOCK_P], dtype=tl.int32) + k) == NT - 1, 0.0, acc_y)
            s_t = s_n
            bw_t = bw_n
            bc_t = bc_n
            cv_t = cv_n
            xw_t = xw_n
            dtw_t = dtw_n
            xc_t = xc_n
            dr_t = dr_n


@triton.jit
def _advance_all_if_last(arrived, cur_all, offs_r, n_rows, cursor_ptr, s_cur, cnt_ptr, L):
    """Launch-wide cursor advance (``order="flush_first"``): the last program of the launch to
    arrive moves every active row's cursor on (from the cursors it mapped itself with) and clears
    the count."""
    if arrived == tl.num_programs(0) - 1:
        tl.store(cursor_ptr + offs_r * s_cur, ((cur_all + 1) % L).to(cursor_ptr.dtype.element_ty),
                 mask=(offs_r < n_rows) & (cur_all >= 0))
        tl.store(cnt_ptr, 0)


@triton.jit
def _replay_program(
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr,
    dtbias_ptr, D_ptr, z_ptr, out_ptr, cnt_ptr,
    P, N, L, G, HPG, HC, n_hc, n_pb,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sxb_b, sxb_h, sxb_l, sxb_p,
    sdb_b, sdb_h, sdb_l,
    sBb_b, sBb_g, sBb_l, sBb_n,
    s_cur, sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    ZERO_IDLE: tl.constexpr, ROUTE: tl.constexpr, ADVANCE: tl.constexpr, DOT_LOWP: tl.constexpr,
    DOT_PREC: tl.constexpr, EARLY_LOAD: tl.constexpr, ADV_SEM: tl.constexpr, FLUSH_FMA: tl.constexpr,
    ARRIVE_ON_CURSOR: tl.constexpr, FLUSH_FIRST_BB: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr, BLOCK_L: tl.constexpr,
):
    # FLUSH_FIRST_BB > 0 (``order="flush_first"``): the programs of the flush rows come first
    # (``flush_first_row``; FLUSH_FIRST_BB >= the batch, a power of two), and with ADVANCE the
    # arrivals are counted launch-wide at cnt_ptr[0]: every program (idle rows' too) arrives after
    # mapping itself from all the cursors, and the last one moves every active row's cursor.
    # ARRIVE_ON_CURSOR (with ADVANCE): arrivals are counted on the cursor word (``kernels/cursor.py``),
    # not at cnt_ptr; c is the word's low byte.
    # ROUTE 0: both routes (runtime branch per row); 1: output-only route only (flush rows
    # skip their work but still arrive for the cursor advance); 2: flush route only.
    # BLOCK_N >= N (resp. BLOCK_NF >= N): one state tile per head, and the next head's
    # tile (with its buffer window) is loaded while the current head is computed.
    pid = tl.program_id(0)
    n_row = G * n_hc * n_pb  # programs per row
    if FLUSH_FIRST_BB > 0:
        n_rows = tl.num_programs(0) // n_row
        b, cur_all, offs_r = flush_first_row(pid, n_row, cursor_ptr, s_cur, n_rows, L - 1, FLUSH_FIRST_BB)
        t = pid % n_row
        c = tl.load(cursor_ptr + b * s_cur)  # (an L2 hit: it was just read with the others)
    else:
        t = pid
        cur_all, offs_r, n_rows = 0, 0, 0
    pb = t % n_pb
    t = t // n_pb
    hc = t % n_hc
    t = t // n_hc
    g = t % G
    if FLUSH_FIRST_BB == 0:
        b = (t // G).to(tl.int64)
        c = tl.load(cursor_ptr + b * s_cur)
        if ARRIVE_ON_CURSOR:
            c = cursor_of_word(c)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    h0 = g * HPG + hc * HC
    nh = tl.minimum(HC, HPG - hc * HC)
    if EARLY_LOAD:
        # Every load of the output-only route's first head is issued before the cursor is
        # known (latency: small batches gain most, batch 256 ~1%). Window loads are bounded
        # by L, not by the cursor; stale slots are selected away once it is known (NaN there
        # is harmless).
        offs_n0 = tl.arange(0, BLOCK_N)
        mn0 = offs_n0 < N
        offs_l0 = tl.arange(0, BLOCK_L)
        in_l = offs_l0 < L
        s_early = tl.load(state_ptr + b * ss_b + h0 * ss_h + offs_p[:, None] * ss_p + offs_n0[None, :] * ss_n,
                          mask=mask_p[:, None] & mn0[None, :], other=0.0)
        cv_early = tl.load(C_ptr + b * sC_b + g * sC_g + offs_n0 * sC_n, mask=mn0, other=0.0)
        bcur_early = tl.load(B_ptr + b * sB_b + g * sB_g + offs_n0 * sB_n, mask=mn0, other=0.0)
        bw_early = tl.load(Bbuf_ptr + b * sBb_b + g * sBb_g + offs_l0[:, None] * sBb_l + offs_n0[None, :] * sBb_n,
                           mask=in_l[:, None] & mn0[None, :], other=0.0)
        xw_early = tl.load(xbuf_ptr + b * sxb_b + h0 * sxb_h + offs_l0[:, None] * sxb_l + offs_p[None, :] * sxb_p,
                           mask=in_l[:, None] & mask_p[None, :], other=0.0)
        dtw_early = tl.load(dtbuf_ptr + b * sdb_b + h0 * sdb_h + offs_l0 * sdb_l, mask=in_l, other=0.0)
        xc_early = tl.load(x_ptr + b * sx_b + h0 * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
        dr_early = tl.load(dt_ptr + b * sdt_b + h0 * sdt_h)
        # the first head's constants too: loads issued after the cursor branch would cost a
        # second memory round trip (the branch keeps the compiler from hoisting them)
        a_early, dtb_early, dco_early = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h0, True,
                                                        HAS_DT_BIAS, HAS_D)
    else:  # placeholders: the flush route loads its own tiles then
        s_early, bw_early, bcur_early, cv_early = 0, 0, 0, 0
        xw_early, dtw_early, xc_early, dr_early = 0, 0, 0, 0
        a_early, dtb_early, dco_early = 0.0, 0.0, 0.0

    if c < 0:
        # idle row: nothing written (except zeros into a freshly allocated out); with
        # EARLY_LOAD its first head was read and is discarded
        if ZERO_IDLE:
            for i in range(0, nh):
                h = h0 + i
                tl.store(out_ptr + b * so_b + h * so_h + offs_p * so_p,
                         tl.zeros([BLOCK_P], dtype=out_ptr.dtype.element_ty), mask=mask_p)
        if ADVANCE and FLUSH_FIRST_BB > 0:  # launch-wide count: idle rows' programs arrive too
            tl.debug_barrier()
            _advance_all_if_last(tl.atomic_add(cnt_ptr, 1, sem=ADV_SEM), cur_all, offs_r, n_rows, cursor_ptr, s_cur,
                                 cnt_ptr, L)
        return

    is_flush = c == L - 1
    if ROUTE == 2:
        if c != L - 1:
            return

    if ADVANCE:
        # Arrive as soon as c is read (every thread has branched on c above, so its read has
        # returned; see the module notes on ADV_SEM); the last program of the row to arrive
        # writes the new cursor at the end. With FLUSH_FIRST_BB the count is launch-wide (every
        # thread's cursors also went into the branch on the flush count that mapped the program).
        tl.debug_barrier()
        if FLUSH_FIRST_BB > 0:
            arrived = tl.atomic_add(cnt_ptr, 1, sem=ADV_SEM)
        elif ARRIVE_ON_CURSOR:
            arrived = count_arrival(cursor_ptr + b * s_cur, c, ADV_SEM)
        else:
            arrived = tl.atomic_add(cnt_ptr + b, 1, sem=ADV_SEM)

    do_work = True
    if ROUTE == 1:
        do_work = c != L - 1

    if do_work:
        (offs_l, valid_l, cur_l, xb_row, Bb_row, B_row, C_row, x_row, st_row, db_row, dt_row, z_row, o_row, x_rel,
         mx) = _row_pointers(b, g, c, offs_p, mask_p, x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr,
                             Bbuf_ptr, z_ptr, out_ptr, sx_b, sdt_b, sB_b, sB_g, sC_b, sC_g, ss_b, sxb_b, sxb_l, sxb_p,
                             sdb_b, sBb_b, sBb_g, sz_b, so_b, BLOCK_L)

        if ROUTE == 0:
            run_flush = is_flush
        elif ROUTE == 2:
            run_flush = True
        else:
            run_flush = False

        if run_flush:
            _flush_heads(
                b, g, h0, nh, pb, c,
                x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, A_ptr, dtbias_ptr, D_ptr,
                z_ptr, out_ptr, P, N, L,
                sx_b, sx_h, sx_p, sdt_b, sdt_h, sB_b, sB_g, sB_n, sC_b, sC_g, sC_n, ss_b, ss_h, ss_p, ss_n,
                sxb_b, sxb_h, sxb_l, sxb_p, sdb_b, sdb_h, sdb_l, sBb_b, sBb_g, sBb_l, sBb_n, sA, sdtb, sD,
                sz_b, sz_h, sz_p, so_b, so_h, so_p,
                HAS_DT_BIAS, HAS_D, HAS_Z, DT_SOFTPLUS, DOT_LOWP, DOT_PREC, BLOCK_P, BLOCK_NF, BLOCK_L,
                s_early, bw_early, bcur_early, cv_early, xw_early, dtw_early, xc_early, dr_early,
                a_early, dtb_early, dco_early,
                EARLY_LOAD and BLOCK_NF == BLOCK_N,  # the first head's tiles are loaded
                FLUSH_FMA,
            )
        else:
            # ---------------- output-only route ----------------
            # bc_j = B_j . C for the buffered entries and the current token (slot c), once per
            # program for all its heads.
            offs_n = tl.arange(0, BLOCK_N)
            bc = tl.zeros([BLOCK_L], dtype=tl.float32)
            if EARLY_LOAD:
                bw = tl.where(valid_l[:, None], bw_early, 0.0)
                bw = tl.where(cur_l[:, None], bcur_early.to(Bbuf_ptr.dtype.element_ty)[None, :], bw).to(tl.float32)
                bc += tl.sum(bw * cv_early.to(tl.float32)[None, :], 1)
            else:
                for n0 in range(0, N, BLOCK_N):
                    nn = n0 + offs_n
                    mn = nn < N
                    cvn = tl.load(C_row + nn * sC_n, mask=mn, other=0.0).to(tl.float32)
                    bw = tl.load(Bb_row + offs_l[:, None] * sBb_l + nn[None, :] * sBb_n,
                                 mask=valid_l[:, None] & mn[None, :], other=0.0)
                    bcur = tl.load(B_row + nn * sB_n, mask=mn, other=0.0).to(Bbuf_ptr.dtype.element_ty)
                    bw = tl.where(cur_l[:, None], bcur[None, :], bw).to(tl.float32)
                    bc += tl.sum(bw * cvn[None, :], 1)

            if BLOCK_N >= N:
                mn = offs_n < N
                m2 = mask_p[:, None] & mn[None, :]
                s_rel = offs_p[:, None] * ss_p + offs_n[None, :] * ss_n
                h = h0
                if EARLY_LOAD:
                    cv = cv_early.to(tl.float32)
                    s_t = s_early
                    xw_t = tl.where(mx, xw_early, 0.0)
                    dtw_t = tl.where(valid_l, dtw_early, 0.0)
                    xc_t = xc_early
                    dr_t = dr_early
                    a_t, dtb_t, dco_t = a_early, dtb_early, dco_early
                else:
                    cv = tl.load(C_row + offs_n * sC_n, mask=mn, other=0.0).to(tl.float32)
                    s_t = tl.load(st_row + h * ss_h + s_rel, mask=m2, other=0.0)
                    xw_t = tl.load(xb_row + h * sxb_h + x_rel, mask=mx, other=0.0)
                    dtw_t = tl.load(db_row + h * sdb_h + offs_l * sdb_l, mask=valid_l, other=0.0)
                    xc_t = tl.load(x_row + h * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
                    dr_t = tl.load(dt_row + h * sdt_h)
                    a_t, dtb_t, dco_t = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h, True,
                                                        HAS_DT_BIAS, HAS_D)
                for i in range(0, nh):
                    h = h0 + i
                    hn = h + 1
                    ok = (tl.zeros([], dtype=tl.int32) + i + 1) < nh
                    okp = (tl.zeros([BLOCK_P], dtype=tl.int32) + i + 1) < nh  # vector masks (the interpreter
                    okl = (tl.zeros([BLOCK_L], dtype=tl.int32) + i + 1) < nh  # mis-types bool & 0-d bool)
                    # next head's loads first, so they are in flight while this head computes
                    s_n = tl.load(st_row + hn * ss_h + s_rel, mask=m2 & okp[:, None], other=0.0)
                    xw_n = tl.load(xb_row + hn * sxb_h + x_rel, mask=mx & okp[None, :], other=0.0)
                    dtw_n = tl.load(db_row + hn * sdb_h + offs_l * sdb_l, mask=valid_l & okl, other=0.0)
                    xc_n = tl.load(x_row + hn * sx_h + offs_p * sx_p, mask=mask_p & okp, other=0.0)
                    dr_n = tl.load(dt_row + hn * sdt_h, mask=ok, other=0.0)
                    a_n, dtb_n, dco_n = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, hn, ok,
                                                        HAS_DT_BIAS, HAS_D)

                    acc = tl.sum(s_t.to(tl.float32) * cv[None, :], 1)  # S0 . C
                    d = _process_dt(dr_t, dtb_t, HAS_DT_BIAS, DT_SOFTPLUS)
                    w, abar = _window_weights(dtw_t, d, cur_l, a_t)
                    xcb = xc_t.to(xbuf_ptr.dtype.element_ty)
                    xw = tl.where(cur_l[:, None], xcb[None, :], xw_t).to(tl.float32)
                    y = abar * acc + tl.sum((w * bc)[:, None] * xw, 0)
                    _head_output_and_append(y, h, c, pb, xc_t, xcb, d, dco_t, offs_p, mask_p, z_row, sz_h,
                                            sz_p, o_row, so_h, so_p, out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row,
                                            sdb_h, sdb_l, dtbuf_ptr, HAS_D, HAS_Z)
                    a_t, dtb_t, dco_t = a_n, dtb_n, dco_n
                    s_t = s_n
                    xw_t = xw_n
                    dtw_t = dtw_n
                    xc_t = xc_n
                    dr_t = dr_n
            else:
                for i in range(0, nh):
                    h = h0 + i
                    dtw = tl.load(db_row + h * sdb_h + offs_l * sdb_l, mask=valid_l, other=0.0)
                    xc = tl.load(x_row + h * sx_h + offs_p * sx_p, mask=mask_p, other=0.0)
                    xw = tl.load(xb_row + h * sxb_h + x_rel, mask=mx, other=0.0)
                    acc = tl.zeros([BLOCK_P], dtype=tl.float32)
                    for n0 in range(0, N, BLOCK_N):
                        nn = n0 + offs_n
                        mn = nn < N
                        s0 = tl.load(st_row + h * ss_h + offs_p[:, None] * ss_p + nn[None, :] * ss_n,
                                     mask=mask_p[:, None] & mn[None, :], other=0.0).to(tl.float32)
                        cvn = tl.load(C_row + nn * sC_n, mask=mn, other=0.0).to(tl.float32)
                        acc += tl.sum(s0 * cvn[None, :], 1)
                    a_h, dtb, dco = _head_constants(A_ptr, sA, dtbias_ptr, sdtb, D_ptr, sD, h, True, HAS_DT_BIAS,
                                                    HAS_D)
                    d = _process_dt(tl.load(dt_row + h * sdt_h), dtb, HAS_DT_BIAS, DT_SOFTPLUS)
                    w, abar = _window_weights(dtw, d, cur_l, a_h)
                    xcb = xc.to(xbuf_ptr.dtype.element_ty)
                    xw = tl.where(cur_l[:, None], xcb[None, :], xw).to(tl.float32)
                    y = abar * acc + tl.sum((w * bc)[:, None] * xw, 0)
                    _head_output_and_append(y, h, c, pb, xc, xcb, d, dco, offs_p, mask_p, z_row, sz_h,
                                            sz_p, o_row, so_h, so_p, out_ptr, xb_row, sxb_h, sxb_l, sxb_p, db_row,
                                            sdb_h, sdb_l, dtbuf_ptr, HAS_D, HAS_Z)

        if (hc == 0) & (pb == 0):  # one program per (row, group) appends B
            _append_B(B_row, sB_n, Bb_row, sBb_l, sBb_n, Bbuf_ptr, c, N, BLOCK_N)

    if ADVANCE:
        if FLUSH_FIRST_BB > 0:
            _advance_all_if_last(arrived, cur_all, offs_r, n_rows, cursor_ptr, s_cur, cnt_ptr, L)
        else:
            if arrived == n_row - 1:
                tl.store(cursor_ptr + b * s_cur, ((c + 1) % L).to(cursor_ptr.dtype.element_ty))
                if not ARRIVE_ON_CURSOR:
                    tl.store(cnt_ptr + b, 0)


@triton.jit
def _mamba2_replay_kernel(
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr,
    dtbias_ptr, D_ptr, z_ptr, out_ptr, cnt_ptr,
    P: tl.constexpr, N: tl.constexpr, L: tl.constexpr, G: tl.constexpr, HPG: tl.constexpr, HC: tl.constexpr,
    n_hc: tl.constexpr, n_pb: tl.constexpr,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b: tl.constexpr, ss_h: tl.constexpr, ss_p: tl.constexpr, ss_n: tl.constexpr,
    sxb_b: tl.constexpr, sxb_h: tl.constexpr, sxb_l: tl.constexpr, sxb_p: tl.constexpr,
    sdb_b: tl.constexpr, sdb_h: tl.constexpr, sdb_l: tl.constexpr,
    sBb_b: tl.constexpr, sBb_g: tl.constexpr, sBb_l: tl.constexpr, sBb_n: tl.constexpr,
    s_cur, sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    ZERO_IDLE: tl.constexpr, ROUTE: tl.constexpr, ADVANCE: tl.constexpr, DOT_LOWP: tl.constexpr,
    DOT_PREC: tl.constexpr, EARLY_LOAD: tl.constexpr, ADV_SEM: tl.constexpr, FLUSH_FMA: tl.constexpr,
    ARRIVE_ON_CURSOR: tl.constexpr, FLUSH_FIRST_BB: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """One replay step; sizes and the strides of the checkpoint and of the buffers are compile-time
    constants (``specialize``, the default: fewer registers, instructions and kernel arguments)."""
    _replay_program(
        x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr, dtbias_ptr, D_ptr,
        z_ptr, out_ptr, cnt_ptr, P, N, L, G, HPG, HC, n_hc, n_pb, sx_b, sx_h, sx_p, sdt_b, sdt_h, sB_b, sB_g, sB_n,
        sC_b, sC_g, sC_n, ss_b, ss_h, ss_p, ss_n, sxb_b, sxb_h, sxb_l, sxb_p, sdb_b, sdb_h, sdb_l, sBb_b, sBb_g,
        sBb_l, sBb_n, s_cur, sA, sdtb, sD, sz_b, sz_h, sz_p, so_b, so_h, so_p, HAS_DT_BIAS, HAS_D, HAS_Z,
        DT_SOFTPLUS, ZERO_IDLE, ROUTE, ADVANCE, DOT_LOWP, DOT_PREC, EARLY_LOAD, ADV_SEM, FLUSH_FMA, ARRIVE_ON_CURSOR,
        FLUSH_FIRST_BB, BLOCK_P, BLOCK_N, BLOCK_NF, BLOCK_L,
    )


@triton.jit
def _mamba2_replay_kernel_dyn(
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr,
    dtbias_ptr, D_ptr, z_ptr, out_ptr, cnt_ptr,
    P, N, L, G, HPG, HC, n_hc, n_pb,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sxb_b, sxb_h, sxb_l, sxb_p,
    sdb_b, sdb_h, sdb_l,
    sBb_b, sBb_g, sBb_l, sBb_n,
    s_cur, sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    ZERO_IDLE: tl.constexpr, ROUTE: tl.constexpr, ADVANCE: tl.constexpr, DOT_LOWP: tl.constexpr,
    DOT_PREC: tl.constexpr, EARLY_LOAD: tl.constexpr, ADV_SEM: tl.constexpr, FLUSH_FMA: tl.constexpr,
    ARRIVE_ON_CURSOR: tl.constexpr, FLUSH_FIRST_BB: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """One replay step with sizes and strides as runtime arguments (``specialize=False``)."""
    _replay_program(
        x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr, dtbias_ptr, D_ptr,
        z_ptr, out_ptr, cnt_ptr, P, N, L, G, HPG, HC, n_hc, n_pb, sx_b, sx_h, sx_p, sdt_b, sdt_h, sB_b, sB_g, sB_n,
        sC_b, sC_g, sC_n, ss_b, ss_h, ss_p, ss_n, sxb_b, sxb_h, sxb_l, sxb_p, sdb_b, sdb_h, sdb_l, sBb_b, sBb_g,
        sBb_l, sBb_n, s_cur, sA, sdtb, sD, sz_b, sz_h, sz_p, so_b, so_h, so_p, HAS_DT_BIAS, HAS_D, HAS_Z,
        DT_SOFTPLUS, ZERO_IDLE, ROUTE, ADVANCE, DOT_LOWP, DOT_PREC, EARLY_LOAD, ADV_SEM, FLUSH_FMA, ARRIVE_ON_CURSOR,
        FLUSH_FIRST_BB, BLOCK_P, BLOCK_N, BLOCK_NF, BLOCK_L,
    )


@triton.jit
def _mamba2_flush_kernel(
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, cursor_ptr, A_ptr,
    dtbias_ptr, D_ptr, z_ptr, out_ptr,
    P, N, L, G, HPG, HC, n_hc, n_pb, row0, n_rows,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sxb_b, sxb_h, sxb_l, sxb_p,
    sdb_b, sdb_h, sdb_l,
    sBb_b, sBb_g, sBb_l, sBb_n,
    s_cur, sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_LOWP: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NF: tl.constexpr, BLOCK_L: tl.constexpr,
    BB: tl.constexpr,
):
    """Persistent flush launch of ``route="split"``: the programs share the work items
    (flush row, group, head chunk, lane block) of rows ``row0 .. row0 + n_rows - 1`` whose
    cursor is ``L - 1``, found on the device from the cursors (a prefix count). A step
    without flush rows costs one small load per program; flush work spreads over every
    program whether one row or all rows flush. The cursor is not advanced here."""
    csum, n_flush = flush_row_prefix(cursor_ptr, s_cur, row0, n_rows, L - 1, BB)
    per_row = G * n_hc * n_pb
    total = n_flush * per_row
    c = L - 1
    for w in range(tl.program_id(0), total, tl.num_programs(0)):
        rank = w // per_row
        rem = w - rank * per_row
        pb = rem % n_pb
        t = rem // n_pb
        hc = t % n_hc
        g = t // n_hc
        b = nth_flush_row(csum, rank, row0)
        h0 = g * HPG + hc * HC
        nh = tl.minimum(HC, HPG - hc * HC)
        _flush_heads(
            b, g, h0, nh, pb, c,
            x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, xbuf_ptr, dtbuf_ptr, Bbuf_ptr, A_ptr, dtbias_ptr, D_ptr,
            z_ptr, out_ptr, P, N, L,
            sx_b, sx_h, sx_p, sdt_b, sdt_h, sB_b, sB_g, sB_n, sC_b, sC_g, sC_n, ss_b, ss_h, ss_p, ss_n,
            sxb_b, sxb_h, sxb_l, sxb_p, sdb_b, sdb_h, sdb_l, sBb_b, sBb_g, sBb_l, sBb_n, sA, sdtb, sD,
            sz_b, sz_h, sz_p, so_b, so_h, so_p,
            HAS_DT_BIAS, HAS_D, HAS_Z, DT_SOFTPLUS, DOT_LOWP, DOT_PREC, BLOCK_P, BLOCK_NF, BLOCK_L,
            0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, False, False,
        )
        if (hc == 0) & (pb == 0):  # one item per (row, group) appends B
            _append_B(B_ptr + b * sB_b + g * sB_g, sB_n, Bbuf_ptr + b * sBb_b + g * sBb_g, sBb_l, sBb_n, Bbuf_ptr, c,
                      N, BLOCK_N)


# ----------------------------------------------------------------------------- host side

_COUNTERS: dict = {}
_COUNTER_KEEP: list = []  # never freed: a captured CUDA graph may still point at an old one


def check_arrivals(arrivals: torch.Tensor, n: int, device: torch.device) -> None:
    """Raise ``ValueError`` unless ``arrivals`` can count the arrivals of ``n`` rows on ``device``."""
    if arrivals.dtype != torch.int32 or arrivals.dim() != 1 or arrivals.numel() < n or arrivals.stride(0) != 1 \
            or arrivals.device != device:
        raise ValueError(f"arrivals must be a contiguous int32 vector of at least {n} entries on {device}; got "
                         f"{arrivals.dtype} {tuple(arrivals.shape)} stride {tuple(arrivals.stride())} on "
                         f"{arrivals.device}")


def _arrival_counter(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 per-row arrival counters on ``device`` (left at zero by every launch).

    Shared by all calls on the device; calls on concurrent streams must not overlap.
    """
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        size = max(4096, triton.next_power_of_2(n))
        buf = torch.zeros(size, dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
        _COUNTER_KEEP.append(buf)
    return buf


def _pow2(v: int) -> int:
    return triton.next_power_of_2(max(1, int(v)))


#: the ways a launch moves the cursors on (``make_replay_config``'s ``advance``)
ADVANCES = ("cursor", "atomic", "kernel", "none")


def _check_advance(advance: str) -> None:
    if advance not in ADVANCES:
        raise ValueError(f"advance must be 'cursor', 'atomic', 'kernel' or 'none'; got {advance!r}")


def make_replay_config(H: int, P: int, N: int, G: int, L: int, BLOCK_P: int, HC: int, BLOCK_N: int | None = None,
                       BLOCK_NF: int | None = None, num_warps: int = 4, num_stages: int = 1, route: str = "fused",
                       advance: str = "atomic", flush: dict | None = None, early_load: bool = False,
                       advance_sem: str = "relaxed", flush_fma: bool = False, specialize: bool = True,
                       order: str = "rows") -> dict:
    """A complete launch configuration from its free knobs.

    ``advance``: how the cursor moves on (``"atomic"``, the default: arrivals counted on a separate
    counter; ``"cursor"``: on the cursor word; ``"kernel"``: a launch of its own; module notes;
    ``"none"``: not at all, the caller moves the cursors, e.g. one cursor shared by several layers).

    ``advance_sem``: memory ordering of the in-kernel cursor arrival (``"relaxed"``, ``"release"``
    or ``"acq_rel"``; see the module notes).

    ``flush_fma``: the replay kernel's flush route builds the window update from rank-1 fp32
    updates instead of a ``tl.dot`` (``_flush_heads`` with ``FMA``); ``BLOCK_P`` may then be below 16.

    ``specialize``: the replay kernel with the sizes and the strides of the checkpoint and of the
    buffers as compile-time constants (``_mamba2_replay_kernel``); False: as runtime arguments
    (``_mamba2_replay_kernel_dyn``, same program). See ``replay_config`` for when each is faster.

    ``order``: which rows' programs the launch runs first. ``"rows"``: in row order. ``"flush_first"``
    (fused route only): the programs of the rows flushing this step first, so that their longer
    programs do not trail the launch when rows are at different cursors; every program reads all
    the cursors to find its row (``kernels/persistent.py``, batches up to ``FLUSH_ROWS``; larger
    ones run in row order), and the cursor advance counts arrivals launch-wide (``"cursor"``
    advance falls back to ``"atomic"``).

    ``flush``: knobs of the persistent flush launch of ``route='split'`` (``BLOCK_P``, ``HC``,
    ``BLOCK_NF``, ``num_warps``, ``num_stages``, ``programs_per_sm`` (default 4) or an absolute
    ``programs`` count, ``persistent`` (default True; False: the replay kernel specialised to the
    flush route, one program per work item, so the output launch carries no flush registers))."""
    _check_advance(advance)
    if advance_sem not in ("relaxed", "release", "acq_rel"):
        raise ValueError(f"advance_sem must be 'relaxed', 'release' or 'acq_rel'; got {advance_sem!r}")
    if order not in ("rows", "flush_first"):
        raise ValueError(f"order must be 'rows' or 'flush_first'; got {order!r}")
    if order == "flush_first" and route != "fused":
        raise ValueError(f"order='flush_first' needs route='fused'; got route={route!r}")
    HPG = H // G
    if BLOCK_N is None:
        BLOCK_N = max(16, min(_pow2(N), 256)) if N <= 256 else 128
    HC = max(1, min(int(HC), HPG))
    n_hc = triton.cdiv(HPG, HC)
    HC = triton.cdiv(HPG, n_hc)
    cfg = dict(BLOCK_P=int(BLOCK_P), BLOCK_N=int(BLOCK_N), BLOCK_NF=int(BLOCK_NF or min(BLOCK_N, 64)),
               BLOCK_L=max(16, _pow2(L)), HC=HC, n_hc=n_hc, n_pb=triton.cdiv(P, BLOCK_P), num_warps=int(num_warps),
               num_stages=int(num_stages), route=route, advance=advance, early_load=bool(early_load),
               advance_sem=advance_sem, flush_fma=bool(flush_fma), specialize=bool(specialize), order=order)
    if route == "split":
        f = dict(BLOCK_P=max(16, cfg["BLOCK_P"]), HC=HC, num_warps=num_warps, num_stages=num_stages,
                 BLOCK_NF=cfg["BLOCK_NF"])
        f.update(flush or {})
        fc = make_replay_config(H, P, N, G, L, f["BLOCK_P"], f["HC"], BLOCK_N, f["BLOCK_NF"], f["num_warps"],
                                f["num_stages"])
        cfg["flush"] = {k: fc[k] for k in ("BLOCK_P", "BLOCK_NF", "HC", "n_hc", "n_pb", "num_warps", "num_stages")}
        cfg["flush"]["programs_per_sm"] = int((flush or {}).get("programs_per_sm", 4))
        cfg["flush"]["programs"] = (flush or {}).get("programs")  # absolute count (tests), else per SM
        # persistent=False: the flush launch is the replay kernel specialised to the flush
        # route, one program per work item (non-flush rows exit after reading the cursor)
        cfg["flush"]["persistent"] = bool((flush or {}).get("persistent", True))
    # the replay kernel's flush route (fused, or split with a non-persistent flush launch)
    if route != "split":
        dot_p = None if flush_fma else cfg["BLOCK_P"]
    else:
        dot_p = None if cfg["flush"]["persistent"] or flush_fma else cfg["flush"]["BLOCK_P"]
    if dot_p is not None and dot_p < 16:
        raise ValueError(f"the flush route's tl.dot needs BLOCK_P >= 16; got {dot_p}")
    return cfg


# the free knobs of a launch configuration (keyword arguments of make_replay_config; "flush" aside)
REPLAY_KNOBS = ("BLOCK_P", "HC", "BLOCK_N", "BLOCK_NF", "num_warps", "num_stages", "route", "advance", "early_load",
                "advance_sem", "flush_fma", "specialize", "order")


def replay_knobs(cfg: dict) -> dict:
    """The free knobs of a configuration from ``make_replay_config`` / ``replay_config``, so that
    ``make_replay_config(H, P, N, G, L, **dict(replay_knobs(cfg), **changes))`` rebuilds it with
    some changed (derived values such as the program split follow)."""
    return {k: cfg[k] for k in REPLAY_KNOBS if k in cfg}


@functools.lru_cache(maxsize=1024)
def replay_config(Bt: int, H: int, P: int, N: int, G: int, L: int, state_bytes: int, act_bytes: int,
                  n_sm: int, interpret: bool = False) -> dict:
    """Default block sizes and program split for one call (pure function of shapes, no device work)."""
    HPG = H // G
    BLOCK_N = max(16, min(_pow2(N), 256)) if N <= 256 else 128
    # 32 lanes x 128 state columns per tile (16 KB at fp32): best on the H200 at batch 256.
    # Up to batch 4, 16 lanes (H200, batch 1, L=16, 2 warps: Nano-4B fp32 5.2 vs 7.4 µs
    # with 32 lanes and 4 warps, its P=80 wastes lanes in 32-lane blocks; Super and
    # Mamba2-2.7B within 1-3%).
    small = Bt <= 4
    BLOCK_P = 16 if small else max(16, min(_pow2(P), 4096 // BLOCK_N))
    n_pb = triton.cdiv(P, BLOCK_P)
    # Heads per program: enough programs for ~8 per SM, at most a group of fewer than 16 heads or
    # else 8, so that a flush row's programs (which walk their heads one after the other) stay
    # short when only some rows of the batch flush. H200, batch 256, L=16, same run, 8 against 16
    # heads: rows at staggered cursors (1/16 flushing every step) Super 1.06-1.07x, Mamba2-2.7B
    # 1.12x; all rows from cursor 0 Super 0.99-1.00x, Mamba2-2.7B 0.99x fp32 / 1.08x bf16; the
    # Nano-4B shape's 12-head groups lose with 6 (0.97-0.99x) and keep 12
    # (examples/benchmarks/results/mamba2_staggered_heads_h200_2026-12-02.md).
    HC = max(1, min(HPG if HPG < 16 else 8, (Bt * G * n_pb * HPG) // (8 * n_sm)))
    # Flush tiles of 64 state columns (halved for windows longer than 16).
    # Few warps per program from batch 5 too: the state-dim reductions then stay within a warp
    # and more programs fit per SM (H200, Super shape, L=16, whole cycle at batch 256: fp32
    # checkpoint 2 warps + 64-column flush tiles 309 vs 337 µs with 4 warps and 32 columns;
    # bf16 checkpoint 1 warp 171 vs 234 µs; same direction at batch 32-512 and for the
    # Nano-4B and Mamba2-2.7B shapes; examples/benchmarks/results/mamba2_launch_h200_2026-11-30.md).
    # One warp only with 16-bit operands: an fp32 flush tile spills there. Also up to batch 4
    # (H200, batch 1, L=16, whole cycle, same run: Super 1.024x, Nano-4B 1.023x, Mamba2-2.7B 1.019x;
    # results/mamba2_advance_sem_h200_2026-12-01.md).
    BLOCK_L = max(16, _pow2(L))
    lowp = state_bytes == 2 and act_bytes == 2
    BLOCK_NF = max(16, min(BLOCK_N, 64 * 16 // BLOCK_L))
    stages = 1
    warps = 1 if lowp else 2
    # One stage: with 16-bit operands two stages were 1.02-1.05x slower at batch 32-512 on all three
    # shapes (H200, L=16, whole cycle, same run). Sizes and buffer strides as compile-time constants
    # (``specialize``) everywhere but with 16-bit checkpoint and activations above batch 8, where the
    # runtime-argument kernel is faster (batch 32-512: 1.02-1.08x); fp32 checkpoint:
    # specialized 1.01-1.09x faster at every batch 1-512; 16-bit at batch 1-8: 1.00-1.07x
    # (results/mamba2_constexpr_h200_2026-12-02.md).
    specialize = not lowp or Bt <= 8
    # Up to batch 4 with an fp32 checkpoint: the flush route's window update as rank-1 fp32
    # updates instead of a tl.dot, which no longer spills with one warp; one warp per program,
    # or 4 when the grid fits one wave of 4-warp programs (three per multiprocessor by
    # registers). H200, batch 1, L=16, whole cycle, same run, against 2 warps and the dot:
    # Super 1.03x, Nano-4B 1.02x, Mamba2-2.7B (320 programs, 4 warps) 1.06x; batch 4 1.18-1.31x;
    # results/mamba2_batch1_h200_2026-12-01.md. Not for windows over 16 slots (L = 32: its
    # 32-column tiles each walk 31 slots; batch 1 Super 7.0 against 5.8 µs with the dot).
    flush_fma = small and not lowp and BLOCK_L <= 16
    if flush_fma:
        warps = 4 if Bt * G * triton.cdiv(HPG, HC) * n_pb <= 3 * n_sm else 1
        if warps == 1:
            # one flush tile spanning the state dim: the first head's flush starts from the early
            # loads, and each window slot's x and weight serve the whole row (H200, batch 1, L=16,
            # whole cycle, same run; results/mamba2_flush_tile_h200_2026-12-02.md)
            BLOCK_NF = BLOCK_N
    # From batch 32 the flush rows' programs run first (``order``): with the rows at staggered cursors
    # (serving; 1/L of them flush at each step) a step no longer waits for flush programs that start
    # last. H200, L=16, whole cycles, same run, against row order: staggered 1.06-1.28x faster at batch
    # 32, 1.15-1.40x at 64, 1.02-1.15x at 256; all rows from cursor 0 0.96-1.00x (one case 0.945x).
    # Batch 8 and 16 keep row order: 0.94-1.05x at 8; at 16 16-bit checkpoints lost both ways (0.86-0.93x)
    # (results/mamba2_flush_first_h200_2026-12-02.md).
    order = "flush_first" if Bt >= 32 else "rows"
    return make_replay_config(H, P, N, G, L, BLOCK_P, HC, BLOCK_N, BLOCK_NF, num_warps=warps, num_stages=stages,
                              early_load=True, flush_fma=flush_fma, specialize=specialize, order=order)


def uses_lowp_dot(state_dtype: torch.dtype, x_buf_dtype: torch.dtype, B_buf_dtype: torch.dtype) -> bool:
    """Whether the flush route's matrix product runs on 16-bit operands (``DOT_LOWP``): a 16-bit
    checkpoint and 16-bit rings of one dtype."""
    return state_dtype.itemsize == 2 and x_buf_dtype.itemsize == 2 and x_buf_dtype == B_buf_dtype


def flush_first_block(c: dict, n_rows: int, route: int) -> int:
    """``FLUSH_FIRST_BB`` of a launch over ``n_rows`` rows: 0 (row order) unless configuration ``c``
    asks for ``order="flush_first"`` on the fused route (``route`` 0) and the batch fits one block."""
    if c.get("order", "rows") != "flush_first" or route != 0 or n_rows > FLUSH_ROWS:
        return 0
    return _pow2(n_rows)


def replay_kernel_constexprs(c: dict, N: int, flags: dict, *, zero_idle: bool, route: int, advance: bool,
                             arrive_on_cursor: bool, n_rows: int) -> dict:
    """The compile-time arguments of ``_mamba2_replay_kernel`` (and ``_dyn``) for launch configuration
    ``c`` (``make_replay_config``), state size ``N`` and the layer's ``flags`` (HAS_DT_BIAS, HAS_D, HAS_Z,
    DT_SOFTPLUS, DOT_LOWP, DOT_PREC). ``route``: 0 fused, 1 output-only, 2 flush only. The one place
    that turns a configuration into kernel flags (the launcher and ``examples/benchmarks/offline_sass.py``)."""
    return dict(
        **flags, ZERO_IDLE=bool(zero_idle), ROUTE=route, ADVANCE=bool(advance),
        EARLY_LOAD=bool(c.get("early_load", False)) and c["BLOCK_N"] >= N,  # early loads cover the whole state dim
        ADV_SEM=c.get("advance_sem", "relaxed"), FLUSH_FMA=bool(c.get("flush_fma", False)),
        ARRIVE_ON_CURSOR=bool(arrive_on_cursor), FLUSH_FIRST_BB=flush_first_block(c, n_rows, route),
        BLOCK_P=c["BLOCK_P"], BLOCK_N=c["BLOCK_N"], BLOCK_NF=c["BLOCK_NF"], BLOCK_L=c["BLOCK_L"],
    )


def _interpreting() -> bool:
    from ..backend import triton_interpreter_on

    return triton_interpreter_on()


def _check(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, out):
    Bt, H, P = x.shape
    if state.shape[:3] != (Bt, H, P) or state.dim() != 4:
        raise ValueError(f"state must be (B, H, P, N) = ({Bt}, {H}, {P}, N); got {tuple(state.shape)}")
    N = state.shape[3]
    G = B.shape[1]
    if H % G != 0:
        raise ValueError(f"H={H} must be a multiple of G={G}")
    L = x_buf.shape[2]
    if x_buf.shape != (Bt, H, L, P) or dt_buf.shape != (Bt, H, L) or B_buf.shape != (Bt, G, L, N):
        raise ValueError("x_buf/dt_buf/B_buf must be (B,H,L,P)/(B,H,L)/(B,G,L,N)")
    if B.shape != (Bt, G, N) or C.shape != (Bt, G, N) or dt.shape != (Bt, H) or cursor.shape != (Bt,):
        raise ValueError("B, C must be (B,G,N); dt (B,H); cursor (B,)")
    if out is not None and out.shape != (Bt, H, P):
        raise ValueError("out must be (B, H, P)")
    return Bt, H, P, N, G, L


def launch_mamba2_replay_decode(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus,
                                out, zero_idle, route: str | None = None, advance: str | None = None, config=None,
                                arrivals: torch.Tensor | None = None):
    """Launch the kernel(s); writes ``out`` and the in-place tensors. No host sync.

    ``arrivals``: the arrival counters of ``advance="atomic"`` (int32, at least B entries, zero
    between launches, left at zero; one per row, or entry 0 alone, launch-wide, with
    ``order="flush_first"``); None uses one vector shared by every call on the device.
    """
    Bt, H, P, N, G, L = _check(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, out)
    if arrivals is not None:
        check_arrivals(arrivals, Bt, x.device)
    if Bt == 0:
        return
    interp = _interpreting()
    n_sm = num_sms(x.device.type, x.device.index)
    cfg = dict(config) if config is not None else replay_config(
        Bt, H, P, N, G, L, state.element_size(), x_buf.element_size(), n_sm, interp)
    route = route or cfg.get("route", "fused")
    advance = advance or cfg.get("advance", "atomic")
    _check_advance(advance)
    if route == "split" and "flush" not in cfg:
        cfg = make_replay_config(H, P, N, G, L, cfg["BLOCK_P"], cfg["HC"], cfg["BLOCK_N"], cfg["BLOCK_NF"],
                                 cfg["num_warps"], cfg["num_stages"], "split", advance,
                                 advance_sem=cfg.get("advance_sem", "relaxed"))
    lowp = uses_lowp_dot(state.dtype, x_buf.dtype, B_buf.dtype)
    prec = cfg.get("dot_precision") or ("ieee" if interp else "tf32x3")
    HPG = H // G
    if advance == "cursor" and (not cursor_word_counts_arrivals(cursor, L) or flush_first_block(cfg, Bt, 0)):
        advance = "atomic"  # the cursor word cannot carry the arrival count, or it is counted launch-wide
    if advance != "atomic":
        cnt = cursor
    else:
        cnt = arrivals if arrivals is not None else _arrival_counter(x.device, Bt)
    adv = advance in ("atomic", "cursor")
    # arguments shared by both kernels (optional tensors replaced by x, with zero strides)
    tensors = (x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias if dt_bias is not None else x,
               D if D is not None else x, z if z is not None else x, out)
    strides = (*x.stride(), *dt.stride(), *B.stride(), *C.stride(), *state.stride(), *x_buf.stride(),
               *dt_buf.stride(), *B_buf.stride(), cursor.stride(0), A.stride(0),
               dt_bias.stride(0) if dt_bias is not None else 0, D.stride(0) if D is not None else 0,
               *(z.stride() if z is not None else (0, 0, 0)), *out.stride())
    flags = dict(HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None,
                 DT_SOFTPLUS=bool(dt_softplus), DOT_LOWP=lowp, DOT_PREC=prec)

    def launch(c, route_id, zero, advance_here):
        grid = (Bt * G * c["n_hc"] * c["n_pb"],)
        kernel = _mamba2_replay_kernel if c.get("specialize", True) else _mamba2_replay_kernel_dyn
        kernel[grid](
            *tensors, cnt, P, N, L, G, HPG, c["HC"], c["n_hc"], c["n_pb"], *strides,
            **replay_kernel_constexprs(c, N, flags, zero_idle=zero, route=route_id, advance=advance_here,
                                       arrive_on_cursor=advance_here and advance == "cursor", n_rows=Bt),
            num_warps=c["num_warps"], num_stages=c["num_stages"],
        )

    if route == "split":
        # flush rows first (their own block sizes, persistent programs), then the
        # output-only launch, whose programs (all rows) do the arrival for the cursor advance
        fcfg = dict(cfg)
        fcfg.update(cfg.get("flush", {}))
        if not fcfg.get("persistent", True):
            fcfg["early_load"] = False
            launch(fcfg, 2, False, False)
        else:
            n_prog = int(fcfg.get("programs") or fcfg.get("programs_per_sm", 4) * n_sm)
            for row0, n_rows, BB in flush_row_chunks(Bt):
                items = n_rows * G * fcfg["n_hc"] * fcfg["n_pb"]
                _mamba2_flush_kernel[(max(1, min(n_prog, items)),)](
                    *tensors, P, N, L, G, HPG, fcfg["HC"], fcfg["n_hc"], fcfg["n_pb"], row0, n_rows, *strides,
                    **flags, BLOCK_P=fcfg["BLOCK_P"], BLOCK_N=cfg["BLOCK_N"], BLOCK_NF=fcfg["BLOCK_NF"],
                    BLOCK_L=cfg["BLOCK_L"], BB=BB, num_warps=fcfg["num_warps"], num_stages=fcfg["num_stages"],
                )
        launch(cfg, 1, zero_idle, adv)
    else:
        launch(cfg, 0, zero_idle, adv)
    if advance == "kernel":
        advance_cursor_triton(cursor, L)


def mamba2_replay_decode_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                                dt_softplus=True, out=None, arrivals=None):
    """Triton ReplaySSM decode step; same signature and semantics as ``mamba2_replay_decode_reference``.

    Goes through the custom operator ``torch.ops.replayssm.mamba2_replay_decode`` so that
    ``torch.compile(fullgraph=True)`` sees one opaque, mutating op.
    """
    from .ops import replay_decode_op

    zero_idle = out is None
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    replay_decode_op(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, bool(dt_softplus), out,
                     zero_idle, arrivals)
    return out
