"""Plain PyTorch reference of the delta-rule ReplaySSM decode step (also the CPU path).

Covers Gated DeltaNet (GDN: one log-decay per value head) and Kimi Delta Attention (KDA:
one log-decay per key channel) with the same functions; ``g.dim()`` tells them apart.

Layout (Hugging Face's): the state of value head h is ``S`` (K, V), rows = key dim. Value
head h reads key head ``h // (HV // Hk)`` (grouped value heads). One recurrence step is

    S <- exp(g) * S            (GDN: a scalar; KDA: row k scaled by exp(g[k]))
    r = S^T k ;  u = beta * (v - r) ;  S <- S + k u^T ;  o = S^T q

ReplaySSM keeps a checkpoint ``S0`` plus a ring of the corrected values ``u_j``, the keys
``k_j`` and the decays of the tokens received since the checkpoint. With ``c = cursor[b]``
buffered entries, the current token is window entry c, and with ``G_j = sum_{i<=j} g_i``
over window entries (a vector over K for KDA):

    A = exp(G_c) * S0 + sum_{j<c} (exp(G_c - G_j) * k_j) u_j^T        (= alpha_c S_{c-1})
    r = A^T k_c ;  u_c = beta_c (v_c - r) ;  S_c = A + k_c u_c^T ;  o = S_c^T q

The decay ring holds, in fp32, the log-decays ``g_j`` (GDN: a scalar per head) or, for KDA,
their running sums ``G_j`` per key channel: with one decay per key channel, the sums over the
window (a cumulative sum per channel) were the costly part of every KDA step, and a running sum
stored at append time needs only the previous slot (``G_c = G_{c-1} + g_c``, ``G_{-1} = 0``);
a rollback (a cursor moved back) leaves the kept slots' sums valid.

* Flush (``c == L - 1``): ``S0 <- S_c`` rounded once to the checkpoint dtype; the ring
  restarts empty. Otherwise ``(u_c, k_c, g_c)`` (KDA: ``G_c``) is appended at slot c (u
  rounded to the ``u_buf`` dtype, k to the ``k_buf`` dtype, the decay kept fp32). The cursor advances to
  ``(c + 1) % L`` on every active row; rows with ``cursor < 0`` are idle (nothing of theirs
  is read or written, ``out`` keeps its contents).

Precision of the current token (the Triton kernels follow the same rule): the current
token's own ``u_c`` and ``k_c`` enter its output, and on a flush step the new checkpoint,
in fp32 (``u_c`` is never rounded before use; ``k_c`` is the input upcast to fp32). Only
the copies appended to the ring are rounded to the buffer dtype, and later steps read
those. So with fp32 buffers every step equals the exact fp32 recurrence up to summation
order; with bf16/fp16 buffers each buffered ``u_j`` carries one rounding, which the next
flush folds into the checkpoint.

Low-precision checkpoints (``replayssm.kernels.quant``): int8 / fp8 ones come with
``state_scale`` (Bt, HV, V) fp32, one scale per value column over the key dim K (every read is
a reduction over K); ``state_rng`` (Bt, 2) int64 [seed, flush counter] makes the flush's
rounding stochastic (any dtype below fp32).

Everything is computed for every row and selected with ``torch.where`` (no host-side
decision from tensor values), so the reference can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from ..quant import check_quant_args, commit_materialized, load_state, store_state

#: the state dimension the int8 / fp8 scales run over (S0 is (Bt, HV, K, V))
SCALE_DIM = -2

__all__ = [
    "kda_gate_total",
    "l2norm_qk_reference",
    "delta_replay_decode_reference",
    "delta_replay_materialize_reference",
    "delta_step_decode_reference",
]


def check_qk_shapes(q: torch.Tensor, k: torch.Tensor) -> None:
    """ValueError unless q and k are both (Bt, H, K)."""
    if q.shape != k.shape or q.dim() != 3:
        raise ValueError(f"q and k must both be (Bt, H, K), got {tuple(q.shape)} and {tuple(k.shape)}")


def l2norm_qk_reference(q: torch.Tensor, k: torch.Tensor, q_scale: float, eps: float = 1e-6):
    """q, k (Bt, H, K), any float dtype -> (q_n, k_n) fp32 (Bt, H, K): each vector times
    ``rsqrt(sum(x^2) + eps)`` in fp32 (Hugging Face's ``l2norm``), q then times ``q_scale``."""
    check_qk_shapes(q, k)

    def norm(x):
        x = x.float()
        return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)

    return norm(q) * q_scale, norm(k)


