"""Rollback in one launch: cursors back by n, conv states restored from the conv history, every
remaining entry marked committed (semantics and layouts: ``speculation.py``).

A speculative round that rejects drafts rolls every SSM layer back; as PyTorch ops that is about a
dozen small launches per layer, host time the GPU waits for in a round that already synchronises.
One program per row reads the row's cursor once, then copies its K conv-state columns channel block
by channel block and writes the new cursor and mark. ``layers_rollback`` does it for several layers
of one shape in one launch (a program per layer and row, the layers' tensors found through tables of
their addresses): the per-layer launches' host time, a few dozen microseconds each, was most of
what a rejecting round costs beyond an accepting one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import resolve_backend
from .speculation import conv_rollback_reference, rollback_cursor_reference

__all__ = ["layer_rollback", "layer_rollback_reference", "layer_rollback_triton", "layers_rollback",
           "layers_rollback_reference", "layers_rollback_table", "layers_rollback_triton"]


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
def _rollback_row(cursor, b, n_back, hist, state, committed, C, h_b, h_c, h_k, s_b, s_c, s_k,
                  K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row b of one layer: back by n_back, its conv state the K history columns there, marked committed."""
    c = tl.load(cursor + b)
    if c < 0:
        tl.store(committed + b, 0)
        return
    c = c - n_back
    offs_k = tl.arange(0, BLOCK_K)
    mk = offs_k < K
    for c0 in range(0, C, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        m = (ch < C)[:, None] & mk[None, :]
        cols = tl.load(hist + b * h_b + ch[:, None] * h_c + (c + offs_k)[None, :] * h_k, mask=m)
        tl.store(state + b * s_b + ch[:, None] * s_c + offs_k[None, :] * s_k, cols.to(state.dtype.element_ty), mask=m)
    tl.store(cursor + b, c)
    tl.store(committed + b, c)


@triton.jit
def _rollback_kernel(cursor, n, n_value, hist, state, committed, C, n_stride, h_b, h_c, h_k, s_b, s_c, s_k,
                     K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, N_TENSOR: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    if N_TENSOR:
        n_back = tl.load(n + b * n_stride)
    else:
        n_back = n_value
    _rollback_row(cursor, b, n_back, hist, state, committed, C, h_b, h_c, h_k, s_b, s_c, s_k, K, BLOCK_C, BLOCK_K)


@triton.jit
def _rollback_layers_kernel(table, n_value, C, h_b, h_c, h_k, s_b, s_c, s_k, K: tl.constexpr,
                            BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, HIST: tl.constexpr, STATE: tl.constexpr,
                            MARK_ONLY: tl.constexpr):
    layer = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    layers = tl.num_programs(0)
    cursor = tl.load(table + layer).to(tl.pointer_type(tl.int32))
    committed = tl.load(table + 3 * layers + layer).to(tl.pointer_type(tl.int32))
    if MARK_ONLY:  # nothing rolled back: every entry committed
        tl.store(committed + b, tl.maximum(tl.load(cursor + b), 0))
    else:
        hist = tl.load(table + layers + layer).to(tl.pointer_type(HIST))
        state = tl.load(table + 2 * layers + layer).to(tl.pointer_type(STATE))
        _rollback_row(cursor, b, n_value, hist, state, committed, C, h_b, h_c, h_k, s_b, s_c, s_k, K, BLOCK_C,
                      BLOCK_K)


def _blocks(K: int) -> dict:
    block_k = triton.next_power_of_2(K)
    return dict(K=K, BLOCK_C=max(16, 2048 // block_k), BLOCK_K=block_k)


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
    _rollback_kernel[(Bt,)](cursor, n if per_row else cursor, 0 if per_row else int(n), conv_hist, conv_state,
                            committed, C, n.stride(0) if per_row and n.dim() else 0, *conv_hist.stride(),
                            *conv_state.stride(), **_blocks(K), N_TENSOR=per_row, num_warps=4)


def layer_rollback(cursor, n, conv_hist, conv_state, committed, backend: str = "auto") -> None:
    """``layer_rollback_reference`` on the chosen backend (``backend.py``)."""
    if resolve_backend(backend, cursor.device) == "triton":
        layer_rollback_triton(cursor, n, conv_hist, conv_state, committed)
    else:
        layer_rollback_reference(cursor, n, conv_hist, conv_state, committed)


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def layers_rollback_reference(layers, n: int, table: torch.Tensor | None = None) -> None:
    """``layer_rollback_reference`` of each (cursor, conv_hist, conv_state, committed) of ``layers``
    by the same int ``n``, except that ``n == 0`` only marks every entry committed (``committed`` =
    the cursor, 0 on idle rows; the conv states untouched). ``table``: ignored (``layers_rollback_table``'s,
    for the Triton path)."""
    for cursor, conv_hist, conv_state, committed in layers:
        if n == 0:
            torch.clamp(cursor, min=0, out=committed)
        else:
            layer_rollback_reference(cursor, n, conv_hist, conv_state, committed)


def layers_rollback_table(layers) -> torch.Tensor:
    """(4 * len(layers),) int64 on the layers' device: the addresses of every layer's cursor, history,
    conv state and mark, in that order by kind (what ``layers_rollback_triton`` reads). Every layer
    must have its first's shapes, strides and dtypes (one launch computes them all alike)."""
    first = layers[0]
    for layer in layers:
        if any(t.shape != f.shape or t.stride() != f.stride() or t.dtype != f.dtype or t.device != f.device
               for t, f in zip(layer, first)):
            raise ValueError("layers_rollback: every layer needs the first's shapes, strides, dtypes and device")
    if first[0].dtype != torch.int32 or first[3].dtype != torch.int32:
        raise ValueError(f"cursor and committed must be int32; got {first[0].dtype}, {first[3].dtype}")
    if first[1].dtype not in _TL_DTYPES or first[2].dtype not in _TL_DTYPES:
        raise ValueError(f"conv history and state must be fp32, bf16 or fp16; got {first[1].dtype}, {first[2].dtype}")
    addresses = [layer[kind].data_ptr() for kind in range(4) for layer in layers]
    return torch.tensor(addresses, dtype=torch.int64).to(first[0].device)


def layers_rollback_triton(layers, n: int, table: torch.Tensor | None = None) -> None:
    """``layers_rollback_reference`` in one launch; ``table`` (``layers_rollback_table(layers)``, which a
    caller rolling the same tensors back often keeps) is built when not given."""
    if not layers:
        return
    table = layers_rollback_table(layers) if table is None else table
    _, hist, state, _ = layers[0]
    Bt, C, K = state.shape
    if Bt == 0:
        return
    _rollback_layers_kernel[(len(layers), Bt)](table, int(n), C, *hist.stride(), *state.stride(), **_blocks(K),
                                               HIST=_TL_DTYPES[hist.dtype], STATE=_TL_DTYPES[state.dtype],
                                               MARK_ONLY=int(n) == 0, num_warps=4)


def layers_rollback(layers, n: int, table: torch.Tensor | None = None, backend: str = "auto") -> None:
    """``layers_rollback_reference`` on the chosen backend (``backend.py``)."""
    if layers and resolve_backend(backend, layers[0][0].device) == "triton":
        layers_rollback_triton(layers, n, table)
    else:
        layers_rollback_reference(layers, n, table)
