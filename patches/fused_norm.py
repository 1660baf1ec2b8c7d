"""The mixers' gated RMSNorm as one kernel launch, where the transformers class is one we mirror.

``gated_norm(norm, x, gate, backend)`` calls ``replayssm.kernels.norm.gated_rmsnorm`` with the
rounding form of ``norm``'s class on the Triton backend, and the module itself otherwise. The
first call of each norm instance runs both and keeps the kernel only if it matches the module
within rounding (one unit in the last place of 16-bit outputs, 1e-5 relative in fp32), so a
transformers version that changes a class never yields a silently different result.
"""

from __future__ import annotations

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.norm import NormForm, gated_rmsnorm

_FORM_ATTR = "_replayssm_norm_form"
_GATE_FIRST = ("MambaRMSNormGated", "BambaRMSNormGated", "GraniteMoeHybridRMSNormGated", "Zamba2RMSNormGated",
               "NemotronHRMSNormGated")
_NORM_FIRST = ("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated", "OlmoHybridRMSNormGated",
               "Qwen4ExpTextRMSNormGated")
_NORM_FIRST_FP32_WEIGHT = ("KimiLinearRMSNormGated", "Glm5NextTextRMSNormGated", "BailingHybridRMSNormGated")


def norm_form(norm: torch.nn.Module) -> NormForm | None:
    """The rounding form of a gated-norm module's class, or None for a class not mirrored."""
    name = type(norm).__name__
    activation = getattr(norm, "activation", "silu")
    if activation not in ("silu", "sigmoid"):
        return None
    if name in _GATE_FIRST:
        return NormForm(gate_first=True, group_size=getattr(norm, "group_size", None), activation=activation)
    if name in _NORM_FIRST:
        return NormForm(gate_first=False, activation=activation)
    if name in _NORM_FIRST_FP32_WEIGHT:
        return NormForm(gate_first=False, activation=activation, round_weighted=False)
    return None


def _agrees(fused: torch.Tensor, ref: torch.Tensor) -> bool:
    if fused.shape != ref.shape or fused.dtype != ref.dtype:
        return False
    rtol = 1e-5 if ref.dtype == torch.float32 else 2.0 ** -7
    scale = ref.float().abs().max().item() + 1e-6
    return bool(((fused.float() - ref.float()).abs() <= rtol * (ref.float().abs() + 1e-3 * scale)).all())


def gated_norm(norm: torch.nn.Module, x: torch.Tensor, gate: torch.Tensor, backend: str) -> torch.Tensor:
    """``norm(x, gate)``, in one launch where possible (see the module notes)."""
    form = norm.__dict__.get(_FORM_ATTR)
    if form is False or torch.compiler.is_compiling() or resolve_backend(backend, x.device) != "triton":
        return norm(x, gate)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if form is None:
        form = norm_form(norm)
        ref = norm(x, gate)
        ok = form is not None and eps is not None and _agrees(
            gated_rmsnorm(x, gate, norm.weight, eps, form, backend=backend), ref)
        norm.__dict__[_FORM_ATTR] = form if ok else False
        return ref
    return gated_rmsnorm(x, gate, norm.weight, eps, form, backend=backend)