def check_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf):
    """(Bt, HV, Hk, L, K, V) of a replay step's tensors; ValueError when they disagree."""
    Bt, HV, L, V = u_buf.shape
    Hk, K = k_buf.shape[1], k_buf.shape[3]
    if HV % Hk != 0:
        raise ValueError(f"value heads ({HV}) must be a multiple of key heads ({Hk})")
    if tuple(q.shape) != (Bt, Hk, K) or tuple(k.shape) != (Bt, Hk, K):
        raise ValueError(f"q and k must be (Bt, Hk, K) = {(Bt, Hk, K)}; got {tuple(q.shape)}, {tuple(k.shape)}")
    if tuple(v.shape) != (Bt, HV, V):
        raise ValueError(f"v must be (Bt, HV, V) = {(Bt, HV, V)}; got {tuple(v.shape)}")
    if tuple(state.shape) != (Bt, HV, K, V):
        raise ValueError(f"state must be (Bt, HV, K, V) = {(Bt, HV, K, V)}; got {tuple(state.shape)}")
    if tuple(k_buf.shape) != (Bt, Hk, L, K):
        raise ValueError(f"k_buf must be (Bt, Hk, L, K) = {(Bt, Hk, L, K)}; got {tuple(k_buf.shape)}")
    if g.dim() == 2:
        if tuple(g.shape) != (Bt, HV) or tuple(g_buf.shape) != (Bt, HV, L):
            raise ValueError("GDN: g must be (Bt, HV) and g_buf (Bt, HV, L)")
    elif g.dim() == 3:
        if tuple(g.shape) != (Bt, HV, K) or tuple(g_buf.shape) != (Bt, HV, L, K):
            raise ValueError("KDA: g must be (Bt, HV, K) and g_buf (Bt, HV, L, K)")
    else:
        raise ValueError(f"g must be (Bt, HV) or (Bt, HV, K); got {tuple(g.shape)}")
    if tuple(beta.shape) != (Bt, HV):
        raise ValueError(f"beta must be (Bt, HV); got {tuple(beta.shape)}")
    return Bt, HV, Hk, L, K, V


def kda_gate_total(g_buf: torch.Tensor, n: torch.Tensor, g_tail: torch.Tensor) -> torch.Tensor:
    """KDA: ``G = G_{n-1} + g_tail`` (Bt, HV, K) fp32 from the running-sum ring ``g_buf``
    (Bt, HV, L, K) and ``n`` (Bt,) long entries (``G_{-1} = 0``; slots >= n are not used)."""
    Bt, HV, L, K = g_buf.shape
    idx = (n - 1).clamp(min=0).view(Bt, 1, 1, 1).expand(Bt, HV, 1, K)
    prev = g_buf.float().gather(2, idx)[:, :, 0]
    prev = torch.where((n > 0).view(Bt, 1, 1), prev, torch.zeros((), device=g_buf.device))
    return prev + g_tail.float()


