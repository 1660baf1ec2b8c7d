"""The per-row replay cursor's advance, shared by the Mamba-2 and delta-rule kernels.

After a decode step every active row's cursor moves to ``(c + 1) % L``; rows with a negative
cursor are idle and keep theirs. The kernels that advance it inside another launch call
``advanced_cursor``; ``advance_cursor_triton`` is the stand-alone launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["advance_cursor_triton", "advanced_cursor"]


@triton.jit
def advanced_cursor(c, L):
    """The cursor after this step: ``(c + 1) % L``; idle rows (``c < 0``) keep theirs."""
    return tl.where(c >= 0, (c + 1) % L, c)


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
