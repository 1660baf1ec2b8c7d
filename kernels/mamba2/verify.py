"""Mamba-2 multi-token verify on the replay path (speculative decoding), PyTorch reference.

A verify step takes T new tokens per row (the last accepted token plus the drafts) on a
cache that already holds a checkpoint ``S0`` and ``c = cursor[b]`` ring entries, and:

1. **flush first** where the ring cannot hold the T tokens (``c + T > L``): the ``c`` buffered
   entries are folded into the checkpoint (``S0 <- S_c``, rounded once to the checkpoint dtype)
   and the row restarts at ``c = 0``. Only committed tokens are ever folded, so every token of
   the verify window stays roll-back-able until the next verify;
2. appends the T tokens' ``(x, dt, B)`` at slots ``c .. c + T - 1``;
3. computes every output from the one checkpoint read (output-only route, causal over the
   window): for window token t at slot ``p = c + t``, with ``Pcum_j = sum_{i<=j} dt_i``,

       y_t = exp(A Pcum_p) (S0 . C_t) + sum_{j<=p} dt_j exp(A (Pcum_p - Pcum_j)) (B_j . C_t) x_j + D x_t

   (then ``y_t *= z_t sigmoid(z_t)`` if a gate is given);
4. advances the cursor to ``c + T`` (which may be ``L``: a full ring; the next verify or
   decode step of the row flushes first).

Low-precision checkpoints (``replayssm.kernels.quant``): an int8 / fp8 one is read through its
``state_scale``; the fold of step 1 writes it (and its scales) as a decode flush does, rounded
stochastically where ``state_rng`` is given.

A rollback of ``n`` tokens is then ``cursor -= n`` (see ``replayssm.kernels.rollback``): the
rejected entries stay in the ring and are overwritten by the next step.

Rows with ``cursor < 0`` are idle (nothing of theirs read or written). Everything is selected
with ``torch.where`` (no host decision from tensor values), so a step can be captured in a
CUDA graph.
"""

from __future__ import annotations

import torch

from ..quant import check_quant_args, load_state
from ..speculation import flush_first_counts
from .reference import SCALE_DIM, mamba2_replay_materialize_reference, process_dt

__all__ = ["check_verify_shapes", "mamba2_replay_verify_reference"]


def check_verify_shapes(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, z=None):
    """(Bt, T, H, P, G, N, L) of a verify step's tensors; ValueError when they disagree."""
    if x.dim() != 4:
        raise ValueError(f"x must be (Bt, T, H, P); got {tuple(x.shape)}")
    Bt, T, H, P = x.shape
    if state.dim() != 4 or tuple(state.shape[:3]) != (Bt, H, P):
        raise ValueError(f"state must be (Bt, H, P, N) = ({Bt}, {H}, {P}, N); got {tuple(state.shape)}")
    N = state.shape[3]
    G = B.shape[2] if B.dim() == 4 else -1
    if G <= 0 or H % G != 0:
        raise ValueError(f"B must be (Bt, T, G, N) with H={H} a multiple of G; got {tuple(B.shape)}")
    L = x_buf.shape[2]
    if tuple(x_buf.shape) != (Bt, H, L, P) or tuple(dt_buf.shape) != (Bt, H, L) or tuple(B_buf.shape) != (Bt, G, L, N):
        raise ValueError(f"x_buf/dt_buf/B_buf must be (Bt,H,L,P)/(Bt,H,L)/(Bt,G,L,N) with (Bt,H,P,G,N)="
                         f"{(Bt, H, P, G, N)}; got {tuple(x_buf.shape)}, {tuple(dt_buf.shape)}, {tuple(B_buf.shape)}")
    if tuple(B.shape) != (Bt, T, G, N) or tuple(C.shape) != (Bt, T, G, N) or tuple(dt.shape) != (Bt, T, H):
        raise ValueError(f"B, C must be (Bt, T, G, N) and dt (Bt, T, H) = {(Bt, T, H)}; got {tuple(B.shape)}, "
                         f"{tuple(C.shape)}, {tuple(dt.shape)}")
    if tuple(cursor.shape) != (Bt,):
        raise ValueError(f"cursor must be (Bt,) = ({Bt},); got {tuple(cursor.shape)}")
    if z is not None and tuple(z.shape) != (Bt, T, H, P):
        raise ValueError(f"z must be (Bt, T, H, P); got {tuple(z.shape)}")
    if T < 1 or T > L:
        raise ValueError(f"a verify window holds 1..L={L} tokens; got T={T}")
    return Bt, T, H, P, G, N, L


def _flush_first(state, x_buf, dt_buf, B_buf, cursor, A, T, L, state_scale, state_rng):
    """Fold the ring of the rows that cannot hold T more entries; returns their new cursors (long,
    0 for idle rows too; the caller masks them)."""
    fold = flush_first_counts(cursor, T, L)
    c = torch.where(cursor >= 0, cursor - fold, torch.zeros_like(cursor)).long()
    # rows with nothing to fold keep their checkpoint (materialize zeroes ``fold``)
    mamba2_replay_materialize_reference(state, x_buf, dt_buf, B_buf, fold, A, state_scale, state_rng)
    return c


