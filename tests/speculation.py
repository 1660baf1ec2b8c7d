"""Shared helpers for the speculative-decoding (rollback) tests of the references."""

from __future__ import annotations

import torch


def draft_plan(gen: torch.Generator, cursor: torch.Tensor, L: int, max_drafts: int = 4):
    """One round of speculation per row: (drafts, accepted), (Bt,) int64.

    A row drafts 1..max_drafts tokens when their verification steps stay before its flush slot
    (``cursor + drafts <= L - 1``) and accepts a random prefix of 0..drafts of them; otherwise it
    takes one ordinary step (drafts = accepted = 1)."""
    drafts = torch.randint(1, max_drafts + 1, cursor.shape, generator=gen)
    spec = cursor + drafts <= L - 1
    drafts = torch.where(spec, drafts, torch.ones_like(drafts))
    accepted = torch.where(spec, torch.randint(0, max_drafts + 1, cursor.shape, generator=gen) % (drafts + 1), drafts)
    return drafts, accepted


def step_rows(cursor: torch.Tensor, run: torch.Tensor, step):
    """``step()`` with the rows outside ``run`` (bool (Bt,)) idle: their cursors are -1 during
    the call and restored after it. Returns what ``step`` returns."""
    saved = cursor.clone()
    cursor.copy_(torch.where(run, cursor, torch.full_like(cursor, -1)))
    out = step()
    cursor.copy_(torch.where(run, cursor, saved))
    return out
