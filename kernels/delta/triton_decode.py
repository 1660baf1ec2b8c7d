"""Triton kernels of the delta-rule ReplaySSM decode step (Gated DeltaNet and KDA).

Semantics: ``reference.py``. With ``c = cursor[b]`` buffered entries and the decayed
history ``A = exp(G_c) S0 + sum_{j<c} (exp(G_c - G_j) k_j) u_j^T``, a step needs
``r = A^T k_c``, ``u_c = beta (v - r)`` and ``o = A^T q + (k_c . q) u_c``. Without forming
``A`` (the output-only route):

    A^T x = S0^T (exp(G_c) x) + sum_j (k_j . (exp(G_c - G_j) x)) u_j

so a step is one read of the checkpoint against two key-dim vectors plus a few ring
terms. Batches of at most ``SMALL_BATCH_MAX`` rows run the one-launch kernel of
``triton_small_batch.py`` by default (launch latency dominates there); larger ones run
three launches (four with a cursor launch), none of which syncs with the host (a whole step
can be captured in a CUDA graph):

1. ``_delta_coef_kernel``, one program per (row, value head): the key-dim vectors
   ``xk = exp(G_c) k_c``, ``xq = exp(G_c) q`` and the ring coefficients
   ``ck_j = k_j . (exp(G_c - G_j) k_c)``, ``cq_j`` (same with q), ``k_c . q``, into an fp32
   scratch. The ring keys (and, for KDA, the per-channel gate ring, which holds running sums
   ``G_j``: ``triton_gates.py``) are read here once per head instead of once per value-column block (KDA rows with at
   most L/2 or L/4 entries work on a half- or quarter-width window). Programs of idle rows, and
   of flush rows when the flush launch computes their step, only store the next cursor. Gated
   DeltaNet runs ``_gdn_coef_kernel`` instead by default: one program per (row, key head)
   computes the ring-key products once for the value heads sharing that key head (their
   scalar decays only weight them); with 16-bit checkpoints the output launch then scales
   k_c and q by ``exp(G_c)`` itself (no x scratch).
2. ``_delta_output_kernel``, one program per (row, value head, block of value columns):
   reads the checkpoint tile once, ``r = S0^T xk + sum_j ck_j u_j``,
   ``hq = S0^T xq + sum_j cq_j u_j``, writes ``o`` and appends ``(u_c, k_c, g_c)`` at ring
   slot c (k by one program per key head, g by one per value head). A flush row
   (``c == L - 1``) is left to the flush launch (``flush_output``, the default except for
   Gated DeltaNet with 16-bit checkpoints; its checkpoint tile load then waits for the cursor),
   or else gets its output here and ``u_c`` in fp32 in a scratch instead of the ring. It carries
   no flush code, so its register use (and occupancy) is that of a plain read. With
   ``dependent_launch`` (KDA with fp32 checkpoints by default) it is a programmatic dependent
   launch of step 1: it starts under that launch's tail and waits only before the scratch.
3. ``_delta_flush_kernel``, persistent: a few programs per multiprocessor share the work
   items (flush row, value head; the program walks the head's column blocks) of the rows
   whose cursor is ``L - 1``, found on the device from the cursors, so a step without
   flushes costs one small load per program and flush work spreads over the whole GPU
   however many rows flush. Each
   item rebuilds ``A + k_c u_c^T`` with a matrix product of the decay-weighted cached keys
   and the buffered u's (``tf32x3`` for fp32 operands: plain tf32 drifts ~1e-2; with the
   unweighted operand's ring in bf16, three bf16 products against a three-term bf16 split of
   the weighted one, which is faster and as exact: Gated DeltaNet splits the u's weighted by
   its scalar decays, KDA the keys weighted per channel) plus the current token's rank-1 term in fp32,
   and stores it as the new checkpoint, rounded once. With ``flush_output`` the item first
   computes the row's step from the rebuilt history of each column block (``r``, ``u_c``,
   ``o``; the whole key dim is one tile), so a flush step reads the checkpoint once; with
   ``flush_prefetch`` (Gated DeltaNet with fp32 checkpoints) the next column block's checkpoint
   tile is loaded while the current one is worked on.
4. ``cursor <- (cursor + 1) % L`` on active rows, after every program has read it: by default
   without a launch of its own (``advance_in_flush``): the coefficient launch writes the
   advanced cursors to a scratch, the flush launch finds its rows there (a flush row's is 0)
   and its program 0 copies them back. The flush launch is then by default a programmatic
   dependent of the output launch (``flush_dependent_launch``): with ``flush_output`` its items
   touch nothing that launch reads or writes, so they start under its tail and only the
   cursor copy waits for it.

Rows with a negative cursor are idle: nothing of theirs is written (``out`` keeps its
contents, or gets zeros when the caller asked for a fresh output); their checkpoint tile
is loaded and discarded, because that load is issued before the cursor is known. The ring
loads wait for the cursor and read only the ``c`` valid slots (``ring_by_cursor``, the
default; without it they are bounded by L and issued early); either way stale slots are
selected away before anything mixes entries (NaN there is harmless). The interpreter runs
the flush product with ``"ieee"`` precision and fp32 operands (its bf16 ``tl.dot`` is not
trusted).

The coefficient and output launches take the sizes (heads, key and value dims, L, value
blocks) and the strides of the checkpoint and of the rings as ``tl.constexpr``, so they fold
into the address arithmetic (one compile per layer shape). The flush launch takes them as
runtime arguments: specialized, it made KDA slower. H200, L=16, whole cycle, same run, against
all runtime arguments: Gated DeltaNet 1.00-1.01x with an fp32 checkpoint, 1.04-1.12x with bf16
(batch 32 and 256); KDA 0.99-1.00x (``examples/benchmarks/results/delta_constexpr_h200_2026-12-02.md``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..backend import dependent_launch_supported, num_sms, triton_interpreter_on
from ..cursor import advance_cursor_triton, advanced_cursor
from ..persistent import flush_row_chunks, flush_row_prefix, nth_flush_row
from .reference import _check_shapes
from .triton_gates import append_gate_sum, previous_gate_sum

try:  # grid dependency control (programmatic dependent launch), Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except Exception:  # pragma: no cover - older Triton: dependent_launch_supported() is False
    gdc_launch_dependents = gdc_wait = None

__all__ = ["delta_replay_decode_triton", "advance_cursor_triton", "SMALL_BATCH_MAX"]

#: Batches up to this many rows run the one-launch kernel by default. H200, L=16, CUDA
#: graphs (examples/benchmarks/results/delta_small_batch_h200_2026-11-30.md): at batch 1-4
#: it takes 0.51-0.95x the time of the four launches of then (Qwen3.5-4B fp32, batch 1: 5.7 vs
#: 11.1 µs; 4.97 µs since it moves the cursors on itself, ``triton_small_batch.SMALL_BATCH_ADVANCE``);
#: at batch 8 it is 0.74-1.24x (slower for the KDA shape).
SMALL_BATCH_MAX = 4


@triton.jit
def _key_tiles(q_base, sq_k, k_base, sk_k, kb_base, skb_l, skb_k, offs_k, mk, offs_l, inl):
    """fp32 key-dim tile ``offs_k`` of k_c, of q, and of the ring keys transposed (BK, LP)
    (slots bounded by ``inl``: the cursor or L; the caller selects stale ones away)."""
    kv = tl.load(k_base + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32)
    qv = tl.load(q_base + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32)
    kw = tl.load(kb_base + offs_k[:, None] * skb_k + offs_l[None, :] * skb_l,
                 mask=mk[:, None] & inl[None, :], other=0.0).to(tl.float32)
    return kv, qv, kw


@triton.jit
def _gdn_decay_window(gb_row, sgb_l, g_cur, offs_l, ml, inl):
    """Gated DeltaNet decays of one (row, value head): (w (LP,) = exp(G_c - G_j) over the ring
    slots ``ml``, zero elsewhere; exp(G_c)), from its gate ring row and current gate."""
    gh = tl.load(gb_row + offs_l * sgb_l, mask=inl, other=0.0).to(tl.float32)
    gh = tl.where(ml, gh, 0.0)
    gtot = tl.sum(gh, axis=0) + tl.load(g_cur).to(tl.float32)
    return tl.where(ml, tl.exp(gtot - tl.cumsum(gh, axis=0)), 0.0), tl.exp(gtot)


@triton.jit
def _ring_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                x_base, cw_base, c, K, L, w, dsc,
                KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, LW: tl.constexpr, LP: tl.constexpr,
                RING_BY_CURSOR: tl.constexpr):
    """Scratch of one (row, value head) from the first ``LW`` ring slots (``LW >= c``; slots
    ``LW .. LP-1`` of cw get zeros). Gated DeltaNet: ``w`` (LW,) and ``dsc`` from
    ``_gdn_decay_window``; KDA: unused."""
    offs_l = tl.arange(0, LW)
    ml = offs_l < c
    # Ring loads bounded by the cursor (RING_BY_CURSOR: fewer bytes, the loads wait for it) or
    # by L (issued at once); slots >= c (stale, or NaN in the tests) are selected away before
    # anything mixes entries.
    inl = ml if RING_BY_CURSOR else offs_l < L
    ck = tl.zeros([LW], dtype=tl.float32)
    cq = tl.zeros([LW], dtype=tl.float32)
    kq = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        kv, qv, kw = _key_tiles(q_base, sq_k, k_base, sk_k, kb_base, skb_l, skb_k, offs_k, mk, offs_l, inl)
        if KDA:
            gv = tl.load(g_base + offs_k * sg_k, mask=mk, other=0.0).to(tl.float32)
            gm = tl.load(gb_base + offs_k[:, None] * sgb_k + offs_l[None, :] * sgb_l,
                         mask=mk[:, None] & inl[None, :], other=0.0).to(tl.float32)  # running sums G_j
            gt = previous_gate_sum(gb_base, sgb_l, sgb_k, offs_k, mk, c) + gv  # G_c per key channel
            kw = kw * tl.exp(gt[:, None] - gm)  # stale slots (>= c) are selected away below
            dvec = tl.exp(gt)
        else:
            dvec = tl.zeros([BK], dtype=tl.float32) + dsc
        ck += tl.sum(kw * kv[:, None], axis=0)
        cq += tl.sum(kw * qv[:, None], axis=0)
        kq += kv * qv
        tl.store(x_base + offs_k, dvec * kv, mask=mk)
        tl.store(x_base + K + offs_k, dvec * qv, mask=mk)
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
def _kda_window_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                      x_base, cw_base, c, K, L, BK: tl.constexpr, NK: tl.constexpr, LP: tl.constexpr,
                      LW: tl.constexpr, WINDOWS: tl.constexpr, RING_BY_CURSOR: tl.constexpr):
    """KDA ``_ring_coefs`` on the narrowest of ``WINDOWS`` windows (LW, LW / 2, LW / 4) that holds
    the row's ``c`` ring entries (a window's width is fixed at compile time, the cursor is not)."""
    if WINDOWS > 1:
        if c <= LW // 2:
            _kda_window_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                              x_base, cw_base, c, K, L, BK, NK, LP, LW // 2, WINDOWS - 1, RING_BY_CURSOR)
            return
    _ring_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                x_base, cw_base, c, K, L, 0.0, 0.0, True, BK, NK, LW, LP, RING_BY_CURSOR)


@triton.jit
def _delta_coef_kernel(
    q_ptr, k_ptr, g_ptr, kb_ptr, gb_ptr, cur_ptr, x_ptr, cw_ptr, cn_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    sg_b, sg_h, sg_k,
    skb_b: tl.constexpr, skb_h: tl.constexpr, skb_l: tl.constexpr, skb_k: tl.constexpr,
    sgb_b: tl.constexpr, sgb_h: tl.constexpr, sgb_l: tl.constexpr, sgb_k: tl.constexpr,
    sc_b,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, LP: tl.constexpr, RING_BY_CURSOR: tl.constexpr,
    WINDOWS: tl.constexpr, PDL: tl.constexpr, NEXT_CURSOR: tl.constexpr, SKIP_IDLE: tl.constexpr,
    SKIP_FLUSH: tl.constexpr,
):
    """x scratch (Bt, HV, 2, K): [xk, xq]; cw scratch (Bt, HV, 3, LP): [ck, cq, (k_c . q, 0...)].

    WINDOWS (KDA, 1-3): ring windows a program picks from by its cursor, fixed at compile time
    (the cursor is not): the whole one, then half (rows with ``c <= LP / 2``), then a quarter
    (``c <= LP / 4``); a narrower window has proportionally fewer exps and products.
    SKIP_IDLE / SKIP_FLUSH: idle rows (``c < 0``; nothing uses their scratch) / flush rows
    (``c == L - 1``; with ``flush_output`` the flush launch computes their step itself) write
    nothing but the next cursor; without them they are computed (an idle row with an empty ring).
    PDL: let the output launch start now (it waits for this launch before reading the scratch).
    NEXT_CURSOR: the row's advanced cursor goes to the scratch ``cn`` (by its head-0 program),
    which the flush launch copies to the cursors.
    """
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    b = (pid // HV).to(tl.int64)
    h = pid % HV
    hk = h // GROUP
    c = tl.load(cur_ptr + b * sc_b)
    if NEXT_CURSOR:
        if h == 0:
            tl.store(cn_ptr + b, advanced_cursor(c, L))
    if SKIP_IDLE or SKIP_FLUSH:
        if ((c < 0) & SKIP_IDLE) | ((c == L - 1) & SKIP_FLUSH):
            return
    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    g_base = g_ptr + b * sg_b + h * sg_h
    kb_base = kb_ptr + b * skb_b + hk * skb_h
    gb_base = gb_ptr + b * sgb_b + h * sgb_h
    x_base = x_ptr + pid.to(tl.int64) * 2 * K
    cw_base = cw_ptr + pid.to(tl.int64) * 3 * LP
    if not KDA:
        offs_l = tl.arange(0, LP)
        ml = offs_l < c
        w, dsc = _gdn_decay_window(gb_base, sgb_l, g_base, offs_l, ml, ml if RING_BY_CURSOR else offs_l < L)
        _ring_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                    x_base, cw_base, c, K, L, w, dsc, KDA, BK, NK, LP, LP, RING_BY_CURSOR)
    else:
        _kda_window_coefs(q_base, sq_k, k_base, sk_k, g_base, sg_k, kb_base, skb_l, skb_k, gb_base, sgb_l, sgb_k,
                          x_base, cw_base, c, K, L, BK, NK, LP, LP, WINDOWS, RING_BY_CURSOR)


@triton.jit
def _gdn_coef_kernel(
    q_ptr, k_ptr, g_ptr, kb_ptr, gb_ptr, cur_ptr, x_ptr, cw_ptr, cn_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    sg_b, sg_h,
    skb_b: tl.constexpr, skb_h: tl.constexpr, skb_l: tl.constexpr, skb_k: tl.constexpr,
    sgb_b: tl.constexpr, sgb_h: tl.constexpr, sgb_l: tl.constexpr,
    sc_b,
    Hk: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, NK: tl.constexpr, LP: tl.constexpr, GP: tl.constexpr, WRITE_X: tl.constexpr,
    RING_BY_CURSOR: tl.constexpr, PDL: tl.constexpr, NEXT_CURSOR: tl.constexpr, SKIP_IDLE: tl.constexpr,
    SKIP_FLUSH: tl.constexpr,
):
    """Gated DeltaNet coefficients, one program per (row, key head): the ring-key products
    ``k_j . k_c`` and ``k_j . q`` are computed once for the GROUP value heads that share the
    key head; each value head then gets them weighted by its own decays. The GROUP heads are
    one (GP, ...) tile (GP = GROUP rounded up to a power of two), so their gate rings load with
    the ring keys. cw scratch (Bt, HV, 3, LP): [ck, cq, (k_c . q, exp(G_c), 0...)]; the output
    launch scales k_c and q by exp(G_c) itself, unless WRITE_X: then this launch writes the x
    scratch (Bt, HV, 2, K) [exp(G_c) k_c, exp(G_c) q] as ``_delta_coef_kernel`` does. PDL and
    NEXT_CURSOR, SKIP_IDLE, SKIP_FLUSH: as there (key head 0 stores the next cursor)."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    b = (pid // Hk).to(tl.int64)
    hk = pid % Hk
    c = tl.load(cur_ptr + b * sc_b)
    if NEXT_CURSOR:
        if hk == 0:
            tl.store(cn_ptr + b, advanced_cursor(c, L))
    if SKIP_IDLE or SKIP_FLUSH:
        if ((c < 0) & SKIP_IDLE) | ((c == L - 1) & SKIP_FLUSH):
            return
    offs_l = tl.arange(0, LP)
    ml = offs_l < c
    inl = ml if RING_BY_CURSOR else offs_l < L
    offs_g = tl.arange(0, GP)
    mg = offs_g < GROUP
    h_g = hk * GROUP + offs_g  # (GP,) value heads of this key head
    gh = tl.load(gb_ptr + b * sgb_b + h_g[:, None] * sgb_h + offs_l[None, :] * sgb_l,
                 mask=mg[:, None] & inl[None, :], other=0.0).to(tl.float32)  # (GP, LP)
    gcur = tl.load(g_ptr + b * sg_b + h_g * sg_h, mask=mg, other=0.0).to(tl.float32)
    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    kb_base = kb_ptr + b * skb_b + hk * skb_h
    dk = tl.zeros([LP], dtype=tl.float32)
    dq = tl.zeros([LP], dtype=tl.float32)
    kq = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        kv, qv, kw = _key_tiles(q_base, sq_k, k_base, sk_k, kb_base, skb_l, skb_k, offs_k, mk, offs_l, inl)
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
    HV = Hk * GROUP
    bh = b * HV + h_g  # (GP,)
    cw_base = cw_ptr + bh[:, None] * 3 * LP + offs_l[None, :]
    m2 = mg[:, None] & (offs_l < LP)[None, :]  # the value-head mask over the whole (GP, LP) tile
    tl.store(cw_base, dk[None, :] * w, mask=m2)
    tl.store(cw_base + LP, dq[None, :] * w, mask=m2)
    tl.store(cw_base + 2 * LP, tl.where(offs_l[None, :] == 0, kqs, tl.where(offs_l[None, :] == 1, dsc[:, None], 0.0)),
             mask=m2)
    if WRITE_X:
        for i_k in range(NK):
            offs_k = i_k * BK + tl.arange(0, BK)
            mk = offs_k < K
            kv = tl.load(k_base + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32)  # cached: read above
            qv = tl.load(q_base + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32)
            x_base = x_ptr + bh[:, None] * 2 * K + offs_k[None, :]
            mx = mg[:, None] & mk[None, :]
            tl.store(x_base, dsc[:, None] * kv[None, :], mask=mx)
            tl.store(x_base + K, dsc[:, None] * qv[None, :], mask=mx)


