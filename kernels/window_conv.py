"""One layer's verify-window conv in one launch: each row's window start, its committed mark, and the
causal depthwise conv over the T window tokens with the roll-back-able history (semantics and
layouts: ``speculation.py``).

As PyTorch ops the window's start slot, the mark and the conv with its history are about two dozen
small launches per layer and verify round; at batch 1 inside a captured verify window they cost more
than the conv's bytes. One program per (row, channel block) reads the row's cursor, computes the
start slot, writes the history columns of the window, the T outputs (fp32 sums in the order of the
one-token conv step, ``conv.conv_step_tile``) and the last K inputs as the new conv state; ``count``
(optional, as ``conv.conv_update``'s) advances by T in the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import resolve_backend
from .conv import advance_count, check_count
from .speculation import conv_verify_reference, verify_start

__all__ = ["layer_window_conv", "layer_window_conv_reference", "layer_window_conv_triton"]

#: channels per program (a 128 x K tile: 64 programs a row for an 8192-channel conv)
_BLOCK_C = 128


def layer_window_conv_reference(conv_hist: torch.Tensor, conv_state: torch.Tensor, cursor: torch.Tensor,
                                committed: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                bias: torch.Tensor | None, activation: str | None, ring_len: int,
                                count: torch.Tensor | None = None) -> torch.Tensor:
    """x (Bt, T, C) conv inputs -> (Bt, T, C) conv outputs in x's dtype; in place: each row's window of
    ``conv_hist`` (Bt, C, K + L) and ``conv_state`` (Bt, C, K) on active rows (``cursor`` (Bt,) int32
    >= 0), ``committed`` (Bt,) int32 lowered to the window's start slot (``verify_start`` for
    ``ring_len`` = L), and ``count`` advanced by T. weight (C, K), bias (C,) or None, activation None or silu."""
    if count is not None:
        count.add_(x.shape[1])
    start = verify_start(cursor, x.shape[1], ring_len)
    committed.copy_(torch.minimum(committed, start.to(committed.dtype)))
    return conv_verify_reference(conv_hist, conv_state, start, cursor >= 0, x, weight, bias, activation)


@triton.jit
def _window_conv_kernel(x, weight, bias, out, hist, state, cursor, committed, count, T, L, C,
                        x_b, x_t, x_c, h_b, h_c, h_k, s_b, s_c, s_k,
                        K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SILU: tl.constexpr, HAS_COUNT: tl.constexpr):
    advance_count(count, T, HAS_COUNT)
    b = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1)
    c = tl.load(cursor + b)
    active = c >= 0
    start = tl.where((c + T > L) | (c < 0), 0, c)
    if pid_c == 0:
        tl.store(committed + b, tl.minimum(tl.load(committed + b), start))
    ch = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = ch < C
    taps = tl.arange(0, KP)
    tm = cm[:, None] & (taps < K)[None, :]
    w = tl.load(weight + ch[:, None] * K + taps[None, :], mask=tm, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias_c = tl.load(bias + ch, mask=cm, other=0.0).to(tl.float32)
    s_row = state + b * s_b + ch[:, None] * s_c
    x_row = x + b * x_b + ch[:, None] * x_c
    h_row = hist + b * h_b + ch * h_c
    sdt = state.dtype.element_ty
    for t in range(T):
        # token t sees window columns t + 1 .. t + K: the old conv state below K, the inputs above
        j = t + 1 + taps[None, :]
        win = tl.where(j < K, tl.load(s_row + j * s_k, mask=tm & (j < K), other=0.0),
                       tl.load(x_row + (j - K) * x_t, mask=tm & (j >= K), other=0.0).to(sdt))
        acc = tl.sum(win.to(tl.float32) * w, axis=1)
        if HAS_BIAS:
            acc += bias_c
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out + (b * T + t) * C + ch, acc.to(out.dtype.element_ty), mask=cm)
        if active:
            x_t_col = tl.load(x + b * x_b + t * x_t + ch * x_c, mask=cm, other=0.0)
            tl.store(h_row + (start + K + t) * h_k, x_t_col.to(sdt), mask=cm)
    # the history's first K columns (the conv state at the window's start) and the new conv state
    # (window columns T .. T + K - 1), all read before the barrier, written after it
    old = tl.load(s_row + taps[None, :] * s_k, mask=tm, other=0.0)
    j = T + taps[None, :]
    new = tl.where(j < K, tl.load(s_row + j * s_k, mask=tm & (j < K), other=0.0),
                   tl.load(x_row + (j - K) * x_t, mask=tm & (j >= K), other=0.0).to(sdt))
    tl.debug_barrier()
    if active:
        tl.store(h_row[:, None] + (start + taps[None, :]) * h_k, old, mask=tm)
        tl.store(s_row + taps[None, :] * s_k, new, mask=tm)


def layer_window_conv_triton(conv_hist: torch.Tensor, conv_state: torch.Tensor, cursor: torch.Tensor,
                             committed: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None, activation: str | None, ring_len: int,
                             count: torch.Tensor | None = None) -> torch.Tensor:
    """``layer_window_conv_reference`` in one launch (int32 cursors and marks; x may be strided)."""
    Bt, C, K = conv_state.shape
    T = x.shape[1]
    if cursor.dtype != torch.int32 or committed.dtype != torch.int32:
        raise ValueError(f"cursor and committed must be int32; got {cursor.dtype}, {committed.dtype}")
    out = torch.empty((Bt, T, C), dtype=x.dtype, device=x.device)
    if Bt == 0 or T == 0:
        if count is not None:
            count.add_(T)
        return out
    weight = weight.contiguous()
    _window_conv_kernel[(Bt, triton.cdiv(C, _BLOCK_C))](
        x, weight, bias if bias is not None else weight, out, conv_hist, conv_state, cursor, committed,
        count if count is not None else cursor, T, ring_len, C, *x.stride(), *conv_hist.stride(), *conv_state.stride(),
        K=K, KP=triton.next_power_of_2(K), BLOCK_C=_BLOCK_C, HAS_BIAS=bias is not None,
        SILU=activation in ("silu", "swish"), HAS_COUNT=count is not None, num_warps=4)
    return out


def layer_window_conv(conv_hist, conv_state, cursor, committed, x, weight, bias, activation, ring_len,
                      count=None, backend: str = "auto") -> torch.Tensor:
    """``layer_window_conv_reference`` on the chosen backend (``backend.py``)."""
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"the window conv takes activation None, 'silu' or 'swish'; got {activation!r}")
    if x.dim() != 3 or x.shape[0] != conv_state.shape[0] or x.shape[2] != conv_state.shape[1] or tuple(
            weight.shape) != tuple(conv_state.shape[1:]):
        raise ValueError(f"the window conv expects x (Bt, T, C) and weight (C, K) for a conv state (Bt, C, K) = "
                         f"{tuple(conv_state.shape)}; got x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    check_count(count, x.device)
    if resolve_backend(backend, x.device) == "triton":
        return layer_window_conv_triton(conv_hist, conv_state, cursor, committed, x, weight, bias, activation,
                                        ring_len, count)
    return layer_window_conv_reference(conv_hist, conv_state, cursor, committed, x, weight, bias, activation,
                                       ring_len, count)
