"""Gated DeltaNet's per-step gates in one launch.

``gdn_gates(a, b, A_log, dt_bias, beta_scale)``: a, b (Bt, HV) in any float dtype; A_log, dt_bias (HV,).
Returns the log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b) * beta_scale``,
both (Bt, HV) fp32 (beta is never rounded through 16 bits). softplus is linear above 20, as in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import resolve_backend


def gdn_gates_reference(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        beta_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of ``gdn_gates`` (the CPU path)."""
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float()) * beta_scale


@triton.jit
def gate_values(a_ptr, b_ptr, alog_ptr, bias_ptr, row, stride_a, stride_b, heads, mask, beta_scale):
    """(g, beta) fp32 of ``heads`` of row ``row``."""
    a = tl.load(a_ptr + row * stride_a + heads, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b + heads, mask=mask, other=0.0).to(tl.float32)
    x = a + tl.load(bias_ptr + heads, mask=mask, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0, propagate_nan=tl.PropagateNan.ALL))))
    g = -tl.exp(tl.load(alog_ptr + heads, mask=mask, other=0.0).to(tl.float32)) * softplus
    return g, tl.sigmoid(b) * beta_scale


@triton.jit
def _gdn_gates_kernel(a_ptr, b_ptr, alog_ptr, bias_ptr, g_ptr, beta_ptr, HV, stride_a, stride_b, beta_scale,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0)
    heads = tl.arange(0, BLOCK)
    mask = heads < HV
    g, beta = gate_values(a_ptr, b_ptr, alog_ptr, bias_ptr, row, stride_a, stride_b, heads, mask, beta_scale)
    tl.store(g_ptr + row * HV + heads, g, mask=mask)
    tl.store(beta_ptr + row * HV + heads, beta, mask=mask)


def gdn_gates_triton(a, b, A_log, dt_bias, beta_scale=1.0):
    rows, heads = a.shape
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    g = torch.empty((rows, heads), dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    _gdn_gates_kernel[(rows,)](a, b, A_log, dt_bias, g, beta, heads, a.stride(0), b.stride(0), float(beta_scale),
                               BLOCK=triton.next_power_of_2(heads), num_warps=1)
    return g, beta


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, beta_scale: float = 1.0,
              *, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The gates of one decode step (see the module notes); dispatches on ``backend``."""
    if a.dim() != 2 or a.shape != b.shape or A_log.shape != a.shape[1:] or dt_bias.shape != a.shape[1:]:
        raise ValueError(f"gdn_gates expects a, b (Bt, HV) and A_log, dt_bias (HV,); got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(A_log.shape)}, {tuple(dt_bias.shape)}")
    if not torch.compiler.is_compiling() and resolve_backend(backend, a.device) == "triton":
        return gdn_gates_triton(a, b, A_log, dt_bias, beta_scale)
    return gdn_gates_reference(a, b, A_log, dt_bias, beta_scale)
