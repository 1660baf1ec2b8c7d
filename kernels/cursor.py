"""The per-row replay cursor's advance, shared by the Mamba-2 and delta-rule kernels.

After a decode step every active row's cursor moves to ``(c + 1) % L``; rows with a negative
cursor are idle and keep theirs. The kernels that advance it inside another launch call
``advanced_cursor``; ``advance_cursor_triton`` is the stand-alone launch.

A launch whose programs must all read a row's cursor before one of them advances it can
count arrivals on the cursor word itself (``arrive_on_cursor``): each program adds
``ARRIVAL_UNIT`` with one atomic, whose result gives both the cursor (the low byte, sign
extended) and how many programs arrived before it; the last one to arrive stores the next
cursor, which also clears the count. Between launches the word is the plain cursor. The read
and the arrival are one memory operation, so the count needs no separate counter, no barrier
and no ordering argument, and a cold cursor costs one trip to memory instead of two. Needs
int32 cursors in ``[-128, 127]`` (``L <= 127``; -1 marks an idle row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["ARRIVAL_UNIT", "MAX_ARRIVAL_L", "advance_cursor_triton", "advanced_cursor", "arrive_on_cursor"]

ARRIVAL_UNIT = 256  # one arrival; the cursor lives in the low byte
MAX_ARRIVAL_L = 127  # longest buffer whose cursors fit the low byte


@triton.jit
def advanced_cursor(c, L):
    """The cursor after this step: ``(c + 1) % L``; idle rows (``c < 0``) keep theirs."""
    return tl.where(c >= 0, (c + 1) % L, c)


@triton.jit
def arrive_on_cursor(ptr, SEM: tl.constexpr):
    """Read the int32 cursor word at ``ptr`` and arrive, in one atomic. Returns ``(c, n)``:
    the cursor and the number of programs that arrived before this one (this launch)."""
    word = tl.atomic_add(ptr, 256, sem=SEM)
    c = ((word & 255) ^ 128) - 128
    return c, (word - c) >> 8


@triton.jit
def _advance_cursor_kernel(cur_ptr, sc_b, Bt, L, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < Bt
    c = tl.load(cur_ptr + offs * sc_b, mask=m, other=-1)
    tl.store(cur_ptr + offs * sc_b, advanced_cursor(c, L), mask=m)


def advance_cursor_triton(cursor: torch.Tensor, L: int) -> None:
    """``cursor <- (cursor + 1) % L`` where ``cursor >= 0``; cursor (B,) int32, in place, one
    small launch, no host sync."""
    Bt = cursor.shape[0]
    if Bt == 0:
        return
    BLOCK = 256
    _advance_cursor_kernel[(triton.cdiv(Bt, BLOCK),)](cursor, cursor.stride(0), Bt, L, BLOCK=BLOCK)
