"""The bf16 split of ``kernels/split_dot.py``: ``hi + mid + lo`` gives an fp32 value back to fp32
rounding and ``hi + mid`` to 16 bits (interpreter or GPU); on a GPU, ``dot_f32``'s split products
and ``tf32x3`` against a float64 matmul."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from replayssm.kernels.split_dot import bf16_parts, dot_f32  # noqa: E402


@triton.jit
def _parts_kernel(v, hi, mid, lo, N: tl.constexpr):
    offs = tl.arange(0, N)
    h, m, low = bf16_parts(tl.load(v + offs))
    tl.store(hi + offs, h.to(tl.float32))
    tl.store(mid + offs, m.to(tl.float32))
    tl.store(lo + offs, low.to(tl.float32))


@triton.jit
def _dot_kernel(a, b, out, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PREC: tl.constexpr):
    m = tl.arange(0, M)
    k = tl.arange(0, K)
    n = tl.arange(0, N)
    x = tl.load(a + m[:, None] * K + k[None, :])
    y = tl.load(b + k[:, None] * N + n[None, :])
    tl.store(out + m[:, None] * N + n[None, :], dot_f32(x, y, False, PREC))


def _wide(n, seed):
    """fp32 values over many binades (e^-16 .. e^16), both signs."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 4)


def test_parts_give_the_value_back():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    v = _wide(1024, 0).to(dev)
    hi, mid, lo = (torch.full_like(v, float("nan")) for _ in range(3))
    _parts_kernel[(1,)](v, hi, mid, lo, N=1024)
    v64 = v.double()
    # on CUDA each part rounds to nearest (half a step of its 8 bits); the interpreter truncates (a step)
    step = 2.0 ** -8 if dev == "cuda" else 2.0 ** -7
    if dev == "cuda":
        assert torch.equal(hi, v.bfloat16().float())
    assert ((hi.double() - v64).abs() <= v64.abs() * step).all()
    assert ((hi.double() + mid.double() + lo.double() - v64).abs() <= v64.abs() * 2.0 ** -24).all()
    two = (hi.double() + mid.double() - v64).abs()
    assert (two <= v64.abs() * step * 2.0 ** -7).all() and (two > 0).any()  # 16 bits, not more


@pytest.mark.gpu
@pytest.mark.parametrize("fp32_side", ["left", "right"])
def test_split_products_against_float64(fp32_side):
    """bf16 x fp32 products of a verify's shapes, error relative to ``sum |a||b|``: ``bf16x3`` within
    2^-19 (the tensor cores' fp32 accumulation bounds it and ``tf32x3`` alike, about 2^-20 on an H100)
    and under half ``bf16x2``'s (its third part counts), ``bf16x2`` within 2^-15 (16 bits)."""
    M, K, N = 16, 128, 32
    g = torch.Generator().manual_seed(1)
    a = torch.randn(M, K, generator=g).bfloat16() if fp32_side == "right" else _wide(M * K, 2).reshape(M, K)
    b = _wide(K * N, 3).reshape(K, N) if fp32_side == "right" else torch.randn(K, N, generator=g).bfloat16()
    a, b = a.cuda(), b.cuda()
    exact = a.double() @ b.double()
    scale = (a.double().abs() @ b.double().abs()).clamp(min=1e-30)
    errs = {}
    for prec in ("tf32x3", "bf16x3", "bf16x2"):
        out = torch.full((M, N), float("nan"), device="cuda")
        _dot_kernel[(1,)](a, b, out, M=M, K=K, N=N, PREC=prec)
        errs[prec] = float(((out.double() - exact).abs() / scale).max())
    assert errs["tf32x3"] <= 2.0 ** -19 and errs["bf16x3"] <= 2.0 ** -19, errs
    assert errs["bf16x3"] < errs["bf16x2"] / 2, errs
    assert errs["bf16x2"] <= 2.0 ** -15, errs
