"""Plain PyTorch reference of the Mamba-2 ReplaySSM decode step (also the CPU path).

Notation (per row b, head h; group g = h // (H // G)):

* checkpoint ``S0`` (P, N); ring buffer entries j = 0..c-1 hold (x_j, dt_j, B_j) of the
  tokens received since the checkpoint; ``c = cursor[b]``; the current token is entry c.
* ``Pcum_j = sum_{i<=j} dt_i``; weight ``w_j = dt_j * exp(A * (Pcum_c - Pcum_j))``;
  total decay ``abar = exp(A * Pcum_c)``.
* ``S_c = abar * S0 + sum_{j<=c} w_j x_j B_j^T``; ``y = S_c C + D x``; optional gate
  ``y *= z * sigmoid(z)``.
* Flush when ``c == L - 1``: ``S0 <- S_c`` (rounded once to the checkpoint dtype) and the
  buffer restarts empty. The cursor always advances to ``(c + 1) % L``.
* Rows with ``cursor < 0`` are idle: nothing of theirs is read or written.
* Low-precision checkpoints (``replayssm.kernels.quant``): int8 / fp8 ones come with
  ``state_scale`` (B, H, P) fp32, one scale per head-dim lane over N; ``state_rng`` (B, 2)
  int64 [seed, flush counter] makes the flush's rounding stochastic (any dtype below fp32).

The reference always forms ``S_c`` (state-and-output route) and selects per row with
``torch.where``; it makes no host-side decision from tensor values, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant import check_quant_args, commit_materialized, load_state, store_state

#: the state dimension the int8 / fp8 scales run over (S0 is (B, H, P, N))
SCALE_DIM = -1

__all__ = [
    "mamba2_replay_decode_reference",
    "mamba2_replay_materialize_reference",
    "mamba2_step_decode_reference",
    "process_dt",
]


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """dt (B, H) any float dtype -> fp32 ``softplus(dt + dt_bias)`` (softplus linear above 20)."""
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias.float()
    if dt_softplus:
        d = F.softplus(d)  # threshold 20: identity above, like the stock kernels
    return d


def _window_state(state, x_buf, dt_buf, B_buf, c, A):
    """Reconstruct S_c (B, H, P, N) fp32 from checkpoint and buffer entries 0..c (inclusive)."""
    Bsz, H, L, P = x_buf.shape
    G = B_buf.shape[1]
    pos = torch.arange(L, device=x_buf.device)
    valid = pos[None, :] <= c[:, None]  # (B, L)
    dtw = torch.where(valid[:, None, :], dt_buf.float(), torch.zeros((), device=dt_buf.device))
    pcum = torch.cumsum(dtw, dim=-1)  # (B, H, L)
    p_c = torch.gather(pcum, 2, c.view(Bsz, 1, 1).expand(Bsz, H, 1))  # (B, H, 1)
    a = A.float().view(1, H, 1)
    w = dtw * torch.exp(torch.clamp(a * (p_c - pcum), max=0.0))  # (B, H, L)
    abar = torch.exp(torch.clamp(a * p_c, max=0.0))[..., 0]  # (B, H)
    xw = torch.where(valid[:, None, :, None], x_buf.float(), torch.zeros((), device=x_buf.device))
    bw = torch.where(valid[:, None, :, None], B_buf.float(), torch.zeros((), device=B_buf.device))
    bw = bw.repeat_interleave(H // G, dim=1)  # (B, H, L, N)
    s = abar[..., None, None] * state.float()
    s = s + torch.einsum("bhl,bhlp,bhln->bhpn", w, xw, bw)
    return s


def mamba2_replay_decode_reference(
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
    arrivals: torch.Tensor | None = None,
    state_scale: torch.Tensor | None = None,
    state_rng: torch.Tensor | None = None,
) -> torch.Tensor:
    """One ReplaySSM decode step for a batch of rows, each at its own cursor.

    Args:
        x: (B, H, P) current x, activation dtype.
        dt: (B, H) raw dt (before bias and softplus).
        B, C: (B, G, N) current B and C, activation dtype.
        state: (B, H, P, N) checkpoint, fp32/bf16/fp16; written in place on flush rows.
        x_buf: (B, H, L, P) ring of x, activation dtype; entry ``cursor`` is written.
        dt_buf: (B, H, L) fp32 ring of processed dt (after bias and softplus).
        B_buf: (B, G, L, N) ring of B, activation dtype.
        cursor: (B,) int32 number of buffered entries; < 0 marks an idle row. Advanced in
            place to ``(cursor + 1) % L`` on active rows.
        A: (H,) fp32, negative. dt_bias, D: (H,) or None. z: (B, H, P) or None.
        out: optional (B, H, P) output; idle rows keep its contents.
        arrivals: scratch of the Triton kernel's in-launch cursor advance (int32, at least B
            entries, zero between launches; see ``launch.launch_replay``); unused here.
        state_scale: (B, H, P) fp32 scales of an int8 / fp8 checkpoint (written on flush rows).
        state_rng: (B, 2) int64 [seed, counter]: stochastic rounding on flush rows (their
            counters advance by one).

    Returns:
        y (B, H, P) in ``x.dtype`` (``out`` if given).
    """
    Bsz, H, L, P = x_buf.shape
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    active = cursor >= 0
    c = cursor.clamp(min=0).long()
    s0 = load_state(state, state_scale, SCALE_DIM)

    # 1. Write the current token into its slot (active rows only).
    dtp = process_dt(dt, dt_bias, dt_softplus)
    x_new = x_buf.scatter(2, c.view(Bsz, 1, 1, 1).expand(Bsz, H, 1, P), x.unsqueeze(2).to(x_buf.dtype))
    dt_new = dt_buf.scatter(2, c.view(Bsz, 1, 1).expand(Bsz, H, 1), dtp.unsqueeze(2).to(dt_buf.dtype))
    G, N = B_buf.shape[1], B_buf.shape[3]
    b_new = B_buf.scatter(2, c.view(Bsz, 1, 1, 1).expand(Bsz, G, 1, N), B.unsqueeze(2).to(B_buf.dtype))
    act4 = active.view(Bsz, 1, 1, 1)
    x_buf.copy_(torch.where(act4, x_new, x_buf))
    dt_buf.copy_(torch.where(active.view(Bsz, 1, 1), dt_new, dt_buf))
    B_buf.copy_(torch.where(act4, b_new, B_buf))

    # 2. Reconstruct the state and read the output.
    s = _window_state(s0, x_new, dt_new, b_new, c, A)
    ch = C.float().repeat_interleave(H // G, dim=1)  # (B, H, N)
    y = torch.einsum("bhpn,bhn->bhp", s, ch)
    if D is not None:
        y = y + D.float().view(1, H, 1) * x.float()
    if z is not None:
        zf = z.float()
        y = y * (zf * torch.sigmoid(zf))

    # 3. Flush rows fold the window into the checkpoint; advance cursors.
    flush = active & (c == L - 1)
    _write_checkpoint(state, state_scale, state_rng, s, flush)
    cursor.copy_(torch.where(active, ((c + 1) % L).to(cursor.dtype), cursor))

    y = y.to(x.dtype)
    if out is None:
        return torch.where(act4[..., 0], y, torch.zeros((), dtype=y.dtype, device=y.device))
    out.copy_(torch.where(act4[..., 0], y, out))
    return out


def _write_checkpoint(state, state_scale, state_rng, s, rows) -> None:
    """The new checkpoint ``s`` (fp32) on ``rows`` (B,) bool, rounded once to the state dtype."""
    if state_scale is None and state_rng is None:
        state.copy_(torch.where(rows.view(-1, 1, 1, 1), s.to(state.dtype), state))
    else:
        store_state(state, state_scale, state_rng, s, rows, SCALE_DIM)


def mamba2_replay_materialize_reference(
    state: torch.Tensor,
    x_buf: torch.Tensor,
    dt_buf: torch.Tensor,
    B_buf: torch.Tensor,
    cursor: torch.Tensor,
    A: torch.Tensor,
    state_scale: torch.Tensor | None = None,
    state_rng: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fold the buffered entries into the checkpoint and empty the buffer.

    Returns the exact fp32 state (B, H, P, N) after the buffered tokens; also writes it
    (rounded) into ``state`` and sets active cursors to 0. Rows with cursor <= 0 keep
    their checkpoint (a quantized one is rewritten only where entries were folded; the scales
    and random-number state as in ``mamba2_replay_decode_reference``).
    """
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    c = (cursor.clamp(min=1) - 1).long()  # index of the last buffered entry
    s0 = load_state(state, state_scale, SCALE_DIM)
    s = _window_state(s0, x_buf, dt_buf, B_buf, c, A)
    return commit_materialized(state, state_scale, state_rng, cursor, s, s0, SCALE_DIM)


def mamba2_step_decode_reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    A: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_softplus: bool = True,
) -> torch.Tensor:
    """The ordinary per-step recurrence (the baseline): ``S <- exp(A dt) S + dt x B^T``.

    ``state`` (B, H, P, N) is read and written in place every step (fp32 arithmetic,
    rounded to the state dtype). Returns y (B, H, P) in ``x.dtype``.
    """
    H = x.shape[1]
    G = B.shape[1]
    dtp = process_dt(dt, dt_bias, dt_softplus)  # (B, H)
    bh = B.float().repeat_interleave(H // G, dim=1)
    ch = C.float().repeat_interleave(H // G, dim=1)
    decay = torch.exp(dtp * A.float().view(1, H))
    s = state.float() * decay[..., None, None] + (dtp[..., None, None] * bh[:, :, None, :]) * x.float()[..., None]
    state.copy_(s.to(state.dtype))
    y = torch.einsum("bhpn,bhn->bhp", s, ch)
    if D is not None:
        y = y + D.float().view(1, H, 1) * x.float()
    if z is not None:
        zf = z.float()
        y = y * (zf * torch.sigmoid(zf))
    return y.to(x.dtype)
