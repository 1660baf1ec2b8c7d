"""RMSNorms as one kernel launch: the mixers' gated norm, where the transformers class is one we
mirror, and (``fuse_decoder_norms``) the decoder layers' plain norms under CUDA-graph decoding.

``gated_norm(norm, x, gate, backend)`` calls ``replayssm.kernels.norm.gated_rmsnorm`` with the
rounding form of ``norm``'s class on the Triton backend, and the module itself otherwise. The
first call of each norm instance runs both and keeps the kernel only if it matches the module
within rounding (one unit in the last place of 16-bit outputs, 1e-5 relative in fp32), so a
transformers version that changes a class never yields a silently different result; that first call
already returns the kernel's output, so every call of a norm computes the same way.
"""

from __future__ import annotations

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.norm import RMSNORM_FORMS, NormForm, gated_rmsnorm, rmsnorm

_FORM_ATTR = "_replayssm_norm_form"
_GATE_FIRST = ("MambaRMSNormGated", "Mamba2RMSNormGated", "BambaRMSNormGated", "GraniteMoeHybridRMSNormGated",
               "Zamba2RMSNormGated", "NemotronHRMSNormGated")
_NORM_FIRST = ("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated", "OlmoHybridRMSNormGated",
               "Qwen4ExpTextRMSNormGated")
_NORM_FIRST_FP32_WEIGHT = ("KimiLinearRMSNormGated", "Glm5NextTextRMSNormGated", "BailingHybridRMSNormGated",
                           "LaraMiniRMSNormGated")


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
    if form is None:  # first call: the kernel's result if it agrees, so every call computes alike
        form = norm_form(norm)
        ref = norm(x, gate)
        fused = None if form is None or eps is None else gated_rmsnorm(x, gate, norm.weight, eps, form,
                                                                        backend=backend)
        ok = fused is not None and _agrees(fused, ref)
        norm.__dict__[_FORM_ATTR] = form if ok else False
        return fused if ok else ref
    return gated_rmsnorm(x, gate, norm.weight, eps, form, backend=backend)


# ------------------------------------------------------------------ decoder RMSNorms
_PLAIN_FORM_ATTR = "_replayssm_rmsnorm_form"


def _plain_norm_eps(norm: torch.nn.Module) -> float | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def is_plain_rmsnorm(module: torch.nn.Module) -> bool:
    """A transformers RMSNorm without a gate: a class named ``*RMSNorm`` with a (D,) weight and an eps."""
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    return (name.endswith("RMSNorm") and isinstance(weight, torch.nn.Parameter) and weight.dim() == 1
            and _plain_norm_eps(module) is not None)


def _probe_form(norm, x: torch.Tensor, ref: torch.Tensor) -> tuple[str | bool, torch.Tensor]:
    """The rounding form whose kernel agrees with the module's output ``ref`` best (fewest differing
    elements, all within rounding) and its output, or (False, ref)."""
    best, best_out, best_diff = False, ref, None
    for form in RMSNORM_FORMS:
        fused = rmsnorm(x, norm.weight, _plain_norm_eps(norm), form, backend="triton")
        if _agrees(fused, ref):
            diff = int((fused != ref).sum().item())
            if best_diff is None or diff < best_diff:
                best, best_out, best_diff = form, fused, diff
    return best, best_out


def _fused_forward(norm: torch.nn.Module, original):
    def forward(hidden_states, *args, **kwargs):
        form = norm.__dict__.get(_PLAIN_FORM_ATTR)
        if (args or kwargs or form is False or torch.compiler.is_compiling()
                or hidden_states.shape[-1:] != norm.weight.shape
                or resolve_backend("auto", hidden_states.device) != "triton"):
            return original(hidden_states, *args, **kwargs)
        if form is None:  # first call: the kernel's result if it agrees, so every call computes alike
            form, out = _probe_form(norm, hidden_states, original(hidden_states))
            norm.__dict__[_PLAIN_FORM_ATTR] = form
            return out
        return rmsnorm(hidden_states, norm.weight, _plain_norm_eps(norm), form, backend="triton")

    return forward


def fuse_decoder_norms(model: torch.nn.Module) -> int:
    """Run every plain RMSNorm of ``model`` as one kernel launch on CUDA tensors (instance ``forward``
    attributes; ``unfuse_decoder_norms`` removes them). The first call of each norm checks the kernel
    against the module, as for the gated norms. Returns the number of norms rewritten."""
    count = 0
    for module in model.modules():
        if is_plain_rmsnorm(module) and "forward" not in module.__dict__:
            module.forward = _fused_forward(module, module.forward)
            module.__dict__[_PLAIN_FORM_ATTR] = None
            count += 1
    return count


def unfuse_decoder_norms(model: torch.nn.Module) -> None:
    for module in model.modules():
        if _PLAIN_FORM_ATTR in module.__dict__:
            del module.__dict__[_PLAIN_FORM_ATTR]
            module.__dict__.pop("forward", None)