def _decayed_history(state, u_buf, k_buf, g_buf, n, g_tail):
    """``exp(G) * S0 + sum_{j<n} (exp(G - G_j) * k_j) u_j^T`` in fp32, G = G_{n-1} + g_tail.

    ``n`` (Bt,) long: number of ring entries to use (entries j >= n are never read, so
    they may hold anything, NaN included). ``g_tail`` (Bt, HV) or (Bt, HV, K) fp32: the
    log-decay appended after the last entry (the current token's g, or zeros).
    Returns (Bt, HV, K, V) fp32 and G ((Bt, HV) or (Bt, HV, K) fp32).
    """
    Bt, HV, L, V = u_buf.shape
    Hk = k_buf.shape[1]
    kda = g_buf.dim() == 4
    dev = u_buf.device
    zero = torch.zeros((), device=dev)
    hist = torch.arange(L, device=dev)[None, :] < n[:, None]  # (Bt, L)
    h4 = hist[:, None, :, None]
    ub = torch.where(h4, u_buf.float(), zero)  # (Bt, HV, L, V)
    kb = torch.where(h4, k_buf.float(), zero).repeat_interleave(HV // Hk, dim=1)  # (Bt, HV, L, K)
    if kda:  # the ring holds the running sums G_j
        gtot = kda_gate_total(g_buf, n, g_tail)  # (Bt, HV, K)
        gcum = torch.where(h4, g_buf.float(), zero)  # (Bt, HV, L, K)
        kw = torch.where(h4, kb * torch.exp(gtot[:, :, None, :] - gcum), zero)
        s = torch.exp(gtot)[..., None] * state.float()
    else:
        gh = torch.where(hist[:, None, :], g_buf.float(), zero)  # (Bt, HV, L)
        gcum = torch.cumsum(gh, dim=2)
        gtot = gh.sum(dim=2) + g_tail.float()  # (Bt, HV)
        kw = kb * torch.exp(gtot[:, :, None] - gcum)[..., None]
        s = torch.exp(gtot)[..., None, None] * state.float()
    return s + torch.einsum("bhlk,bhlv->bhkv", kw, ub), gtot


def _write_checkpoint(state, state_scale, state_rng, s, rows) -> None:
    """The new checkpoint ``s`` (fp32) on ``rows`` (Bt,) bool, rounded once to the state dtype."""
    if state_scale is None and state_rng is None:
        state.copy_(torch.where(rows.view(-1, 1, 1, 1), s.to(state.dtype), state))
    else:
        store_state(state, state_scale, state_rng, s, rows, SCALE_DIM)


def delta_replay_decode_reference(
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
    state_scale: torch.Tensor | None = None,
    state_rng: torch.Tensor | None = None,
) -> torch.Tensor:
    """One ReplaySSM decode step of a delta-rule layer for a batch of rows.

    Args:
        q, k: (Bt, Hk, K) current query and key, L2-normalised; q already scaled by K^-0.5.
        v: (Bt, HV, V) current value (activation dtype).
        g: (Bt, HV) fp32 log-decay (GDN) or (Bt, HV, K) fp32 per key channel (KDA).
        beta: (Bt, HV) fp32, already through the sigmoid.
        state: (Bt, HV, K, V) checkpoint S0, fp32/bf16/fp16; written in place on flush rows.
        u_buf: (Bt, HV, L, V) ring of corrected values (usually the activation dtype).
        k_buf: (Bt, Hk, L, K) ring of keys, one per key head.
        g_buf: (Bt, HV, L) fp32 ring of log-decays g_j (GDN) or (Bt, HV, L, K) fp32 ring of
            their running sums since the checkpoint G_j (KDA).
        cursor: (Bt,) int32 number of buffered entries c in [0, L-1]; c < 0 marks an idle
            row. Advanced in place to (c + 1) % L on active rows; rows with c == L-1 flush.
        out: optional (Bt, HV, V) output; idle rows keep its contents.
        state_scale: (Bt, HV, V) fp32 scales of an int8 / fp8 checkpoint (written on flush rows).
        state_rng: (Bt, 2) int64 [seed, counter]: stochastic rounding on flush rows (their
            counters advance by one).

    Returns:
        o (Bt, HV, V) in ``v.dtype`` (``out`` if given; idle rows are zero when ``out`` is
        None).
    """
    Bt, HV, Hk, L, K, V = check_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf)
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    grp = HV // Hk
    kda = g.dim() == 3
    active = cursor >= 0
    c = cursor.clamp(min=0).long()

    a, gtot = _decayed_history(load_state(state, state_scale, SCALE_DIM), u_buf, k_buf, g_buf, c, g)  # alpha_c S_{c-1}, fp32; G_c
    qf = q.float().repeat_interleave(grp, dim=1)  # (Bt, HV, K)
    kf = k.float().repeat_interleave(grp, dim=1)
    r = torch.einsum("bhkv,bhk->bhv", a, kf)
    u = beta.float()[..., None] * (v.float() - r)  # fp32, never rounded before use
    s = a + kf[..., None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", s, qf)

    # Append (u_c, k_c, g_c) (KDA: G_c) at slot c on active, non-flush rows.
    flush = active & (c == L - 1)
    app = active & ~flush
    slot = torch.arange(L, device=u_buf.device)[None, :] == c[:, None]  # (Bt, L)
    sel = (slot & app[:, None])[:, None, :, None]  # (Bt, 1, L, 1)
    u_buf.copy_(torch.where(sel, u.to(u_buf.dtype)[:, :, None, :], u_buf))
    k_buf.copy_(torch.where(sel, k.to(k_buf.dtype)[:, :, None, :], k_buf))
    if kda:
        g_buf.copy_(torch.where(sel, gtot.to(g_buf.dtype)[:, :, None, :], g_buf))
    else:
        g_buf.copy_(torch.where(sel[..., 0], g.to(g_buf.dtype)[:, :, None], g_buf))

    # Flush rows write the new checkpoint; advance the cursors.
    _write_checkpoint(state, state_scale, state_rng, s, flush)
    cursor.copy_(torch.where(active, ((c + 1) % L).to(cursor.dtype), cursor))

    o = o.to(v.dtype)
    act3 = active.view(Bt, 1, 1)
    if out is None:
        return torch.where(act3, o, torch.zeros((), dtype=o.dtype, device=o.device))
    out.copy_(torch.where(act3, o.to(out.dtype), out))
    return out


def delta_replay_materialize_reference(
    state: torch.Tensor,
    u_buf: torch.Tensor,
    k_buf: torch.Tensor,
    g_buf: torch.Tensor,
    cursor: torch.Tensor,
    state_scale: torch.Tensor | None = None,
    state_rng: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fold the buffered entries into the checkpoint and empty the ring.

    Returns the exact fp32 state (Bt, HV, K, V) after the buffered tokens; also writes it
    (rounded once) into ``state`` and sets the cursors of rows with entries to 0. Rows with
    cursor <= 0 (empty or idle) keep their checkpoint and cursor (a quantized checkpoint is
    rewritten only where entries were folded).
    """
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    Bt, HV = u_buf.shape[0], u_buf.shape[1]
    n = cursor.clamp(min=0).long()
    if g_buf.dim() == 4:
        tail = torch.zeros(Bt, HV, g_buf.shape[3], device=g_buf.device)
    else:
        tail = torch.zeros(Bt, HV, device=g_buf.device)
    s0 = load_state(state, state_scale, SCALE_DIM)
    s, _ = _decayed_history(s0, u_buf, k_buf, g_buf, n, tail)
    return commit_materialized(state, state_scale, state_rng, cursor, s, s0, SCALE_DIM)


def delta_step_decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """The ordinary per-step delta-rule recurrence (the baseline), in Hugging Face's order.

    Same argument conventions as ``delta_replay_decode_reference``. ``state`` (Bt, HV, K, V)
    is read and written in place every step (fp32 arithmetic, rounded to the state dtype).
    Returns o (Bt, HV, V) in ``v.dtype``.
    """
    Bt, Hk, K = k.shape
    HV = v.shape[1]
    grp = HV // Hk
    qf = q.float().repeat_interleave(grp, dim=1)
    kf = k.float().repeat_interleave(grp, dim=1)
    if g.dim() == 3:
        s = state.float() * torch.exp(g.float())[..., None]
    else:
        s = state.float() * torch.exp(g.float())[..., None, None]
    kv = (s * kf[..., None]).sum(dim=-2)
    u = (v.float() - kv) * beta.float()[..., None]
    s = s + kf[..., None] * u[..., None, :]
    o = (s * qf[..., None]).sum(dim=-2)
    state.copy_(s.to(state.dtype))
    return o.to(v.dtype)
