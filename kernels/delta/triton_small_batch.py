"""One-launch Triton kernel of the delta-rule ReplaySSM decode step, for small batches.

At batch 1-4 the multi-launch step of ``triton_decode.py`` is bound by launch latency; this
kernel is the default there (``SMALL_BATCH_MAX``; H200, Qwen3.5-4B fp32, L=16, batch 1:
5.7 µs against 11.1 µs for the four launches of then and 4.3 µs for the per-step kernel).
What it computes: one program per
(row b, value head h, block of BV value columns) holds the whole key dim (K <= 256) and,
with ``c = cursor[b]``:

* non-flush rows (output only): ``A^T x = S0^T (exp(G_c) x) + sum_j (w_j k_j . x) u_j``
  for x in (k_c, q) without forming A, then ``u_c = beta (v - r)``,
  ``o = A^T q + (k_c . q) u_c``; append ``(u_c, k_c, g_c)`` at ring slot c (k by one
  program per key head, g by one per value head);
* flush rows (``c == L - 1``): rebuild ``A`` with fp32 rank-1 updates over the L - 1
  buffered entries (exact fp32; ring entries re-read one by one from L1/L2), read r and o
  from it and store ``A + k_c u_c^T`` as the new checkpoint, rounded once.

Ring slots ``>= c`` are never read; idle rows (``c < 0``) read and write nothing (zeros
into a freshly allocated output). The cursors move on inside the launch by default: every
program arrives at its row's cursor word (``kernels/cursor.py``) and the row's last program to
arrive stores the next cursor. With ``advance="cursor-first"`` the arrival is also the read
(one atomic before anything else); with ``"cursor"`` a load reads the cursor and the arrival
follows once the ring loads that depend on it are issued (after a CTA barrier, so every
thread's read has returned). ``advance="kernel"`` leaves the advance to a second tiny launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..cursor import advance_cursor_triton, advanced_cursor, arrive_on_cursor, count_arrival, cursor_of_word, \
    cursor_word_counts_arrivals
from .reference import _check_shapes
from .triton_gates import previous_gate_sum

__all__ = ["delta_replay_decode_small_batch", "SMALL_BATCH_ADVANCE"]

#: Largest batch whose default cursor advance is ``"cursor-first"`` (``"cursor"`` above). H200,
#: L=16 whole cycles, same run, against the second launch (``"kernel"``): ``"cursor-first"``
#: 1.12-1.24x faster at batch 1-2 on the Qwen3.5-4B, Qwen3.5-122B and KDA shapes (fp32 and
#: bf16 checkpoints), and from 0.1% behind to 4.6% ahead of ``"cursor"``; at batch 4 ``"cursor"`` 1.04-1.15x
#: faster than the second launch everywhere, while ``"cursor-first"`` was 1.15x slower with
#: the KDA shape's fp32 checkpoint (its programs wait on the atomic before any load)
#: (``examples/benchmarks/results/cursor_advance_h200_2026-12-02.md``).
SMALL_BATCH_ADVANCE = 2


@triton.jit
def _delta_small_batch_kernel(
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
    KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, WRITE_IDLE: tl.constexpr,
    ARRIVE: tl.constexpr, EARLY: tl.constexpr,
):
    pid = tl.program_id(0)
    i_v = pid % NV
    i_bh = pid // NV
    b = (i_bh // HV).to(tl.int64)
    h = i_bh % HV
    hk = h // GROUP

    # ARRIVE 1: read the cursor and arrive in one atomic; 2: load it, arrive below; 0: no arrival
    if ARRIVE == 1:
        c, arrived = arrive_on_cursor(cur_ptr + b * sc_b, "relaxed")
    elif ARRIVE == 2:
        c = cursor_of_word(tl.load(cur_ptr + b * sc_b))
    else:
        c = tl.load(cur_ptr + b * sc_b)
    active = c >= 0
    cc = tl.maximum(c, 0)
    flush = c == L - 1
    append = active & (c != L - 1)
    # scalar conditions become bounds (0 disables every lane) rather than being and-ed
    # with vector masks
    k_lim_in = tl.where(active, K, 0)
    k_lim_flush = tl.where(flush, K, 0)
    v_lim_append = tl.where(append, V, 0)
    lead = (i_v == 0) & (h % GROUP == 0)
    k_lim_kbuf = tl.where(lead, tl.where(append, K, 0), 0)  # one program per key head writes k
    k_lim_gbuf = tl.where(i_v == 0, tl.where(append, K, 0), 0)

    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    mk_in = offs_k < k_lim_in
    offs_v = i_v * BV + tl.arange(0, BV)
    mv = offs_v < V
    mv_act = offs_v < tl.where(active, V, 0)
    offs_l = tl.arange(0, LP)
    ml = offs_l < cc  # buffered entries j < c (cc = 0 on idle rows)

    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    g_base = g_ptr + b * sg_b + h * sg_h
    s_base = s_ptr + b * ss_b + h * ss_h
    ub_base = ub_ptr + b * sub_b + h * sub_h
    kb_base = kb_ptr + b * skb_b + hk * skb_h
    gb_base = gb_ptr + b * sgb_b + h * sgb_h
    s_ptrs = s_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v

    # the current token and the checkpoint tile, then the ring (entries j < cursor). EARLY: the
    # former without cursor predicates, so they are issued while the cursor read is in flight
    # (an idle row's are read and discarded: nothing of it is stored)
    if EARLY:
        mk_ld = mk
        mv_ld = mv
    else:
        mk_ld = mk_in
        mv_ld = mv_act
    s0 = tl.load(s_ptrs, mask=mk_ld[:, None] & mv_ld[None, :], other=0.0).to(tl.float32)
    qv = tl.load(q_base + offs_k * sq_k, mask=mk_ld, other=0.0).to(tl.float32)
    kv = tl.load(k_base + offs_k * sk_k, mask=mk_ld, other=0.0).to(tl.float32)
    if KDA:
        gv = tl.load(g_base + offs_k * sg_k, mask=mk_ld, other=0.0).to(tl.float32)
        gc = 0.0
    else:
        gv = tl.zeros_like(qv)
        if EARLY:
            gc = tl.load(g_base).to(tl.float32)
        else:
            gc = tl.load(g_base, mask=active, other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv_ld, other=0.0).to(tl.float32)
    if EARLY:
        beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h).to(tl.float32)
    else:
        beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h, mask=active, other=0.0).to(tl.float32)

    ub = tl.load(ub_base + offs_l[:, None] * sub_l + offs_v[None, :] * sub_v,
                 mask=ml[:, None] & mv[None, :], other=0.0).to(tl.float32)  # (LP, BV)
    kw = tl.load(kb_base + offs_k[:, None] * skb_k + offs_l[None, :] * skb_l,
                 mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP) keys^T
    if KDA:  # the gate ring holds the running sums G_j
        rhs = ub
        gcum = tl.load(gb_base + offs_k[:, None] * sgb_k + offs_l[None, :] * sgb_l,
                       mask=mk[:, None] & ml[None, :], other=0.0).to(tl.float32)  # (BK, LP)
        gt = previous_gate_sum(gb_base, sgb_l, sgb_k, offs_k, mk, cc) + gv  # G_c per key channel
        kw = kw * tl.exp(gt[:, None] - gcum)
    else:
        gh = tl.load(gb_base + offs_l * sgb_l, mask=ml, other=0.0).to(tl.float32)  # (LP,)
        gcum = tl.cumsum(gh, axis=0)
        gtot = tl.sum(gh, axis=0) + gc
        w = tl.where(ml, tl.exp(gtot - gcum), 0.0)
        rhs = ub * w[:, None]  # decay-weighted u's
        gt = tl.zeros_like(gv) + gtot
    dvec = tl.exp(gt)
    kq = tl.sum(kv * qv, axis=0)
    if ARRIVE == 2:
        # the ring loads above are predicated on c, so every thread's read has returned by the barrier
        tl.debug_barrier()
        arrived = count_arrival(cur_ptr + b * sc_b, c, "relaxed")

    if flush:
        # fp32 rank-1 updates over the L - 1 buffered entries (few registers: this branch
        # sets the occupancy of every step)
        acc = s0 * dvec[:, None]
        gcum_j = tl.zeros([BK], dtype=tl.float32)
        for j in range(0, L - 1):
            kj = tl.load(kb_base + j * skb_l + offs_k * skb_k, mask=mk, other=0.0).to(tl.float32)
            uj = tl.load(ub_base + j * sub_l + offs_v * sub_v, mask=mv, other=0.0).to(tl.float32)
            if KDA:  # G_j itself
                gcum_j = tl.load(gb_base + j * sgb_l + offs_k * sgb_k, mask=mk, other=0.0).to(tl.float32)
            else:
                gcum_j += tl.load(gb_base + j * sgb_l).to(tl.float32)
            acc += (kj * tl.exp(gt - gcum_j))[:, None] * uj[None, :]
        r = tl.sum(acc * kv[:, None], axis=0)
        hq = tl.sum(acc * qv[:, None], axis=0)
        u = beta * (vv - r)
        o = hq + kq * u
        tl.store(s_ptrs, (acc + kv[:, None] * u[None, :]).to(s_ptr.dtype.element_ty),
                 mask=(offs_k < k_lim_flush)[:, None] & mv[None, :])
    else:
        ak = tl.sum(kw * kv[:, None], axis=0)  # (LP,) weighted k_j . k_c
        aq = tl.sum(kw * qv[:, None], axis=0)
        r = tl.sum(s0 * (dvec * kv)[:, None], axis=0) + tl.sum(ak[:, None] * rhs, axis=0)
        hq = tl.sum(s0 * (dvec * qv)[:, None], axis=0) + tl.sum(aq[:, None] * rhs, axis=0)
        u = beta * (vv - r)
        o = hq + kq * u
    tl.store(kb_base + cc * skb_l + offs_k * skb_k, kv.to(kb_ptr.dtype.element_ty), mask=offs_k < k_lim_kbuf)
    if KDA:  # G_c
        tl.store(gb_base + cc * sgb_l + offs_k * sgb_k, gt.to(gb_ptr.dtype.element_ty), mask=offs_k < k_lim_gbuf)
    else:
        tl.store(gb_base + cc * sgb_l, gc.to(gb_ptr.dtype.element_ty), mask=k_lim_gbuf > 0)
    tl.store(ub_base + cc * sub_l + offs_v * sub_v, u.to(ub_ptr.dtype.element_ty), mask=offs_v < v_lim_append)
    if WRITE_IDLE:
        o = tl.where(active, o, 0.0)
        o_mask = mv
    else:
        o_mask = mv_act
    tl.store(o_ptr + b * so_b + h * so_h + offs_v * so_v, o.to(o_ptr.dtype.element_ty), mask=o_mask)
    if ARRIVE != 0:  # the row's last arrival advances its cursor (and clears the count)
        if arrived == HV * NV - 1:
            tl.store(cur_ptr + b * sc_b, advanced_cursor(c, L))


def delta_replay_decode_small_batch(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle: bool,
                                    block_v: int | None = None, num_warps: int | None = None,
                                    advance: str | None = None, early_load: bool = False) -> None:
    """Launch the one-launch kernel (K <= 256); writes ``out`` and the in-place tensors and
    advances the int32 cursors: inside the launch (``advance="cursor"`` or ``"cursor-first"``,
    L <= 127; module notes) or with a second launch (``"kernel"``, and for longer buffers).
    Default: ``"cursor-first"`` up to batch 2, ``"cursor"`` above (``SMALL_BATCH_ADVANCE``).
    ``early_load``: the checkpoint tile and the current token's inputs are loaded without waiting
    for the cursor. Off by default: slower in 16 of 18 measured cells at batch 1-4 (H200;
    ``examples/benchmarks/results/delta_early_load_h200_2026-12-02.md``)."""
    if advance is None:
        advance = "cursor-first" if q.shape[0] <= SMALL_BATCH_ADVANCE else "cursor"
    if advance not in ("cursor", "cursor-first", "kernel"):
        raise ValueError(f"advance must be 'cursor', 'cursor-first' or 'kernel'; got {advance!r}")
    Bt, HV, Hk, L, K, V = _check_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf)
    kda = g.dim() == 3
    BK = max(16, triton.next_power_of_2(K))
    if BK > 256:
        raise ValueError(f"the small-batch kernel keeps the whole key dim in one tile (K <= 256); got K={K}")
    BV = max(16, min(block_v or (32 if BK <= 128 else 16), triton.next_power_of_2(V)))
    LP = max(16, triton.next_power_of_2(L))
    NV = triton.cdiv(V, BV)
    sg = (g.stride(0), g.stride(1), g.stride(2) if kda else 0)
    sgb = (g_buf.stride(0), g_buf.stride(1), g_buf.stride(2), g_buf.stride(3) if kda else 0)
    arrive = {"kernel": 0, "cursor-first": 1, "cursor": 2}[advance] if cursor_word_counts_arrivals(cursor, L) else 0
    _delta_small_batch_kernel[(Bt * HV * NV,)](
        q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out,
        *q.stride(), *k.stride(), *v.stride(), *sg, *beta.stride(),
        *state.stride(), *u_buf.stride(), *k_buf.stride(), *sgb, *out.stride(), cursor.stride(0),
        HV, HV // Hk, K, V, L, NV,
        KDA=kda, BK=BK, BV=BV, LP=LP, WRITE_IDLE=bool(write_idle), ARRIVE=arrive, EARLY=bool(early_load),
        num_warps=num_warps or (4 if BK <= 128 else 8),
    )
    if arrive == 0:
        advance_cursor_triton(cursor, L)
