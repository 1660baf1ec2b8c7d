"""The one-launch gated RMSNorm against the transformers classes it mirrors."""

import importlib
import inspect
import os

import pytest
import torch

from replayssm.kernels.norm import gated_rmsnorm, gated_rmsnorm_reference
from replayssm.patches.fused_norm import _FORM_ATTR, gated_norm, norm_form

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need TRITON_INTERPRET=1 or a GPU")

CLASSES = [  # (module, class, constructor kwargs)
    ("mamba2", "MambaRMSNormGated", {}),
    ("zamba2", "Zamba2RMSNormGated", {"group_size": 16}),
    ("qwen3_5", "Qwen3_5RMSNormGated", {}),
    ("qwen3_next", "Qwen3NextRMSNormGated", {}),
    ("kimi_linear", "KimiLinearRMSNormGated", {}),
]


def _module(name, cls, kw, dtype):
    try:
        mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        pytest.skip(f"transformers has no {name}")
    klass = getattr(mod, cls)
    if "group_size" in inspect.signature(klass).parameters:
        kw = {"group_size": 16, **kw}
    norm = klass(64, eps=1e-6, **kw).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64).to(dtype))
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,cls,kw", CLASSES)
def test_reference_mirrors_module(name, cls, kw, dtype):
    norm = _module(name, cls, kw, dtype)
    g = torch.Generator().manual_seed(0)
    x, gate = (torch.randn(5, 64, generator=g).to(dtype) for _ in range(2))
    want = norm(x, gate)
    got = gated_rmsnorm_reference(x, gate, norm.weight, norm.variance_epsilon, norm_form(norm))
    assert got.dtype == want.dtype
    tol = 1e-6 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@needs_triton
@pytest.mark.parametrize("name,cls,kw", CLASSES)
def test_kernel_matches_reference(name, cls, kw):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    norm = _module(name, cls, kw, torch.float32).to(device)
    x, gate = (torch.randn(7, 64, device=device) for _ in range(2))
    want = gated_rmsnorm_reference(x, gate, norm.weight, 1e-6, norm_form(norm))
    got = gated_rmsnorm(x, gate, norm.weight, 1e-6, norm_form(norm), backend="triton")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_triton
def test_unmirrored_or_disagreeing_class_keeps_the_module():
    norm = _module("qwen3_5", "Qwen3_5RMSNormGated", {}, torch.float32)
    x, gate = torch.randn(3, 64), torch.randn(3, 64)
    norm.forward = lambda h, g: 2 * h  # a class whose behaviour changed: the probe must reject the kernel
    out = gated_norm(norm, x, gate, "triton")
    assert torch.equal(out, 2 * x) and norm.__dict__[_FORM_ATTR] is False
    assert torch.equal(gated_norm(norm, x, gate, "triton"), 2 * x)
