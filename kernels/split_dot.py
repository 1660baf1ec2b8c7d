"""``tl.dot`` in fp32 where an operand is fp32 and the other 16-bit: split the fp32 one into bf16 parts.

With a bf16 partner (activations, rings), ``hi + mid (+ lo)`` bf16 parts of the fp32 operand make 2 or 3
bf16 tensor-core products, each exact, summed in fp32: 16 or 24 significant bits of the fp32 operand,
where ``tf32x3`` takes three tf32 products (about 21 bits), each at half the bf16 rate.
"""

import triton
import triton.language as tl

from .backend import triton_interpreter_on

__all__ = ["SPLIT_PRECISIONS", "bf16_parts", "dot_f32", "dot_precision", "dot_split"]

#: the ``dot_precision`` names of the split products
SPLIT_PRECISIONS = ("bf16x2", "bf16x3")


def dot_precision(requested: str | None) -> str:
    """The PREC of a product on fp32 operands (``dot_f32``): ``requested``, else ``tf32x3``; ``ieee``
    under the interpreter in both cases when a split or the default is asked for (it has no tf32, and
    its bf16 ``tl.dot`` is not exact)."""
    if triton_interpreter_on() and (requested is None or requested in SPLIT_PRECISIONS):
        return "ieee"
    return requested or "tf32x3"


@triton.jit
def bf16_parts(v):
    """fp32 ``v`` as ``hi + mid + lo`` in bf16 (24 significant bits together: v to fp32 rounding, up
    to underflow of the smallest part)."""
    hi = v.to(tl.bfloat16)
    r = v - hi.to(tl.float32)  # exact
    mid = r.to(tl.bfloat16)
    return hi, mid, (r - mid.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def dot_split(a, b, PREC: tl.constexpr):
    """``a @ b`` in fp32 for one bf16 operand and one fp32 one, the fp32 operand split into bf16 parts:
    every partial product is exact on the bf16 tensor cores (fp32 sums); ``bf16x2``: hi + mid (16 bits
    of the fp32 operand), ``bf16x3``: all three parts."""
    if a.dtype == tl.bfloat16:
        hi, mid, lo = bf16_parts(b.to(tl.float32))
        acc = tl.dot(a, hi, out_dtype=tl.float32)
        acc = tl.dot(a, mid, acc, out_dtype=tl.float32)
        if PREC == "bf16x3":
            acc = tl.dot(a, lo, acc, out_dtype=tl.float32)
    else:
        hi, mid, lo = bf16_parts(a.to(tl.float32))
        acc = tl.dot(hi, b, out_dtype=tl.float32)
        acc = tl.dot(mid, b, acc, out_dtype=tl.float32)
        if PREC == "bf16x3":
            acc = tl.dot(lo, b, acc, out_dtype=tl.float32)
    return acc


@triton.jit
def dot_f32(a, b, LOWP: tl.constexpr, PREC: tl.constexpr):
    """``a @ b`` in fp32: on the operands as they are (LOWP: both 16-bit, one dtype); with PREC
    ``bf16x2`` / ``bf16x3``: as they are if both are bf16, the fp32 one split if one is
    (``dot_split``), else at ``tf32x3``; any other PREC: on fp32 operands at PREC."""
    if LOWP:
        acc = tl.dot(a, b, out_dtype=tl.float32)
    elif PREC == "bf16x2" or PREC == "bf16x3":
        if a.dtype == tl.bfloat16 and b.dtype == tl.bfloat16:
            acc = tl.dot(a, b, out_dtype=tl.float32)  # exact products already
        elif a.dtype == tl.bfloat16 or b.dtype == tl.bfloat16:
            acc = dot_split(a, b, PREC)
        else:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32x3", out_dtype=tl.float32)
    else:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC, out_dtype=tl.float32)
    return acc
