"""One causal depthwise conv step on a decode row's conv state, in place, in one launch.

``conv_update(conv_state, x, weight, bias, activation)``: conv_state (B, C, K) holds the last K
inputs per channel; the step drops the oldest, appends x (B, C) and returns
``act(sum_k state[:, :, k] * weight[:, k] + bias)`` (B, C) in x's dtype, accumulated in fp32.
It replaces a concatenation plus a depthwise convolution plus a copy-back (three passes over
the state) by one read and one write of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import resolve_backend

ACTIVATIONS = (None, "silu", "swish")


def conv_update_reference(conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """PyTorch reference of ``conv_update`` (the CPU path); weight (C, K)."""
    window = torch.cat([conv_state[:, :, 1:], x[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state.copy_(window)
    out = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        out = out + bias.float()
    if activation in ("silu", "swish"):
        out = torch.nn.functional.silu(out)
    return out.to(x.dtype)


@triton.jit
def _conv_update_kernel(state_ptr, x_ptr, w_ptr, bias_ptr, out_ptr, C,
                        stride_sb, stride_sc, stride_sk, stride_xb, stride_xc, stride_ob, stride_oc,
                        K: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < C
    state = state_ptr + row * stride_sb + cols * stride_sc
    x = tl.load(x_ptr + row * stride_xb + cols * stride_xc, mask=mask, other=0.0)
    acc = tl.load(w_ptr + cols * K + (K - 1), mask=mask, other=0.0).to(tl.float32) * x.to(tl.float32)
    for k in tl.static_range(K - 1):
        s = tl.load(state + (k + 1) * stride_sk, mask=mask, other=0.0)
        acc += tl.load(w_ptr + cols * K + k, mask=mask, other=0.0).to(tl.float32) * s.to(tl.float32)
        tl.store(state + k * stride_sk, s, mask=mask)
    tl.store(state + (K - 1) * stride_sk, x.to(state_ptr.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + row * stride_ob + cols * stride_oc, acc.to(out_ptr.dtype.element_ty), mask=mask)


def conv_update_triton(conv_state, x, weight, bias, activation):
    """Triton ``conv_update``; the state is read before it is shifted within each program."""
    batch, channels, width = conv_state.shape
    weight = weight.contiguous()
    out = torch.empty((batch, channels), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(channels))
    _conv_update_kernel[(batch, triton.cdiv(channels, block))](
        conv_state, x, weight, bias if bias is not None else weight, out, channels,
        *conv_state.stride(), *x.stride(), *out.stride(),
        K=width, BLOCK_C=block, HAS_BIAS=bias is not None, SILU=activation in ("silu", "swish"), num_warps=4)
    return out


def conv_update(conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None, *, backend: str = "auto") -> torch.Tensor:
    """One conv step (see the module notes); dispatches on ``backend`` like the decode kernels."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if conv_state.shape[:2] != x.shape or weight.shape != (x.shape[1], conv_state.shape[2]):
        raise ValueError(f"conv_update expects conv_state (B, C, K), x (B, C), weight (C, K); got "
                         f"{tuple(conv_state.shape)}, {tuple(x.shape)}, {tuple(weight.shape)}")
    if resolve_backend(backend, x.device) == "triton":
        return conv_update_triton(conv_state, x, weight, bias, activation)
    return conv_update_reference(conv_state, x, weight, bias, activation)
