"""Delta-rule (GDN, KDA) multi-token verify on the replay path (speculative decoding), PyTorch
reference.

A verify step takes T new tokens per row on a cache holding a checkpoint ``S0`` and
``c = cursor[b]`` ring entries ``(u_j, k_j, g_j)`` (KDA: running sums ``G_j``), and:

1. **flush first** where the ring cannot hold the T tokens (``c + T > L``): the buffered entries
   are folded into the checkpoint (rounded once to its dtype) and the row restarts at ``c = 0``,
   so only committed tokens are folded and every window token stays roll-back-able;
2. for window token t at slot ``p = c + t``, in order (the delta rule's correction ``u_t`` depends
   on the state after the tokens before it):

       A_t = exp(G_p) S0 + sum_{j<p} (exp(G_p - G_j) k_j) u_j^T      (= alpha_t S_{p-1})
       u_t = beta_t (v_t - A_t^T k_t) ;  S_p = A_t + k_t u_t^T ;  o_t = S_p^T q_t

   and appends ``(u_t, k_t, g_t)`` (KDA: ``G_p``) at slot p. As in the decode step, the token's
   own ``u_t`` enters its output in fp32; later window tokens read the ring copies (rounded to the
   ring dtype), exactly as a sequence of single decode steps would;
3. advances the cursor to ``c + T`` (``L`` is allowed: a full ring, flushed by the next step).

The checkpoint is only read (written on flush-first rows only). Low-precision checkpoints
(``replayssm.kernels.quant``): an int8 / fp8 one is read through its ``state_scale``; the fold of
step 1 writes it (and its scales) as a decode flush does, stochastically rounded where
``state_rng`` is given. A rollback of ``n`` tokens is
``cursor -= n``: for KDA the kept slots' running sums stay valid. Rows with ``cursor < 0`` are
idle. No host decision depends on tensor values.

Shapes: q, k (Bt, T, Hk, K) L2-normalised (q scaled by K^-1/2); v (Bt, T, HV, V); g (Bt, T, HV)
fp32 (GDN) or (Bt, T, HV, K) fp32 (KDA); beta (Bt, T, HV) fp32; state (Bt, HV, K, V); u_buf
(Bt, HV, L, V); k_buf (Bt, Hk, L, K); g_buf (Bt, HV, L) or (Bt, HV, L, K) fp32; cursor (Bt,)
int32 in [0, L].
"""

from __future__ import annotations

import torch

from ..quant import check_quant_args, load_state
from ..speculation import flush_first_counts
from .reference import SCALE_DIM, _decayed_history, check_shapes, delta_replay_materialize_reference

__all__ = ["check_verify_shapes", "delta_replay_verify_reference"]


def check_verify_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor):
    """(Bt, T, HV, Hk, L, K, V) of a verify step; ValueError when the tensors disagree."""
    if q.dim() != 4 or v.dim() != 4 or beta.dim() != 3:
        raise ValueError(f"q, k must be (Bt, T, Hk, K), v (Bt, T, HV, V), beta (Bt, T, HV); got {tuple(q.shape)}, "
                         f"{tuple(v.shape)}, {tuple(beta.shape)}")
    T = q.shape[1]
    if k.shape != q.shape or v.shape[1] != T or beta.shape[1] != T or g.shape[1] != T:
        raise ValueError(f"every input must carry the same T={T} window tokens in dim 1; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    Bt, HV, Hk, L, K, V = check_shapes(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, u_buf, k_buf, g_buf)
    if tuple(cursor.shape) != (Bt,):
        raise ValueError(f"cursor must be (Bt,) = ({Bt},); got {tuple(cursor.shape)}")
    if T < 1 or T > L:
        raise ValueError(f"a verify window holds 1..L={L} tokens; got T={T}")
    return Bt, T, HV, Hk, L, K, V


def delta_replay_verify_reference(
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
    """One verify step of T tokens per row (module notes). Returns o (Bt, T, HV, V) in ``v.dtype``
    (``out`` if given: idle rows keep its contents; else they are zero). ``state_scale`` (Bt, HV, V)
    fp32: the scales of an int8 / fp8 checkpoint; ``state_rng`` (Bt, 2) int64: stochastic rounding
    of the flush-first rows' fold."""
    Bt, T, HV, Hk, L, K, V = check_verify_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor)
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    grp = HV // Hk
    kda = g.dim() == 4
    dev = v.device
    active = cursor >= 0

    fold = flush_first_counts(cursor, T, L)
    c = torch.where(active, cursor - fold, torch.zeros_like(cursor)).long()
    delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, fold, state_scale, state_rng)
    s0 = load_state(state, state_scale, SCALE_DIM)

    slots = torch.arange(L, device=dev)
    outs = []
    for t in range(T):
        p = c + t
        a, gtot = _decayed_history(s0, u_buf, k_buf, g_buf, p, g[:, t])  # alpha_t S_{p-1}; G_p
        qf = q[:, t].float().repeat_interleave(grp, dim=1)
        kf = k[:, t].float().repeat_interleave(grp, dim=1)
        u = beta[:, t].float()[..., None] * (v[:, t].float() - torch.einsum("bhkv,bhk->bhv", a, kf))
        s = a + kf[..., None] * u[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", s, qf))
        sel = ((slots[None, :] == p[:, None]) & active[:, None])[:, None, :, None]  # (Bt, 1, L, 1)
        u_buf.copy_(torch.where(sel, u.to(u_buf.dtype)[:, :, None, :], u_buf))
        k_buf.copy_(torch.where(sel, k[:, t].to(k_buf.dtype)[:, :, None, :], k_buf))
        if kda:
            g_buf.copy_(torch.where(sel, gtot.to(g_buf.dtype)[:, :, None, :], g_buf))
        else:
            g_buf.copy_(torch.where(sel[..., 0], g[:, t].to(g_buf.dtype)[:, :, None], g_buf))

    cursor.copy_(torch.where(active, (c + T).to(cursor.dtype), cursor))
    o = torch.stack(outs, dim=1).to(v.dtype)  # (Bt, T, HV, V)
    act4 = active.view(Bt, 1, 1, 1)
    if out is None:
        return torch.where(act4, o, torch.zeros((), dtype=o.dtype, device=dev))
    out.copy_(torch.where(act4, o.to(out.dtype), out))
    return out
