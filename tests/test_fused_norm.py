"""The one-launch RMSNorms (gated, and the decoder layers' plain ones) against the transformers classes."""

import importlib
import inspect
import os

import pytest
import torch

from replayssm.kernels.norm import RMSNORM_FORMS, gated_rmsnorm, gated_rmsnorm_reference, rmsnorm, rmsnorm_reference
from replayssm.patches import fused_norm
from replayssm.patches.fused_norm import (_FORM_ATTR, fuse_decoder_norms, gated_norm, is_plain_rmsnorm, norm_form,
                                          unfuse_decoder_norms)

from helpers import tiny

needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton kernels need TRITON_INTERPRET=1 or a GPU")
#: CPU tensors through the Triton path: the interpreter only (on a GPU machine without it they cannot launch)
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="runs Triton on CPU tensors through the interpreter")

CLASSES = [  # (module, class (its names across transformers versions), constructor kwargs)
    ("mamba2", ("Mamba2RMSNormGated", "MambaRMSNormGated"), {}),
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
    klass = next(getattr(mod, c) for c in ((cls,) if isinstance(cls, str) else cls) if hasattr(mod, c))
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


@needs_interpreter
def test_unmirrored_or_disagreeing_class_keeps_the_module():
    norm = _module("qwen3_5", "Qwen3_5RMSNormGated", {}, torch.float32)
    x, gate = torch.randn(3, 64), torch.randn(3, 64)
    norm.forward = lambda h, g: 2 * h  # a class whose behaviour changed: the probe must reject the kernel
    out = gated_norm(norm, x, gate, "triton")
    assert torch.equal(out, 2 * x) and norm.__dict__[_FORM_ATTR] is False
    assert torch.equal(gated_norm(norm, x, gate, "triton"), 2 * x)


# ------------------------------------------------------------------ plain decoder RMSNorms
PLAIN = [  # (module, class, the form its forward rounds as, in this transformers)
    ("nemotron_h", "NemotronHRMSNorm", None),  # 5.17 rounds then weights, 5.24 weights in fp32
    ("bamba", "BambaRMSNorm", "round_then_weight"),
    ("olmo_hybrid", "OlmoHybridRMSNorm", "fp32_weight"),
    ("qwen3_5", "Qwen3_5RMSNorm", "offset"),
    ("kimi_linear", "KimiLinearRMSNorm", "round_then_weight"),
]


def _plain(name, cls, dtype, dim=96):
    try:
        mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        pytest.skip(f"transformers has no {name}")
    norm = getattr(mod, cls)(dim, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim).to(dtype))
    return norm


def _form_of(norm, x):
    """The one form whose reference equals the module bit for bit (bf16 input: the forms differ)."""
    want = norm(x)
    forms = [f for f in RMSNORM_FORMS
             if (got := rmsnorm_reference(x, norm.weight, 1e-6, f)).dtype == want.dtype and torch.equal(got, want)]
    return forms


@pytest.mark.parametrize("name,cls,form", PLAIN)
def test_plain_reference_reproduces_each_class(name, cls, form):
    norm = _plain(name, cls, torch.bfloat16)
    x = (3 * torch.randn(4, 7, 96, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    forms = _form_of(norm, x)
    assert len(forms) == 1, forms
    if form is not None:
        assert forms == [form]


@needs_triton
@pytest.mark.parametrize("form", RMSNORM_FORMS)
@pytest.mark.parametrize("dim", [64, 96])
def test_plain_kernel_matches_reference(form, dim):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, w = torch.randn(2, 5, dim, device=device), torch.randn(dim, device=device)
    x[0, 0] = float("nan")  # a row's NaN stays in its row
    got = rmsnorm(x, w, 1e-5, form, backend="triton")
    want = rmsnorm_reference(x, w, 1e-5, form)
    assert got.isnan()[0, 0].all() and not got[0, 1:].isnan().any() and not got[1].isnan().any()
    torch.testing.assert_close(got[~x.isnan().any(-1)], want[~x.isnan().any(-1)], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="rmsnorm expects"):
        rmsnorm(x, w[:-1], 1e-5, form)


@needs_interpreter
def test_decoder_norms_are_fused_checked_and_restored(monkeypatch):
    model = tiny("qwen3_5")
    norms = [m for m in model.modules() if is_plain_rmsnorm(m)]
    assert len(norms) >= 3 and fuse_decoder_norms(model) == len(norms)
    monkeypatch.setattr(fused_norm, "resolve_backend", lambda backend, device: "triton")  # kernels on the CPU too
    x = torch.randn(2, 3, norms[0].weight.shape[0])
    first = norms[0](x)  # the first call runs the module, probes the forms, returns the kernel's output
    torch.testing.assert_close(first, norms[0].__class__.forward(norms[0], x), rtol=1e-5, atol=1e-6)
    assert norms[0].__dict__["_replayssm_rmsnorm_form"] == "offset"
    assert torch.equal(norms[0](x), first)
    broken = norms[1]
    broken.__dict__["forward"] = fused_norm._fused_forward(broken, lambda h: 2 * h)  # a class that changed
    assert torch.equal(broken(x), 2 * x) and broken.__dict__["_replayssm_rmsnorm_form"] is False
    unfuse_decoder_norms(model)
    assert all("forward" not in m.__dict__ and "_replayssm_rmsnorm_form" not in m.__dict__ for m in norms)