def mamba2_replay_verify_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    x_buf: torch.Tensor,
    dt_buf: torch.Tensor,
    B_buf: torch.Tensor,
    cursor: torch.Tensor,
    A: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_softplus: bool = True,
    out: torch.Tensor | None = None,
    state_scale: torch.Tensor | None = None,
    state_rng: torch.Tensor | None = None,
) -> torch.Tensor:
    """One verify step of T tokens per row (module notes).

    Args:
        x: (Bt, T, H, P) activation dtype. dt: (Bt, T, H) raw dt (before bias and softplus).
        B, C: (Bt, T, G, N) activation dtype. z: (Bt, T, H, P) gate or None.
        state: (Bt, H, P, N) checkpoint; rewritten in place only on rows that flush first.
        x_buf (Bt, H, L, P), dt_buf (Bt, H, L) fp32 processed dt, B_buf (Bt, G, L, N): the rings.
        cursor: (Bt,) int32 in [0, L] (entries buffered); < 0 idle. Advanced in place by T.
        A: (H,) fp32 negative. dt_bias, D: (H,) or None.
        out: optional (Bt, T, H, P) output; idle rows keep its contents.
        state_scale: (Bt, H, P) fp32 scales of an int8 / fp8 checkpoint (rewritten on flush-first
            rows); state_rng: (Bt, 2) int64 [seed, counter], stochastic rounding of those rows'
            fold (``replayssm.kernels.quant``).

    Returns:
        y (Bt, T, H, P) in ``x.dtype`` (``out`` if given; idle rows zero when ``out`` is None).
    """
    Bt, T, H, P, G, N, L = check_verify_shapes(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, z)
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    dev = x.device
    active = cursor >= 0
    c = _flush_first(state, x_buf, dt_buf, B_buf, cursor, A, T, L, state_scale, state_rng)

    # 1. append the window at slots c .. c + T - 1 (active rows)
    pos = c[:, None] + torch.arange(T, device=dev)[None, :]  # (Bt, T)
    dtp = process_dt(dt, dt_bias, dt_softplus)  # (Bt, T, H) fp32
    act4 = active.view(Bt, 1, 1, 1)
    x_new = x_buf.scatter(2, pos.view(Bt, 1, T, 1).expand(Bt, H, T, P), x.transpose(1, 2).to(x_buf.dtype))
    dt_new = dt_buf.scatter(2, pos.view(Bt, 1, T).expand(Bt, H, T), dtp.transpose(1, 2).to(dt_buf.dtype))
    b_new = B_buf.scatter(2, pos.view(Bt, 1, T, 1).expand(Bt, G, T, N), B.transpose(1, 2).to(B_buf.dtype))
    x_buf.copy_(torch.where(act4, x_new, x_buf))
    dt_buf.copy_(torch.where(active.view(Bt, 1, 1), dt_new, dt_buf))
    B_buf.copy_(torch.where(act4, b_new, B_buf))

    # 2. outputs: the checkpoint read once, the ring causally per window token
    slots = torch.arange(L, device=dev)
    used = slots[None, :] < (c + T)[:, None]  # (Bt, L)
    zero = torch.zeros((), device=dev)
    dtw = torch.where(used[:, None, :], dt_new.float(), zero)  # (Bt, H, L)
    pcum = torch.cumsum(dtw, dim=-1)
    p_t = torch.gather(pcum, 2, pos.view(Bt, 1, T).expand(Bt, H, T))  # (Bt, H, T)
    a = A.float().view(1, H, 1, 1)
    causal = (slots[None, None, :] <= pos[:, :, None])  # (Bt, T, L)
    w = dtw[:, :, None, :] * torch.exp(torch.clamp(a * (p_t[..., None] - pcum[:, :, None, :]), max=0.0))
    w = torch.where(causal[:, None], w, zero)  # (Bt, H, T, L)
    abar = torch.exp(torch.clamp(A.float().view(1, H, 1) * p_t, max=0.0))  # (Bt, H, T)
    rep = H // G
    bw = torch.where(used[:, None, :, None], b_new.float(), zero)  # (Bt, G, L, N)
    bc = torch.einsum("bgln,btgn->bgtl", bw, C.float()).repeat_interleave(rep, dim=1)  # (Bt, H, T, L)
    wbc = torch.where(causal[:, None], w * bc, zero)
    # token t reads slots j <= p_t only (selected, not multiplied by 0: a later window token's
    # inputs never reach an earlier token's output, whatever they hold)
    xw = torch.where(causal[:, None, :, :, None], x_new.float()[:, :, None], zero)  # (Bt, H, T, L, P)
    ch = C.float().repeat_interleave(rep, dim=2)  # (Bt, T, H, N)
    s0c = torch.einsum("bhpn,bthn->bhtp", load_state(state, state_scale, SCALE_DIM), ch)
    y = abar[..., None] * s0c + torch.einsum("bhtl,bhtlp->bhtp", wbc, xw)  # (Bt, H, T, P)
    y = y.transpose(1, 2)  # (Bt, T, H, P)
    if D is not None:
        y = y + D.float().view(1, 1, H, 1) * x.float()
    if z is not None:
        zf = z.float()
        y = y * (zf * torch.sigmoid(zf))

    cursor.copy_(torch.where(active, (c + T).to(cursor.dtype), cursor))
    y = y.to(x.dtype)
    if out is None:
        return torch.where(act4, y, torch.zeros((), dtype=y.dtype, device=dev))
    out.copy_(torch.where(act4, y, out))
    return out
