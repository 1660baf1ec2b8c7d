"""RMSNorms in one launch: the gated norm of a decode step's SSM output, and the plain norms
of the decoder layers (``rmsnorm``, at the end of this module).

``gated_rmsnorm(x, gate, weight, eps, form)``: x, gate (M, D); weight (D,). The transformers
families round at different points; ``NormForm`` names them:

* ``gate_first`` (Mamba-2 mixers): h = x * act(gate), normalised per group of ``group_size``,
  rounded to x's dtype, times weight (result in the promoted dtype of weight and x);
* ``norm_first`` (Gated DeltaNet mixers): y = rms-normalised x rounded to x's dtype, times weight
  (rounded to the promoted dtype when that is x's dtype), times act(gate), rounded to x's dtype;
* ``norm_first_fp32_weight``: as ``norm_first`` with the weight product kept in fp32.

Statistics and products are fp32. The reference below is the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import resolve_backend
from .dependent import dependent, launch_options, start_dependent


@dataclass(frozen=True)
class NormForm:
    gate_first: bool
    group_size: int | None = None  # None: the whole last dimension
    activation: str = "silu"  # "silu" | "sigmoid"
    round_weighted: bool = True  # norm_first: round weight * y to the promoted dtype

    def out_dtype(self, x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
        return torch.promote_types(weight.dtype, x.dtype) if self.gate_first else x.dtype


def _act(t: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.sigmoid(t) if activation == "sigmoid" else torch.nn.functional.silu(t)


def gated_rmsnorm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                            form: NormForm) -> torch.Tensor:
    """PyTorch reference of ``gated_rmsnorm`` (the CPU path)."""
    group = form.group_size or x.shape[-1]
    h = x.float()
    if form.gate_first:
        h = h * _act(gate.float(), form.activation)
    g = h.view(*h.shape[:-1], -1, group)
    y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).view_as(h)
    if form.gate_first:
        return (weight.float() * y.to(x.dtype).float()).to(form.out_dtype(x, weight))
    promoted = torch.promote_types(weight.dtype, x.dtype)
    if form.round_weighted:
        hw = (weight.float() * y.to(x.dtype).float()).to(promoted).float()
    else:
        hw = weight.float() * y
    return (hw * _act(gate.float(), form.activation)).to(x.dtype)


@triton.jit
def _gated_rmsnorm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, eps, group, stride_xm, stride_gm, stride_om,
                          BLOCK: tl.constexpr, GATE_FIRST: tl.constexpr, SIGMOID: tl.constexpr,
                          ROUND_Y: tl.constexpr, ROUND_HW: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * group + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < group
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0)
    gate = tl.load(g_ptr + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)
    act = tl.sigmoid(gate) if SIGMOID else gate * tl.sigmoid(gate)
    h = x.to(tl.float32)
    if GATE_FIRST:
        h = h * act
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / group + eps)
    y = h * rstd
    if ROUND_Y:
        y = y.to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    hw = w * y
    if not GATE_FIRST:
        if ROUND_HW:
            hw = hw.to(x.dtype).to(tl.float32)
        hw = hw * act
    tl.store(out_ptr + row * stride_om + cols, hw.to(out_ptr.dtype.element_ty), mask=mask)


def gated_rmsnorm_triton(x, gate, weight, eps, form: NormForm):
    D = x.shape[-1]
    group = form.group_size or D
    x2, g2 = x.reshape(-1, D), gate.reshape(-1, D)
    if x2.stride(-1) != 1 or g2.stride(-1) != 1:
        x2, g2 = x2.contiguous(), g2.contiguous()
    out = torch.empty(x2.shape, dtype=form.out_dtype(x, weight), device=x.device)
    promoted = torch.promote_types(weight.dtype, x.dtype)
    pdl = dependent(x.device)
    _gated_rmsnorm_kernel[(x2.shape[0], D // group)](
        x2, g2, weight, out, eps, group, x2.stride(0), g2.stride(0), out.stride(0),
        BLOCK=triton.next_power_of_2(group), GATE_FIRST=form.gate_first, SIGMOID=form.activation == "sigmoid",
        ROUND_Y=form.gate_first or form.round_weighted,
        ROUND_HW=form.round_weighted and promoted == x.dtype and x.dtype != torch.float32, PDL=pdl,
        num_warps=4, **launch_options(pdl))
    return out.view(*x.shape[:-1], D)


def gated_rmsnorm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, form: NormForm, *,
                  backend: str = "auto") -> torch.Tensor:
    """Gated RMSNorm (see the module notes); dispatches on ``backend`` like the decode kernels."""
    group = form.group_size or x.shape[-1]
    if x.shape != gate.shape or weight.shape != x.shape[-1:] or x.shape[-1] % group:
        raise ValueError(f"gated_rmsnorm expects x and gate (..., D) and weight (D,) with D a multiple of "
                         f"{group}; got {tuple(x.shape)}, {tuple(gate.shape)}, {tuple(weight.shape)}")
    if resolve_backend(backend, x.device) == "triton":
        return gated_rmsnorm_triton(x, gate, weight, eps, form)
    return gated_rmsnorm_reference(x, gate, weight, eps, form)


# ------------------------------------------------------------------ plain RMSNorm
#: the roundings of transformers' plain RMSNorm classes, y = x * rsqrt(mean(x^2) + eps) in fp32:
#: ``round_then_weight``: weight * y.to(x.dtype) (promoted dtype); ``fp32_weight``: (weight * y) in
#: fp32, rounded to x's dtype; ``offset``: (y * (1 + weight)) in fp32, rounded to x's dtype
RMSNORM_FORMS = ("round_then_weight", "fp32_weight", "offset")


def rmsnorm_out_dtype(x: torch.Tensor, weight: torch.Tensor, form: str) -> torch.dtype:
    return torch.promote_types(weight.dtype, x.dtype) if form == "round_then_weight" else x.dtype


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, form: str) -> torch.Tensor:
    """PyTorch reference of ``rmsnorm`` (the CPU path)."""
    h = x.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if form == "round_then_weight":
        return (weight.float() * y.to(x.dtype).float()).to(rmsnorm_out_dtype(x, weight, form))
    w = 1.0 + weight.float() if form == "offset" else weight.float()
    return (w * y).to(x.dtype)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, eps, D, stride_xm, stride_om, BLOCK: tl.constexpr,
                    ROUND_Y: tl.constexpr, OFFSET: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0)
    h = x.to(tl.float32)
    y = h * (1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps))
    if ROUND_Y:
        y = y.to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if OFFSET:
        w = w + 1.0
    tl.store(out_ptr + row * stride_om + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_triton(x, weight, eps, form: str):
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=rmsnorm_out_dtype(x, weight, form), device=x.device)
    block = triton.next_power_of_2(D)
    pdl = dependent(x.device)
    _rmsnorm_kernel[(x2.shape[0],)](x2, weight, out, eps, D, x2.stride(0), out.stride(0), BLOCK=block,
                                    ROUND_Y=form == "round_then_weight", OFFSET=form == "offset",
                                    PDL=pdl, num_warps=4 if block <= 1024 else 8, **launch_options(pdl))
    return out.view(*x.shape[:-1], D)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, form: str, *, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of x (..., D) with weight (D,) in one launch, rounding as ``form`` (``RMSNORM_FORMS``)."""
    if form not in RMSNORM_FORMS or weight.shape != x.shape[-1:]:
        raise ValueError(f"rmsnorm expects x (..., D), weight (D,) and a form in {RMSNORM_FORMS}; got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}, {form!r}")
    if resolve_backend(backend, x.device) == "triton":
        return rmsnorm_triton(x, weight, eps, form)
    return rmsnorm_reference(x, weight, eps, form)
