"""Pieces of a speculative verify step shared by every layer kind: where a row's verify window
starts, the short causal conv over T tokens with a roll-back-able history, and the rollback.

Cursor rule (flush first): a row at cursor ``c`` whose ring cannot hold the T window tokens
(``c + T > L``) folds its ring into the checkpoint and starts the window at slot 0; otherwise
at slot ``c``. ``verify_start`` gives that slot; the SSM verify references apply the same rule.

Conv history: the conv before the SSM is stateful too (its state holds the last K inputs), so a
rollback must restore it. ``conv_hist`` (Bt, C, K + L), in the conv state's dtype, holds for a row
at cursor ``c``: columns ``0 .. K-1`` the conv state when the row's ring was empty (slot 0), and
column ``K + j`` the conv input of the token at ring slot ``j``. The conv state at cursor ``c`` is
then ``conv_hist[:, :, c : c + K]``, so a rollback to cursor ``c'`` is a gather of K columns. Each
verify first writes the current conv state at its window's start (``start .. start + K - 1``), so
the history never depends on what ran before (a fold, a stock prefill chunk).

Rows with ``cursor < 0`` are idle (nothing of theirs written). No host decision depends on tensor
values, so these can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = ["advance_fold_counters", "conv_rollback_reference", "conv_verify_reference", "flush_first_counts",
           "rollback_cursor_reference", "verify_start"]


def verify_start(cursor: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """(Bt,) long: the ring slot where each row's T-token verify window starts (0 on rows that
    flush first and on idle rows)."""
    flush = (cursor + T > L) | (cursor < 0)
    return torch.where(flush, torch.zeros_like(cursor), cursor).long()


def flush_first_counts(cursor: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """(Bt,) in the cursor's dtype: the ring entries each row folds into its checkpoint before a
    T-token window (its cursor where ``c + T > L``, else 0; idle rows 0)."""
    return torch.where((cursor > 0) & (cursor + T > L), cursor, torch.zeros_like(cursor))


def advance_fold_counters(state_rng: torch.Tensor, cursor: torch.Tensor, T: int, L: int) -> None:
    """Advance the stochastic-rounding counter (``state_rng[:, 1]``) of every row that folds before a
    T-token window: what the reference's fold does for those rows, as one device op a verify launch
    runs first (its kernel then draws under the advanced counters)."""
    state_rng[:, 1].add_((flush_first_counts(cursor, T, L) > 0).to(torch.int64))


def _window_columns(start: torch.Tensor, width: int, C: int) -> torch.Tensor:
    """(Bt, C, width) long column indices ``start .. start + width - 1``."""
    cols = start[:, None] + torch.arange(width, device=start.device)[None, :]
    return cols[:, None, :].expand(start.shape[0], C, width)


def conv_verify_reference(conv_hist: torch.Tensor, conv_state: torch.Tensor, start: torch.Tensor,
                          active: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          activation: str | None) -> torch.Tensor:
    """The causal depthwise conv over T tokens per row, in place on ``conv_state`` / ``conv_hist``.

    Args:
        conv_hist: (Bt, C, K + L) history (module notes). conv_state: (Bt, C, K) the current conv
            state (transformers' cache tensor), left holding the last K inputs after the window.
        start: (Bt,) long slot of the window's first token (``verify_start``). active: (Bt,) bool.
        x: (Bt, T, C) conv inputs. weight: (C, K). bias: (C,) or None. activation: None | silu.

    Returns:
        (Bt, T, C) conv outputs in ``x.dtype`` (fp32 accumulation).
    """
    Bt, C, K = conv_state.shape
    T = x.shape[1]
    cols = _window_columns(start, K + T, C)  # (Bt, C, K + T)
    window = torch.cat([conv_state, x.transpose(1, 2).to(conv_state.dtype)], dim=-1)
    act3 = active.view(Bt, 1, 1)
    conv_hist.copy_(torch.where(act3, conv_hist.scatter(2, cols, window), conv_hist))
    taps = window.float().unfold(2, K, 1)[:, :, 1:]  # (Bt, C, T, K): token t sees inputs t+1 .. t+K
    out = (taps * weight.float()[:, None, :]).sum(-1)  # (Bt, C, T)
    if bias is not None:
        out = out + bias.float()[:, None]
    if activation in ("silu", "swish"):
        out = torch.nn.functional.silu(out)
    conv_state.copy_(torch.where(act3, window[:, :, T:], conv_state))
    return out.transpose(1, 2).to(x.dtype)


def conv_rollback_reference(conv_hist: torch.Tensor, conv_state: torch.Tensor, cursor: torch.Tensor) -> None:
    """Restore each active row's conv state at (already rolled back) ``cursor``: columns
    ``cursor .. cursor + K - 1`` of ``conv_hist``."""
    Bt, C, K = conv_state.shape
    active = cursor >= 0
    cols = _window_columns(cursor.clamp(min=0).long(), K, C)
    conv_state.copy_(torch.where(active.view(Bt, 1, 1), conv_hist.gather(2, cols).to(conv_state.dtype), conv_state))


def rollback_cursor_reference(cursor: torch.Tensor, n: torch.Tensor) -> None:
    """``cursor -= n`` on active rows (n: (Bt,) or a scalar tensor, each ``0 <= n <= cursor``, which
    the caller checks: a rollback past the ring's start cannot be served)."""
    cursor.copy_(torch.where(cursor >= 0, cursor - n.to(cursor.dtype), cursor))
