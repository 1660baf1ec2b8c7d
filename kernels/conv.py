"""One causal depthwise conv step on a decode row's conv state, in place, in one launch.

``conv_update(conv_state, x, weight, bias, activation)``: conv_state (B, C, K) holds the last K
inputs per channel; the step drops the oldest, appends x (B, C) and returns
``act(sum_k state[:, :, k] * weight[:, k] + bias)`` (B, C) in x's dtype, accumulated in fp32.
It replaces a concatenation plus a depthwise convolution plus a copy-back (three passes over
the state) by one read and one write of it.

``count``: an optional 0-d int64 tensor (a cache layer's token count) that the step advances by one in
the same launch (``advance_count``; the window conv and the Gated DeltaNet prologue take it too), so a
token count costs no launch of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import resolve_backend
from .dependent import dependent, launch_options, start_dependent

ACTIVATIONS = (None, "silu", "swish")


def check_count(count: torch.Tensor | None, device: torch.device) -> None:
    """``count`` None or a 0-d int64 tensor on ``device`` (ValueError otherwise)."""
    if count is not None and (not isinstance(count, torch.Tensor) or count.dim() != 0
                              or count.dtype != torch.int64 or count.device != device):
        found = f"{count.dtype} {tuple(count.shape)} on {count.device}" if isinstance(count, torch.Tensor) else count
        raise ValueError(f"count must be None or a 0-d int64 tensor on {device}; got {found}")


def conv_update_reference(conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None, activation: str | None,
                          count: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference of ``conv_update`` (the CPU path); weight (C, K)."""
    if count is not None:
        count.add_(1)
    window = torch.cat([conv_state[:, :, 1:], x[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state.copy_(window)
    out = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        out = out + bias.float()
    if activation in ("silu", "swish"):
        out = torch.nn.functional.silu(out)
    return out.to(x.dtype)


@triton.jit
def conv_step_tile(state_ptr, x_ptr, w_ptr, bias_ptr, row, cols, cmask, stride_sb, stride_sc, stride_sk, stride_xb,
                   stride_xc, K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    """The conv step of channels ``cols`` of row ``row``: the state tile shifted by one tap with x appended,
    stored back, and ``act(sum_k window * weight + bias)`` in fp32 (BLOCK_C,)."""
    # one (BLOCK_C, KP) tile of the state, loaded shifted by one tap: tap k of the new window is
    # tap k + 1 of the old one, and the last tap is x
    taps = tl.arange(0, KP)
    old = state_ptr + row * stride_sb + cols[:, None] * stride_sc + (taps[None, :] + 1) * stride_sk
    window = tl.load(old, mask=cmask[:, None] & (taps[None, :] < K - 1), other=0.0)
    x = tl.load(x_ptr + row * stride_xb + cols * stride_xc, mask=cmask, other=0.0)
    window = tl.where(taps[None, :] == K - 1, x[:, None].to(window.dtype), window)
    w = tl.load(w_ptr + cols[:, None] * K + taps[None, :], mask=cmask[:, None] & (taps[None, :] < K), other=0.0)
    acc = tl.sum(window.to(tl.float32) * w.to(tl.float32), axis=1)
    tl.store(old - stride_sk, window, mask=cmask[:, None] & (taps[None, :] < K))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def advance_count(count_ptr, n, HAS_COUNT: tl.constexpr):
    """The launch's first program adds ``n`` to the int64 counter at ``count_ptr``."""
    if HAS_COUNT:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(count_ptr, tl.load(count_ptr) + n)


@triton.jit
def _conv_update_kernel(state_ptr, x_ptr, w_ptr, bias_ptr, out_ptr, count_ptr, C,
                        stride_sb, stride_sc, stride_sk, stride_xb, stride_xc, stride_ob, stride_oc,
                        K: tl.constexpr, KP: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SILU: tl.constexpr, HAS_COUNT: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    advance_count(count_ptr, 1, HAS_COUNT)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    acc = conv_step_tile(state_ptr, x_ptr, w_ptr, bias_ptr, row, cols, cmask, stride_sb, stride_sc, stride_sk,
                         stride_xb, stride_xc, K, KP, HAS_BIAS, SILU)
    tl.store(out_ptr + row * stride_ob + cols * stride_oc, acc.to(out_ptr.dtype.element_ty), mask=cmask)


def conv_update_triton(conv_state, x, weight, bias, activation, count=None):
    """Triton ``conv_update``; each program reads its state tile before writing it back shifted."""
    batch, channels, width = conv_state.shape
    weight = weight.contiguous()
    out = torch.empty((batch, channels), dtype=x.dtype, device=x.device)
    block = min(256, triton.next_power_of_2(channels))
    pdl = dependent(x.device)
    _conv_update_kernel[(batch, triton.cdiv(channels, block))](
        conv_state, x, weight, bias if bias is not None else weight, out, count if count is not None else out,
        channels, *conv_state.stride(), *x.stride(), *out.stride(),
        K=width, KP=triton.next_power_of_2(width), BLOCK_C=block, HAS_BIAS=bias is not None,
        SILU=activation in ("silu", "swish"), HAS_COUNT=count is not None, PDL=pdl, num_warps=4,
        **launch_options(pdl))
    return out


def conv_update(conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None, count: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """One conv step (see the module notes); dispatches on ``backend`` like the decode kernels."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if conv_state.shape[:2] != x.shape or weight.shape != (x.shape[1], conv_state.shape[2]):
        raise ValueError(f"conv_update expects conv_state (B, C, K), x (B, C), weight (C, K); got "
                         f"{tuple(conv_state.shape)}, {tuple(x.shape)}, {tuple(weight.shape)}")
    check_count(count, x.device)
    if resolve_backend(backend, x.device) == "triton":
        return conv_update_triton(conv_state, x, weight, bias, activation, count)
    return conv_update_reference(conv_state, x, weight, bias, activation, count)