@triton.jit
def _copy_vector(src, s_src, dst, s_dst, K, BK: tl.constexpr, NK: tl.constexpr):
    """dst[k] = src[k] for k < K, converted to dst's dtype (a ring append)."""
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        val = tl.load(src + offs_k * s_src, mask=mk, other=0.0)
        tl.store(dst + offs_k * s_dst, val.to(dst.dtype.element_ty), mask=mk)


@triton.jit
def _delta_output_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, ub_ptr, kb_ptr, gb_ptr, cur_ptr, x_ptr, cw_ptr, uf_ptr, o_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    sv_b, sv_h, sv_v,
    sg_b, sg_h, sg_k,
    sbt_b, sbt_h,
    ss_b: tl.constexpr, ss_h: tl.constexpr, ss_k: tl.constexpr, ss_v: tl.constexpr,
    sub_b: tl.constexpr, sub_h: tl.constexpr, sub_l: tl.constexpr, sub_v: tl.constexpr,
    skb_b: tl.constexpr, skb_h: tl.constexpr, skb_l: tl.constexpr, skb_k: tl.constexpr,
    sgb_b: tl.constexpr, sgb_h: tl.constexpr, sgb_l: tl.constexpr, sgb_k: tl.constexpr,
    so_b, so_h, so_v,
    sc_b,
    HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, NV: tl.constexpr,
    KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr,
    WRITE_IDLE: tl.constexpr, X_FROM_KEYS: tl.constexpr, RING_BY_CURSOR: tl.constexpr, PDL: tl.constexpr,
    SKIP_FLUSH_ROWS: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr,
):
    """SKIP_FLUSH_ROWS: rows whose cursor is ``L - 1`` are left to the flush launch, which
    computes their output while it rebuilds the checkpoint (their checkpoint tile is not
    loaded here, so that load waits for the cursor). X_FROM_KEYS (Gated DeltaNet): scale k_c
    and q by exp(G_c) (cw[2, 1]) here instead of reading them from the x scratch. RING_BY_CURSOR: the u ring load is bounded by the cursor
    (it then waits for the cursor; the checkpoint tile load does not). PDL: launched as a
    programmatic dependent of the coefficient launch, so its checkpoint, ring and input loads
    (nothing that launch writes) are issued while that launch finishes; the scratch is read
    after ``gdc_wait``. LAUNCH_DEPENDENTS: let the flush launch (a programmatic dependent of
    this one) start now."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    i_v = pid % NV
    i_bh = pid // NV
    b = (i_bh // HV).to(tl.int64)
    h = i_bh % HV
    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < V
    o_base = o_ptr + b * so_b + h * so_h + offs_v * so_v

    offs_l = tl.arange(0, LP)
    x_base = x_ptr + i_bh.to(tl.int64) * 2 * K
    cw_base = cw_ptr + i_bh.to(tl.int64) * 3 * LP
    s_base = s_ptr + b * ss_b + h * ss_h
    ub_base = ub_ptr + b * sub_b + h * sub_h

    # The checkpoint tile and the small inputs are loaded before the cursor is known (an idle
    # row's are discarded); the ring load waits for it with RING_BY_CURSOR (fewer bytes; the
    # checkpoint load is in flight meanwhile), else it is bounded by L and issued at once. With
    # SKIP_FLUSH_ROWS the checkpoint load skips flush rows, so it waits for the cursor too, and
    # the other loads come after the flush rows' exit.
    c = tl.load(cur_ptr + b * sc_b)
    if NK == 1:
        offs_k0 = tl.arange(0, BK)
        mvs = mv
        if SKIP_FLUSH_ROWS:
            mvs = mv & (offs_v * 0 + c != L - 1)
        s_first = tl.load(s_base + offs_k0[:, None] * ss_k + offs_v[None, :] * ss_v,
                          mask=(offs_k0 < K)[:, None] & mvs[None, :], other=0.0)
    if SKIP_FLUSH_ROWS:
        if c == L - 1:  # before the other loads: the flush launch does this row's step
            return
    ub = tl.load(ub_base + offs_l[:, None] * sub_l + offs_v[None, :] * sub_v,
                 mask=((offs_l < c) if RING_BY_CURSOR else (offs_l < L))[:, None] & mv[None, :],
                 other=0.0)  # (LP, BV)
    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h).to(tl.float32)
    if PDL:
        gdc_wait()  # the coefficient launch's scratch is complete and visible after this
    ck = tl.load(cw_base + offs_l)
    cq = tl.load(cw_base + LP + offs_l)
    kq = tl.load(cw_base + 2 * LP)
    if X_FROM_KEYS:
        dsc = tl.load(cw_base + 2 * LP + 1)
    if c < 0:
        if WRITE_IDLE:
            tl.store(o_base, tl.zeros([BV], dtype=o_ptr.dtype.element_ty), mask=mv)
        return
    flush = c == L - 1
    ml = offs_l < c
    ub = tl.where(ml[:, None], ub.to(tl.float32), 0.0)
    r = tl.zeros([BV], dtype=tl.float32)
    hq = tl.zeros([BV], dtype=tl.float32)
    for i_k in range(NK):
        offs_k = i_k * BK + tl.arange(0, BK)
        mk = offs_k < K
        if NK == 1:
            s0 = s_first.to(tl.float32)
        else:
            s0 = tl.load(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                         mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
        if X_FROM_KEYS:
            hk_x = h // GROUP
            xk = tl.load(k_ptr + b * sk_b + hk_x * sk_h + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32) * dsc
            xq = tl.load(q_ptr + b * sq_b + hk_x * sq_h + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32) * dsc
        else:
            xk = tl.load(x_base + offs_k, mask=mk, other=0.0)
            xq = tl.load(x_base + K + offs_k, mask=mk, other=0.0)
        r += tl.sum(s0 * xk[:, None], axis=0)
        hq += tl.sum(s0 * xq[:, None], axis=0)
    r += tl.sum(ck[:, None] * ub, axis=0)
    hq += tl.sum(cq[:, None] * ub, axis=0)
    u = beta * (vv - r)
    o = hq + kq * u
    tl.store(o_base, o.to(o_ptr.dtype.element_ty), mask=mv)

    if flush:
        # the flush launch folds u_c in unrounded
        tl.store(uf_ptr + i_bh.to(tl.int64) * V + offs_v, u, mask=mv)
    else:
        tl.store(ub_base + c * sub_l + offs_v * sub_v, u.to(ub_ptr.dtype.element_ty), mask=mv)
        if i_v == 0:
            if h % GROUP == 0:  # one program per key head appends k_c
                hk = h // GROUP
                _copy_vector(k_ptr + b * sk_b + hk * sk_h, sk_k, kb_ptr + b * skb_b + hk * skb_h + c * skb_l, skb_k,
                             K, BK, NK)
            if KDA:
                append_gate_sum(g_ptr + b * sg_b + h * sg_h, sg_k, gb_ptr + b * sgb_b + h * sgb_h, sgb_l, sgb_k, c,
                                K, BK, NK)
            else:
                gs = tl.load(g_ptr + b * sg_b + h * sg_h)
                tl.store(gb_ptr + b * sgb_b + h * sgb_h + c * sgb_l, gs.to(gb_ptr.dtype.element_ty))


@triton.jit
def _bf16_split3(x):
    """fp32 x as hi + mid + lo in bf16 (24 significant bits together: exact to fp32 rounding)."""
    hi = x.to(tl.bfloat16)
    rest = x - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    return hi, mid, (rest - mid.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _state_tile(s_base, ss_k, ss_v, offs_k, mk, offs_v, v_end):
    """Checkpoint tile (BK, BV) at key rows ``offs_k`` and value columns ``offs_v < v_end``."""
    return tl.load(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
                   mask=mk[:, None] & (offs_v < v_end)[None, :], other=0.0)


@triton.jit
def _delta_flush_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, ub_ptr, kb_ptr, gb_ptr, cur_ptr, cn_ptr, uf_ptr, o_ptr,
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
    row0, n_rows, HV, GROUP, K, V, L, NV,
    KDA: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr,
    BB: tl.constexpr, DOT_PREC: tl.constexpr, BF16_SPLIT: tl.constexpr, HEAD_ITEMS: tl.constexpr,
    OUTPUT: tl.constexpr, PREFETCH: tl.constexpr, NEXT_CURSOR: tl.constexpr, PDL: tl.constexpr,
):
    """Persistent: the programs share the work items of the rows ``row0 .. row0 + n_rows - 1``
    whose cursor is ``L - 1``, found on the device from the cursors (a prefix count), so a step
    without flush rows costs one small load per program and flush work spreads over every
    program whether 1 row or all flush. An item is a (flush row, value head, column block), or
    with HEAD_ITEMS a (flush row, value head) whose column blocks the program walks in turn: the
    ring keys (and, for KDA, the per-channel decay weights with their exps) are then loaded and
    computed once per head instead of once per column block.

    BF16_SPLIT: the buffered terms are three bf16 tensor-core products, one operand exact in
    bf16 and the other, decay-weighted one split into three bf16 terms (hi + mid + lo carry 24
    significant bits), instead of a ``DOT_PREC`` product of fp32 operands. Gated DeltaNet (bf16
    key ring) splits the weighted u's; KDA (bf16 u ring), whose decays weight each key channel,
    splits the weighted keys.

    OUTPUT (needs NK == 1: the whole key dim in one tile): the flush rows' step is computed
    here entirely. The output launch skipped them, so ``u_c`` is not in the scratch: each column
    block's rebuilt history ``A`` gives ``r = A^T k_c``, ``u_c = beta (v - r)`` and the output
    ``o = A^T q + (k_c . q) u_c``, then ``A + k_c u_c^T`` is stored; the checkpoint is read once
    on a flush step instead of twice. PREFETCH: each column block's checkpoint tile is loaded
    one block ahead (two tiles in registers), so its load overlaps the previous block's work.
    NEXT_CURSOR: the flush rows are found from the advanced cursors of the coefficient launch
    (scratch ``cn``, (Bt,) int32: 0 on a flush row), which program 0 then copies to the cursors
    (no program of this launch reads those), so no launch of its own advances them.
    PDL: a programmatic dependent of the output launch, so it starts while that launch finishes.
    With OUTPUT the flush rows' items touch nothing the output launch reads or writes (it skipped
    those rows: their checkpoint, outputs and ring slots), so only the cursor copy waits for it;
    without OUTPUT everything waits (the items read its u_c scratch)."""
    if PDL and not OUTPUT:
        gdc_wait()
    if NEXT_CURSOR:
        csum, n_flush = flush_row_prefix(cn_ptr, 1, row0, n_rows, 0, BB)
        if tl.program_id(0) == 0:
            if PDL and OUTPUT:
                gdc_wait()  # every program of the output launch has read the cursors
            offs_r = row0 + tl.arange(0, BB)
            mr = offs_r < row0 + n_rows
            tl.store(cur_ptr + offs_r * sc_b, tl.load(cn_ptr + offs_r, mask=mr), mask=mr)
    else:
        csum, n_flush = flush_row_prefix(cur_ptr, sc_b, row0, n_rows, L - 1, BB)
    per_row = HV if HEAD_ITEMS else HV * NV
    n_cols = NV if HEAD_ITEMS else 1  # column blocks per item
    total = n_flush * per_row
    offs_l = tl.arange(0, LP)
    ml = offs_l < L - 1  # the L - 1 buffered entries
    for w in range(tl.program_id(0), total, tl.num_programs(0)):
        rank = w // per_row
        rem = w - rank * per_row
        if HEAD_ITEMS:
            h = rem
            i_v0 = rem * 0
        else:
            h = rem // NV
            i_v0 = rem - h * NV
        b = nth_flush_row(csum, rank, row0)
        hk = h // GROUP
        i_bh = b * HV + h
        v_end = tl.minimum((i_v0 + n_cols) * BV, V)  # end of this item's value columns
        s_base = s_ptr + b * ss_b + h * ss_h
        ub_base = ub_ptr + b * sub_b + h * sub_h
        kb_base = kb_ptr + b * skb_b + hk * skb_h
        gb_base = gb_ptr + b * sgb_b + h * sgb_h
        g_base = g_ptr + b * sg_b + h * sg_h
        if not KDA:
            wl, dsc = _gdn_decay_window(gb_base, sgb_l, g_base, offs_l, ml, ml)  # (LP,) decay weights, exp(G_c)
        for i_k in range(NK):
            offs_k = i_k * BK + tl.arange(0, BK)
            mk = offs_k < K
            kc = tl.load(k_ptr + b * sk_b + hk * sk_h + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32)
            if OUTPUT:  # (NK == 1: these are whole-key-dim vectors)
                qc = tl.load(q_ptr + b * sq_b + hk * sq_h + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32)
                kq = tl.sum(kc * qc, axis=0)
                beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h).to(tl.float32)
            kw = tl.load(kb_base + offs_k[:, None] * skb_k + offs_l[None, :] * skb_l,
                         mask=mk[:, None] & ml[None, :], other=0.0)  # (BK, LP), ring dtype
            if KDA:
                gv = tl.load(g_base + offs_k * sg_k, mask=mk, other=0.0).to(tl.float32)
                gm = tl.load(gb_base + offs_k[:, None] * sgb_k + offs_l[None, :] * sgb_l,
                             mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # running sums G_j
                gt = previous_gate_sum(gb_base, sgb_l, sgb_k, offs_k, mk, L - 1) + gv  # G_{L-1}
                kw = kw.to(tl.float32) * tl.exp(gt[:, None] - gm)
                dk = tl.exp(gt)
                if BF16_SPLIT:
                    k_hi, k_mid, k_lo = _bf16_split3(kw)
            if PREFETCH:  # the first column block's checkpoint tile, then each next one a block ahead
                s_next = _state_tile(s_base, ss_k, ss_v, offs_k, mk, i_v0 * BV + tl.arange(0, BV), v_end)
            for j in range(n_cols):
                offs_v = (i_v0 + j) * BV + tl.arange(0, BV)
                mv = offs_v < V
                m2 = mk[:, None] & mv[None, :]
                if PREFETCH:
                    s_cur = s_next
                    s_next = _state_tile(s_base, ss_k, ss_v, offs_k, mk, offs_v + BV, v_end)
                ub = tl.load(ub_base + offs_l[:, None] * sub_l + offs_v[None, :] * sub_v,
                             mask=ml[:, None] & mv[None, :], other=0.0)  # (LP, BV), ring dtype
                if OUTPUT:
                    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv, other=0.0).to(tl.float32)
                else:
                    uc = tl.load(uf_ptr + i_bh * V + offs_v, mask=mv, other=0.0)
                if PREFETCH:
                    s0 = s_cur.to(tl.float32)
                else:
                    s0 = _state_tile(s_base, ss_k, ss_v, offs_k, mk, offs_v, v_end).to(tl.float32)
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
                        u_hi, u_mid, u_lo = _bf16_split3(ub)
                        acc = tl.dot(kw, u_hi, acc)
                        acc = tl.dot(kw, u_mid, acc)
                        acc = tl.dot(kw, u_lo, acc)
                    else:
                        acc += tl.dot(kw.to(tl.float32), ub, input_precision=DOT_PREC)
                if OUTPUT:  # acc is the history A of this column block (whole key dim)
                    uc = beta * (vv - tl.sum(acc * kc[:, None], axis=0))
                    o = tl.sum(acc * qc[:, None], axis=0) + kq * uc
                    tl.store(o_ptr + b * so_b + h * so_h + offs_v * so_v, o.to(o_ptr.dtype.element_ty), mask=mv)
                acc += kc[:, None] * uc[None, :]
                tl.store(s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v, acc.to(s_ptr.dtype.element_ty),
                         mask=m2)


def _switch(cfg: dict, name: str, asked: bool | None) -> bool:
    """An on/off knob: what the caller asked for, else the default in ``cfg``."""
    return bool(cfg[name] if asked is None else asked)


def _coef_windows(cfg: dict, narrow: bool | None, windows: int | None) -> int:
    """Ring windows (1-3) of the KDA coefficient launch from the ``coef_narrow`` and
    ``coef_windows`` knobs; ValueError when they disagree or ``coef_windows`` is out of range."""
    if windows is not None:
        if windows not in (1, 2, 3):
            raise ValueError(f"coef_windows must be 1, 2 or 3, got {windows!r}")
        if narrow is not None and narrow != (windows > 1):
            raise ValueError(f"coef_narrow={narrow} contradicts coef_windows={windows}")
        return windows
    if narrow is None:
        return cfg["coef_windows"]
    return max(2, cfg["coef_windows"]) if narrow else 1


@functools.lru_cache(maxsize=256)
def default_config(K: int, V: int, state_dtype: torch.dtype, kda: bool) -> dict:
    """Launch knobs of the output and flush launches (value columns per program, warps, K
    tile, flush programs per multiprocessor). Cached: callers must not modify the dict."""
    bk = min(triton.next_power_of_2(K), 256)
    if bk >= 256:
        return dict(block_v=32, num_warps=8, block_k=bk, flush_block_v=16, flush_block_k=bk, flush_warps=8,
                    flush_programs=4, flush_stages=2, coef_block_k=64, coef_warps=1,
                    coef_per_key_head=False, coef_write_x=True, flush_bf16_split=False, ring_by_cursor=True,
                    coef_windows=1, coef_skip_rows=True, flush_head_items=False, dependent_launch=False,
                    flush_output=False, flush_prefetch=False, advance_in_flush=True, flush_dependent_launch=True)
    # H200, batch 256, L=16 (examples/benchmarks/results/delta_h200_2026-11-30_r4*): output
    # programs of 1-2 warps, because the key-dim reduction crosses warps (4 warps: 16-bit
    # checkpoints 1.46-1.53x slower, fp32 1.03-1.06x); flush items of 64 columns with a
    # 2-stage pipelined item loop (KDA fp32: 721 vs 881 µs flush step then; since flush items are
    # whole heads KDA runs 1 stage, below), one-warp coefficient programs over the whole key dim.
    # Gated DeltaNet: coefficient programs per key head (H200, batch 256, L=16, whole cycle:
    # bf16 checkpoints 1.05x (Qwen3.5-4B) / 1.07x (122B) with the output launch scaling k_c and
    # q itself; fp32 checkpoints 1.01x / 1.02x only when the coefficient launch writes them
    # scaled, 0.92-0.94x otherwise; examples/benchmarks/results/delta_launch_variants_h200_2026-12-01.md).
    # Gated DeltaNet flush with bf16 key rings: three bf16 tensor-core products instead of one
    # tf32x3 product (stand-alone flush launch, every row flushing, batch 256: Qwen3.5-4B fp32
    # 368 vs 416 µs; bf16 checkpoints with 128-column items on 2 programs per multiprocessor
    # 220 vs 326 µs; examples/benchmarks/results/delta_flush_products_h200_2026-12-01.md).
    if state_dtype.itemsize == 2:
        block_v, warps = 32, 1
    else:
        block_v, warps = (32, 2) if kda else (64, 2)
    # Ring loads bounded by the cursor (H200, batch 256, L=16, whole cycle, same run: Qwen3.5-4B
    # fp32 177.4 vs 182.0 µs, bf16 110.0 vs 118.9; 122B fp32 335.2 vs 342.6; KDA fp32 212.5 vs
    # 220.9; examples/benchmarks/results/delta_ring_by_cursor_h200_2026-12-01.json). Every batch
    # 8-512 and L 8-32 (delta_ring_by_cursor_all_batches_h200_2026-12-01.md): 1.00-1.21x, except
    # Gated DeltaNet with 16-bit checkpoints at L=32 and batch >= 128 (0.92-0.98x).
    # KDA (H200, batch 256, L=16, whole cycle, same run; results/delta_kda_split_narrow_h200_2026-12-01.md):
    # half-window coefficient programs for rows at most half full, fp32 208.2 vs 212.7 µs with the two
    # knobs' earlier defaults, bf16 142.4 vs 149.5 (the bf16 split flush was then 0.7% slower at fp32).
    # Flush items of whole value heads, the ring keys and KDA's decay weights computed once per head
    # (H200, batch 256, L=16, whole cycle, same run; results/delta_flush_head_items_h200_2026-12-01.md):
    # Qwen3.5-4B fp32 176.0 vs 178.2 µs, 122B fp32 333.1 vs 335.6, KDA fp32 206.7 vs 211.1, KDA bf16
    # 136.0 vs 141.1. With them, KDA's bf16 split flush is faster at fp32 too (200.7 vs 206.7), and a
    # flush loop without software pipelining is (KDA fp32 199.2, bf16 134.7).
    # The output launch as a programmatic dependent of the coefficient launch, for KDA with fp32
    # checkpoints only (H200, L=16, whole cycle, same run; results/delta_dependent_launch_h200_2026-12-01.md):
    # batch 256 1.010x, 32 1.013x, 8 1.080x; elsewhere mixed (Gated DeltaNet fp32 1.003-1.005x at batch
    # 256 but 0.977x at 32; bf16 checkpoints 0.85x (Qwen3.5-4B) and 0.987x (KDA) at batch 256).
    # KDA flush over 32-channel key tiles (H200, batch 256, L=16, whole cycle, same run;
    # results/delta_kda_more_variants_h200_2026-12-01.md): fp32 196.9 vs 197.6 µs, bf16 133.6 vs 134.8
    # (Gated DeltaNet: 0.999-1.000x fp32, 0.94x bf16, so it keeps whole-key tiles).
    # The flush launch computing the flush rows' output (the checkpoint read once on a flush step;
    # H200, batch 256, L=16, whole cycle, same run; results/delta_flush_output_h200_2026-12-01.md):
    # Qwen3.5-4B fp32 169.2 vs 174.4 µs, 122B fp32 319.6 vs 330.2, KDA fp32 189.3 vs 196.0, KDA bf16
    # 130.8 vs 133.6, each with 32-column flush items, 2 warps and 8 programs per multiprocessor
    # (4 warps, 64 columns, 4 programs: 1.02x, 1.02x, 0.99x, 0.98x). Not for Gated DeltaNet with
    # 16-bit checkpoints (Qwen3.5-4B bf16 0.97-0.98x: the output launch's checkpoint load then
    # waits for the cursor, which costs more there than the second read saves).
    # Gated DeltaNet with fp32 checkpoints: the flush loads each column block's checkpoint tile one
    # block ahead, with an unpipelined item loop (same run; results/delta_flush_output_h200_2026-12-01.md):
    # Qwen3.5-4B 165.9 vs 168.7 µs, 122B 311.7 vs 316.0 (KDA fp32 0.988x; 16-bit checkpoints 1.00x).
    # The cursor advance without a launch of its own: the coefficient launch writes the advanced
    # cursors to a scratch, the flush launch finds its rows there and copies them back; and the
    # flush launch as a programmatic dependent of the output launch, so its start (and, on a step
    # without flush rows, nearly all of it) runs under that launch's tail (H200, L=16, whole cycle,
    # same run; results/delta_launch_overlap_h200_2026-12-01.md): batch 256 fp32 Qwen3.5-4B
    # 164.2 vs 167.0 µs (advance) and 162.4 vs 164.2 (dependent flush), 122B 1.004x and 1.005x,
    # bf16 1.006-1.012x; batch 32 Qwen3.5-4B 1.06x (dependent flush). KDA with fp32 checkpoints keeps
    # its dependent output launch instead (the two do not chain; 1.001x either way).
    # KDA coefficient programs on a quarter window for rows with at most L/4 entries, and coefficient
    # programs of idle and (with flush_output) flush rows exiting at once (H200, batch 256, L=16, whole
    # cycle, same run; results/delta_coef_windows_skip_h200_2026-12-01.md): KDA fp32 185.8 vs 188.7 µs,
    # bf16 125.6 vs 128.7; Gated DeltaNet fp32 1.001-1.002x (skipping rows only).
    split_16 = not kda and state_dtype.itemsize == 2  # 128-column flush items were timed with the split products
    prefetch = not kda and state_dtype.itemsize == 4
    if split_16:
        flush_v, flush_w, flush_p = 128, 4, 2
    else:
        flush_v, flush_w, flush_p = 32, 2, 8
    return dict(block_v=block_v, num_warps=warps, block_k=bk, flush_block_v=flush_v,
                flush_block_k=32 if kda else bk, flush_warps=flush_w,
                flush_programs=flush_p, flush_stages=1 if kda or prefetch else 2, coef_block_k=128, coef_warps=1,
                coef_per_key_head=not kda, coef_write_x=state_dtype.itemsize == 4,
                flush_bf16_split=True, ring_by_cursor=True, coef_windows=3 if kda else 1,
                coef_skip_rows=True, flush_head_items=True,
                dependent_launch=kda and state_dtype.itemsize == 4, flush_output=not split_16,
                flush_prefetch=prefetch, advance_in_flush=True, flush_dependent_launch=True)


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
    block_v: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    flush_block_v: int | None = None,
    flush_block_k: int | None = None,
    flush_warps: int | None = None,
    flush_programs: int | None = None,
    flush_stages: int | None = None,
    coef_block_k: int | None = None,
    coef_warps: int | None = None,
    one_launch: bool | None = None,
    coef_per_key_head: bool | None = None,
    coef_write_x: bool | None = None,
    flush_bf16_split: bool | None = None,
    ring_by_cursor: bool | None = None,
    coef_narrow: bool | None = None,
    coef_windows: int | None = None,
    coef_skip_rows: bool | None = None,
    flush_head_items: bool | None = None,
    dependent_launch: bool | None = None,
    flush_output: bool | None = None,
    flush_prefetch: bool | None = None,
    advance_in_flush: bool | None = None,
    flush_dependent_launch: bool | None = None,
) -> torch.Tensor:
    """Triton version of ``delta_replay_decode_reference`` (same arguments and result).

    Keyword-only extras: ``write_idle`` (store zeros for idle rows; defaults to
    ``out is None``) and launch knobs: ``block_v`` / ``num_warps`` (value columns per
    program and warps of the output launch), ``block_k`` (key-dim tile; default the whole
    key dim up to 256, walked tile by tile beyond), ``flush_block_v`` / ``flush_block_k`` /
    ``flush_warps`` (same for the flush launch; its key tile follows ``block_k`` when that is given),
    ``flush_programs`` (programs of the persistent flush launch; default a few per
    multiprocessor), ``flush_stages`` (software-pipelining
    stages of its loop over work items), ``coef_block_k`` / ``coef_warps`` (key-dim tile
    and warps of the coefficient launch), ``coef_per_key_head`` (Gated DeltaNet: one
    coefficient program per key head, shared by its value heads), ``coef_write_x`` (with
    it: that launch also writes the decay-scaled k_c and q for the output launch, which
    otherwise scales them itself), ``flush_bf16_split`` (flush: three bf16 products of the ring
    operand that is exact in bf16 and a three-term split of the decay-weighted one instead of
    tf32x3: Gated DeltaNet splits the weighted u's against its keys, KDA the weighted keys against
    its u's; used only when that exact ring (keys for GDN, u's for KDA) is bf16, never under the
    interpreter), ``ring_by_cursor`` (ring loads of the coefficient and output launches bounded
    by the cursor rather than by L), ``coef_windows`` (KDA coefficient launch: how many ring
    windows, 1-3, its programs pick from by cursor: the whole one, half for rows with at most half
    the ring filled, a quarter for rows with at most a quarter), ``coef_narrow`` (``False``: one
    window; ``True``: at least two), ``coef_skip_rows`` (coefficient programs of idle rows, and of
    flush rows when ``flush_output`` is on, exit after the next cursor), ``flush_head_items`` (flush work
    items of a whole value head, whose column blocks one program walks: ring keys and KDA decay
    weights loaded and computed once per head) and ``dependent_launch`` (the output launch starts
    while the coefficient launch finishes: programmatic dependent launch, where the device and
    Triton support it; see ``dependent_launch_supported``). Two more flush knobs: ``flush_output``
    (the flush launch computes the flush rows' output too and the output launch skips them, so a
    flush step reads the checkpoint once; its flush key tile is then the whole key dim, whatever
    ``flush_block_k`` says) and ``flush_prefetch`` (the flush loads each column block's checkpoint
    tile one block ahead); ``advance_in_flush`` (the coefficient launch writes the advanced cursors
    to a scratch that the flush launch copies back, instead of a cursor launch after the flush) and
    ``flush_dependent_launch`` (with it, the flush launch is a programmatic dependent of the output
    launch; not when ``dependent_launch`` makes the output launch one itself). Defaults:
    ``default_config``.
    ``one_launch``: run the small-batch kernel of ``triton_small_batch.py`` instead (K <= 256; with
    ``one_launch=True`` its knobs are ``block_v`` and ``num_warps``); by default it runs, with
    its own launch defaults, for batches of at most ``SMALL_BATCH_MAX`` rows.
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
    chosen = one_launch is True  # asked for: block_v / num_warps are its knobs
    if one_launch is None:
        one_launch = Bt <= SMALL_BATCH_MAX and triton.next_power_of_2(K) <= 256
    if one_launch:
        from .triton_small_batch import delta_replay_decode_small_batch

        delta_replay_decode_small_batch(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle,
                                        block_v=block_v if chosen else None, num_warps=num_warps if chosen else None)
        return out
    cfg = default_config(K, V, state.dtype, kda)
    vp = max(16, triton.next_power_of_2(V))
    BV = max(16, min(block_v or cfg["block_v"], vp))
    BVF = max(16, min(flush_block_v or cfg["flush_block_v"], vp))
    BK = max(16, min(block_k or cfg["block_k"], triton.next_power_of_2(K)))
    NK = triton.cdiv(K, BK)
    BKF = max(16, min(flush_block_k or (BK if block_k else cfg["flush_block_k"]), triton.next_power_of_2(K)))
    LP = max(16, triton.next_power_of_2(L))
    NV, NVF = triton.cdiv(V, BV), triton.cdiv(V, BVF)
    dev = v.device
    # one 4-byte scratch allocation per call, viewed as: xs (Bt, HV, 2, K) [exp(G_c) k_c, exp(G_c) q]
    # (absent when the output launch scales k_c and q itself), cw (Bt, HV, 3, LP) [ck, cq,
    # (k_c . q, exp(G_c) from the per-key-head launch)], uf (Bt, HV, V) u_c of flush rows (absent
    # when the flush launch computes their step: flush_output), all fp32, and cn (Bt,) int32 the
    # advanced cursors (absent without advance_in_flush)
    per_key = not kda and _switch(cfg, "coef_per_key_head", coef_per_key_head)
    write_x = per_key and _switch(cfg, "coef_write_x", coef_write_x)
    x_from_keys = per_key and not write_x  # then no launch touches the x scratch
    fused_flush = _switch(cfg, "flush_output", flush_output) and triton.next_power_of_2(K) <= 256
    next_cur = _switch(cfg, "advance_in_flush", advance_in_flush)
    n_x, n_c = (0 if x_from_keys else Bt * HV * 2 * K), Bt * HV * 3 * LP
    n_u = 0 if fused_flush else Bt * HV * V
    scratch = torch.empty(n_x + n_c + n_u + (Bt if next_cur else 0), dtype=torch.float32, device=dev)
    xs = scratch if x_from_keys else scratch[:n_x].view(Bt, HV, 2, K)
    cw = scratch[n_x:n_x + n_c].view(Bt, HV, 3, LP)
    uf = scratch if fused_flush else scratch[n_x + n_c:n_x + n_c + n_u].view(Bt, HV, V)  # untouched when fused
    cn = scratch[n_x + n_c + n_u:].view(torch.int32) if next_cur else cursor
    sq, sk, sv = q.stride(), k.stride(), v.stride()
    sg = (g.stride(0), g.stride(1), g.stride(2) if kda else 0)
    sgb = (g_buf.stride(0), g_buf.stride(1), g_buf.stride(2), g_buf.stride(3) if kda else 0)
    skb, sub, ss = k_buf.stride(), u_buf.stride(), state.stride()
    GROUP = HV // Hk
    BKC = max(16, min(coef_block_k or cfg["coef_block_k"], triton.next_power_of_2(K)))
    by_cur = _switch(cfg, "ring_by_cursor", ring_by_cursor)
    skip_rows = _switch(cfg, "coef_skip_rows", coef_skip_rows)
    windows = _coef_windows(cfg, coef_narrow, coef_windows)  # checked for every layer, used by KDA's
    pdl = _switch(cfg, "dependent_launch", dependent_launch) and dependent_launch_supported(dev.type, dev.index)
    # The flush launch as a dependent of the output launch: only with the advance in the flush (its
    # program 0 waits for the output launch, so the flush launch ends after it), and not when the
    # output launch is itself a dependent (its flush-row programs exit before waiting for the
    # coefficient launch, whose next cursors the flush reads).
    flush_pdl = (next_cur and not pdl and _switch(cfg, "flush_dependent_launch", flush_dependent_launch)
                 and dependent_launch_supported(dev.type, dev.index))
    if per_key:
        _gdn_coef_kernel[(Bt * Hk,)](
            q, k, g, k_buf, g_buf, cursor, xs, cw, cn, *sq, *sk, *g.stride(), *skb, *g_buf.stride()[:3],
            cursor.stride(0), Hk, GROUP, K, L, BK=BKC, NK=triton.cdiv(K, BKC), LP=LP, GP=triton.next_power_of_2(GROUP),
            WRITE_X=write_x, RING_BY_CURSOR=by_cur, PDL=pdl, NEXT_CURSOR=next_cur,
            SKIP_IDLE=skip_rows, SKIP_FLUSH=skip_rows and fused_flush,
            num_warps=coef_warps or cfg["coef_warps"],
        )
    else:
        _delta_coef_kernel[(Bt * HV,)](
            q, k, g, k_buf, g_buf, cursor, xs, cw, cn, *sq, *sk, *sg, *skb, *sgb, cursor.stride(0),
            HV, GROUP, K, L, KDA=kda, BK=BKC, NK=triton.cdiv(K, BKC), LP=LP, RING_BY_CURSOR=by_cur,
            WINDOWS=windows if kda else 1, PDL=pdl, NEXT_CURSOR=next_cur,
            SKIP_IDLE=skip_rows, SKIP_FLUSH=skip_rows and fused_flush,
            num_warps=coef_warps or cfg["coef_warps"],
        )
    _delta_output_kernel[(Bt * HV * NV,)](
        q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, xs, cw, uf, out,
        *sq, *sk, *sv, *sg, *beta.stride(), *ss, *sub, *skb, *sgb, *out.stride(), cursor.stride(0),
        HV, GROUP, K, V, L, NV,
        KDA=kda, BK=BK, NK=NK, BV=BV, LP=LP, WRITE_IDLE=bool(write_idle), X_FROM_KEYS=x_from_keys,
        RING_BY_CURSOR=by_cur, PDL=pdl, SKIP_FLUSH_ROWS=fused_flush, LAUNCH_DEPENDENTS=flush_pdl,
        num_warps=num_warps or cfg["num_warps"], **({"launch_pdl": True} if pdl else {}),
    )
    n_prog = flush_programs or cfg["flush_programs"] * num_sms(dev.type, dev.index)
    interp = triton_interpreter_on()
    exact_ring = u_buf if kda else k_buf  # the product operand that is not decay-weighted
    bf16_split = (exact_ring.dtype == torch.bfloat16 and not interp
                  and _switch(cfg, "flush_bf16_split", flush_bf16_split))
    head_items = _switch(cfg, "flush_head_items", flush_head_items)
    if fused_flush:
        BKF = triton.next_power_of_2(K)
    for row0, n_rows, BB in flush_row_chunks(Bt):
        _delta_flush_kernel[(max(1, min(n_prog, n_rows * HV * (1 if head_items else NVF))),)](
            q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, cn, uf, out,
            *sq, *sk, *sv, *sg, *beta.stride(), *ss, *sub, *skb, *sgb, *out.stride(), cursor.stride(0),
            row0, n_rows, HV, GROUP, K, V, L, NVF,
            KDA=kda, BK=BKF, NK=triton.cdiv(K, BKF), BV=BVF, LP=LP, BB=BB,
            DOT_PREC="ieee" if interp else "tf32x3", BF16_SPLIT=bf16_split, HEAD_ITEMS=head_items,
            OUTPUT=fused_flush, PREFETCH=_switch(cfg, "flush_prefetch", flush_prefetch), NEXT_CURSOR=next_cur,
            PDL=flush_pdl, **({"launch_pdl": True} if flush_pdl else {}),
            num_warps=flush_warps or cfg["flush_warps"], num_stages=flush_stages or cfg["flush_stages"],
        )
    if not next_cur:
        advance_cursor_triton(cursor, L)
    return out
