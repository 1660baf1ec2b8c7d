"""The per-row replay cursor's advance, used by the delta-rule kernels.

After a decode step every active row's cursor moves to ``(c + 1) % L``; rows with a negative
cursor are idle and keep theirs. Kernels that advance it inside another launch call
``advanced_cursor``; ``advance_cursor_triton`` is the stand-alone launch.

A launch whose programs must all read a row's cursor before one of them advances it can count
arrivals on the cursor word itself: each program adds ``ARRIVAL_UNIT`` with an atomic and the
row's last program to arrive stores the next cursor, which also clears the count; between
launches the word is the plain cursor, and during one its low byte still is (``cursor_of_word``).
Either the atomic reads the cursor (``arrive_on_cursor``: one trip to memory, but every program
waits for its turn at the word before it can start) or a plain load reads it and the arrival
(``count_arrival``) comes later, off the critical path, and hits the line the load brought into
the L2. Needs int32 cursors in ``[-128, 127]`` (``L <= 127``; -1 marks an idle row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["ARRIVAL_UNIT", "MAX_ARRIVAL_L", "advance_cursor_triton", "advanced_cursor", "arrive_on_cursor",
           "count_arrival", "cursor_of_word", "cursor_word_counts_arrivals"]

ARRIVAL_UNIT = 256  # one arrival; the cursor lives in the low byte
MAX_ARRIVAL_L = 127  # longest buffer whose cursors fit the low byte
# the same for the Triton functions below (globals they read must be constexpr)
_UNIT = tl.constexpr(ARRIVAL_UNIT)
_COUNT_SHIFT = tl.constexpr(ARRIVAL_UNIT.bit_length() - 1)  # arrivals = (word - cursor) >> 8
_LOW_BYTE = tl.constexpr(ARRIVAL_UNIT - 1)
_SIGN_BIT = tl.constexpr(ARRIVAL_UNIT // 2)


def cursor_word_counts_arrivals(cursor: torch.Tensor, L: int) -> bool:
    """Whether ``cursor`` (int32 words) can carry arrival counts for buffers of length ``L``."""
    return cursor.dtype == torch.int32 and L <= MAX_ARRIVAL_L


@triton.jit
def advanced_cursor(c, L):
    """The cursor after this step: ``(c + 1) % L``; idle rows (``c < 0``) keep theirs."""
    return tl.where(c >= 0, (c + 1) % L, c)


@triton.jit
def cursor_of_word(word):
    """The cursor held by a cursor word (its low byte, sign extended), whatever the count above it."""
    return ((word & _LOW_BYTE) ^ _SIGN_BIT) - _SIGN_BIT


@triton.jit
def arrive_on_cursor(ptr, SEM: tl.constexpr):
    """Read the int32 cursor word at ``ptr`` and arrive, in one atomic. Returns ``(c, n)``:
    the cursor and the number of programs that arrived before this one (this launch)."""
    word = tl.atomic_add(ptr, _UNIT, sem=SEM)
    c = cursor_of_word(word)
    return c, (word - c) >> _COUNT_SHIFT


@triton.jit
def count_arrival(ptr, c, SEM: tl.constexpr):
    """Arrive at the cursor word at ``ptr`` whose cursor ``c`` this program has read (the caller
    makes sure the read has returned, e.g. a barrier after a branch on ``c``); returns the number
    of programs that arrived before this one."""
    return (tl.atomic_add(ptr, _UNIT, sem=SEM) - c) >> _COUNT_SHIFT


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
