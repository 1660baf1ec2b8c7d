"""int8 codes against a float vector by integer dot products: the vector rounded once to integers
of at most 2^22 (a few fp32 ulps of its largest element) in three byte planes, ``dp4a`` taking four
codes a plane per instruction, the sums exact in int32. Used by the Mamba-2 output-only launch on
int32 words of codes (``LaunchConfig.word_dots``); under the interpreter ``dp4a`` is emulated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import triton_interpreter_on

#: whether ``dp4a`` runs as PTX (a GPU) or is emulated by shifts and products (the interpreter)
DP4A_PTX = tl.constexpr(not triton_interpreter_on())


@triton.jit
def _dp4a_emulated(a, b, B_SIGNED: tl.constexpr):
    """``dp4a`` by Triton operations: the four byte products of int32 words ``a`` (signed bytes)
    and ``b`` (signed or unsigned bytes), summed."""
    acc = a * 0
    for j in tl.static_range(4):
        aj = (a << (24 - 8 * j)) >> 24
        if B_SIGNED:
            bj = (b << (24 - 8 * j)) >> 24
        else:
            bj = (b >> (8 * j)) & 0xFF
        acc += aj * bj
    return acc


@triton.jit
def word_dots(w, hi, mid, lo):
    """Integer dot products of int8 codes read four to an int32 word (``w``, (M, NW)) against a
    vector split into three byte planes (``c_planes``; (NW,) words each): per word
    ``dot(hi) * 256 + dot(mid)`` and ``dot(lo)``, exact in int32 (one ``dp4a`` a plane, 4 codes)."""
    if DP4A_PTX:
        top = tl.inline_asm_elementwise(
            "{ .reg .s32 t; dp4a.s32.s32 t, $1, $2, 0; dp4a.s32.u32 $0, $1, $3, 0; mad.lo.s32 $0, t, 256, $0; }",
            "=r,r,r,r", [w, hi[None, :], mid[None, :]], dtype=tl.int32, is_pure=True, pack=1)
        low = tl.inline_asm_elementwise("dp4a.s32.u32 $0, $1, $2, 0;", "=r,r,r", [w, lo[None, :]],
                                        dtype=tl.int32, is_pure=True, pack=1)
    else:
        top = _dp4a_emulated(w, hi[None, :], True) * 256 + _dp4a_emulated(w, mid[None, :], False)
        low = _dp4a_emulated(w, lo[None, :], False)
    return top, low


@triton.jit
def _plane_word(q0, q1, q2, q3, SHIFT: tl.constexpr):
    """The bytes at bit SHIFT of int32 ``q0`` .. ``q3`` packed into one int32 word, ``q0``'s low."""
    return (((q0 >> SHIFT) & 0xFF) | (((q1 >> SHIFT) & 0xFF) << 8) | (((q2 >> SHIFT) & 0xFF) << 16)
            | (((q3 >> SHIFT) & 0xFF) << 24))


@triton.jit
def c_planes(c0, c1, c2, c3):
    """A vector, given by column mod 4 (``c0`` .. ``c3``, fp32 (NW,)), as integers for ``word_dots``:
    each element times 2^e rounded to an int ``q`` with ``|q| <= 2^22`` (e from the largest
    magnitude: error at most 2^-22 of it, a few fp32 ulps), split into byte planes
    ``q = hi * 65536 + mid * 256 + lo`` (hi signed, mid / lo unsigned), four columns a word.
    Returns (hi, mid, lo words, 2^-e, NaN where an element is not finite else 0)."""
    amax = tl.maximum(tl.maximum(tl.max(tl.abs(c0), 0), tl.max(tl.abs(c1), 0)),
                      tl.maximum(tl.max(tl.abs(c2), 0), tl.max(tl.abs(c3), 0)))
    expo = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 amax) for normal amax
    e = tl.minimum(tl.maximum(21 - expo, -106), 126)  # amax * 2^e in [2^21, 2^22); 2^e and 2^-e normal
    up = ((e + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)
    q0 = tl.floor(c0 * up + 0.5).to(tl.int32)
    q1 = tl.floor(c1 * up + 0.5).to(tl.int32)
    q2 = tl.floor(c2 * up + 0.5).to(tl.int32)
    q3 = tl.floor(c3 * up + 0.5).to(tl.int32)
    poison = tl.sum(c0 * 0.0 + c1 * 0.0 + c2 * 0.0 + c3 * 0.0, 0)
    return (_plane_word(q0, q1, q2, q3, 16), _plane_word(q0, q1, q2, q3, 8), _plane_word(q0, q1, q2, q3, 0),
            down, poison)


@triton.jit
def planes_dot(w, hi, mid, lo, down, poison):
    """(M,) fp32 ``sum_n codes[m, n] * c[n]`` of int8 words ``w`` (M, NW) against ``c_planes``."""
    top, low = word_dots(w, hi, mid, lo)
    return (tl.sum(top, 1).to(tl.float32) * 256.0 + tl.sum(low, 1).to(tl.float32)) * down + poison


@triton.jit
def planes_probe_kernel(w_ptr, c_ptr, out_ptr, M, NW, BM: tl.constexpr, BW: tl.constexpr):
    """Test entry: ``planes_dot`` of (M, NW) int32 words of int8 codes against an fp32 vector of 4 NW."""
    om = tl.arange(0, BM)
    ow = tl.arange(0, BW)
    mw = ow < NW
    w = tl.load(w_ptr + om[:, None] * NW + ow[None, :], mask=(om < M)[:, None] & mw[None, :], other=0)
    c0 = tl.load(c_ptr + 4 * ow, mask=mw, other=0.0)
    c1 = tl.load(c_ptr + 4 * ow + 1, mask=mw, other=0.0)
    c2 = tl.load(c_ptr + 4 * ow + 2, mask=mw, other=0.0)
    c3 = tl.load(c_ptr + 4 * ow + 3, mask=mw, other=0.0)
    hi, mid, lo, down, nan = c_planes(c0, c1, c2, c3)
    tl.store(out_ptr + om, planes_dot(w, hi, mid, lo, down, nan), mask=om < M)


def planes_probe(codes: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Run ``planes_probe_kernel``: ``codes`` (M, N) int8 with N a multiple of 4, ``c`` (N,) fp32;
    returns the (M,) fp32 products."""
    M, N = codes.shape
    out = torch.empty(M, dtype=torch.float32, device=codes.device)
    planes_probe_kernel[(1,)](codes.contiguous().view(torch.int32), c.float().contiguous(), out, M, N // 4,
                              BM=triton.next_power_of_2(M), BW=triton.next_power_of_2(N // 4))
    return out
