"""One layer's rollback in one launch: cursors back by n, conv states restored from the conv history,
every remaining entry marked committed (semantics and layouts: ``speculation.py``).

A speculative round that rejects drafts rolls every SSM layer back; as PyTorch ops that is about a
dozen small launches per layer, host time the GPU waits for in a round that already synchronises.
One program per row reads the row's cursor once, then copies its K conv-state columns channel block
by channel block and writes the new cursor and mark.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import resolve_backend
from .speculation import conv_rollback_reference, rollback_cursor_reference

__all__ = ["layer_rollback", "layer_rollback_reference", "layer_rollback_triton"]


def layer_rollback_reference(cursor: torch.Tensor, n: torch.Tensor | int, conv_hist: torch.Tensor,
                             conv_state: torch.Tensor, committed: torch.Tensor) -> None:
    """In place: each active row's ``cursor`` (Bt,) int32 moves back by ``n`` (an int, or a (Bt,) or
    scalar int32 tensor; ``0 <= n <= cursor``, which the caller checks), its ``conv_state`` (Bt, C, K)
    becomes columns ``cursor .. cursor + K - 1`` of ``conv_hist`` (Bt, C, K + L), and ``committed``
    (Bt,) int32 the new cursor (0 on idle rows, ``cursor < 0``)."""
    rollback_cursor_reference(cursor, torch.as_tensor(n, device=cursor.device))
    conv_rollback_reference(conv_hist, conv_state, cursor)
    committed.copy_(torch.where(cursor >= 0, cursor, 0))


@triton.jit
def _rollback_kernel(cursor, n, n_value, hist, state, committed, C, n_stride, h_b, h_c, h_k, s_b, s_c, s_k,
                     K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, N_TENSOR: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.load(cursor + b)
    if c < 0:
        tl.store(committed + b, 0)
        return
    if N_TENSOR:
        c = c - tl.load(n + b * n_stride)
    else:
        c = c - n_value
    offs_k = tl.arange(0, BLOCK_K)
    mk = offs_k < K
    for c0 in range(0, C, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        m = (ch < C)[:, None] & mk[None, :]
        cols = tl.load(hist + b * h_b + ch[:, None] * h_c + (c + offs_k)[None, :] * h_k, mask=m)
        tl.store(state + b * s_b + ch[:, None] * s_c + offs_k[None, :] * s_k, cols.to(state.dtype.element_ty), mask=m)
    tl.store(cursor + b, c)
    tl.store(committed + b, c)


def layer_rollback_triton(cursor: torch.Tensor, n: torch.Tensor | int, conv_hist: torch.Tensor,
                          conv_state: torch.Tensor, committed: torch.Tensor) -> None:
    """``layer_rollback_reference`` in one launch (int32 cursors); an int ``n`` travels as a kernel
    argument (no host-to-device copy)."""
    Bt, C, K = conv_state.shape
    if cursor.dtype != torch.int32 or committed.dtype != torch.int32:
        raise ValueError(f"cursor and committed must be int32; got {cursor.dtype}, {committed.dtype}")
    if Bt == 0:
        return
    per_row = isinstance(n, torch.Tensor)
    if per_row:
        n = n.to(device=cursor.device, dtype=torch.int32)
    block_k = triton.next_power_of_2(K)
    _rollback_kernel[(Bt,)](cursor, n if per_row else cursor, 0 if per_row else int(n), conv_hist, conv_state,
                            committed, C, n.stride(0) if per_row and n.dim() else 0, *conv_hist.stride(),
                            *conv_state.stride(), K=K, BLOCK_C=max(16, 2048 // block_k), BLOCK_K=block_k,
                            N_TENSOR=per_row, num_warps=4)


def layer_rollback(cursor, n, conv_hist, conv_state, committed, backend: str = "auto") -> None:
    """``layer_rollback_reference`` on the chosen backend (``backend.py``)."""
    if resolve_backend(backend, cursor.device) == "triton":
        layer_rollback_triton(cursor, n, conv_hist, conv_state, committed)
    else:
        layer_rollback_reference(cursor, n, conv_hist, conv_state, committed)
