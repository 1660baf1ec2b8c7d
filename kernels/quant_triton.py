"""Triton versions of ``quant.py``: the same hash, rounding and absmax scaling, op for op (uint32
lanes for the hash, fp32 bit patterns for stochastic rounding), shared by the Mamba-2 and
delta-rule kernels. ``FMT`` codes the stored dtype (``state_format``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import triton_interpreter_on
from .quant import AMAX_FLOOR

#: FMT codes of the stored checkpoint dtypes
FMT_FP32, FMT_BF16, FMT_FP16, FMT_FP8, FMT_INT8 = 0, 1, 2, 3, 4
_FORMATS = {torch.float32: FMT_FP32, torch.bfloat16: FMT_BF16, torch.float16: FMT_FP16,
            torch.float8_e4m3fn: FMT_FP8, torch.int8: FMT_INT8}


def state_format(dtype: torch.dtype) -> int:
    """The FMT code of a checkpoint dtype (ValueError for others)."""
    if dtype not in _FORMATS:
        raise ValueError(f"checkpoint dtype must be one of {sorted(str(d) for d in _FORMATS)}; found {dtype}")
    return _FORMATS[dtype]


def int8_words(state: torch.Tensor) -> torch.Tensor | None:
    """An int8 checkpoint viewed as int32 words of four codes along its last dim (read with
    ``biased_words`` / ``word_code_to_f32``); None where it is not int8 or its last dim or a stride is
    not a multiple of 4 (the kernels then read bytes)."""
    if state.dtype != torch.int8:
        return None
    try:
        return state.view(torch.int32)
    except RuntimeError:
        return None


#: whether a kernel's fp32 -> e4m3 cast rounds to nearest even (the GPU's packed conversion; not the
#: interpreter's, which rounds ties away): where a caller asks for it (``CAST_E4M3``), nearest fp8
#: rounding is then left to the store's cast
CAST_ROUNDS_E4M3 = tl.constexpr(not triton_interpreter_on())


@triton.jit
def mix32(x):
    """lowbias32 (``quant._mix``) on uint32 lanes (products wrap mod 2^32)."""
    x = x ^ (x >> 16)
    x = x * tl.full([], 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def row_key(seed, counter):
    """``quant.row_key``: the 32-bit key of one flush from int64 seed and counter scalars."""
    lo = (counter & 0xFFFFFFFF).to(tl.uint32)
    hi = ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
    h = mix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ tl.full([], 0x9E3779B9, tl.uint32))
    h = mix32(h ^ lo)
    return mix32(h ^ hi)


@triton.jit
def uniform_bits(key, index):
    """``quant.hash_uniform_bits``: uint32 random bits of element ``index`` (int32 tensor)."""
    return mix32((index.to(tl.uint32) * tl.full([], 0x9E3779B1, tl.uint32)) ^ key)


@triton.jit
def _sr_float(v, u, DROP: tl.constexpr, MIN_NORMAL_BITS: tl.constexpr, SUB_SCALE: tl.constexpr):
    """``quant._sr_float``: DROP random bits added to the magnitude, then truncated; below the
    smallest normal (MIN_NORMAL_BITS; 0: none) ``floor(v * SUB_SCALE + r) / SUB_SCALE``."""
    b = v.to(tl.uint32, bitcast=True)
    mag = b & 0x7FFFFFFF
    sign = b & tl.full([], 0x80000000, tl.uint32)
    rand = u >> (32 - DROP)
    keep = tl.full([], (0xFFFFFFFF >> DROP) << DROP, tl.uint32)
    rounded = tl.where(mag < 0x7F800000, (mag + rand) & keep, mag)
    out = (rounded | sign).to(tl.float32, bitcast=True)
    if MIN_NORMAL_BITS > 0:
        r = (u >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24
        sub = tl.floor(v * SUB_SCALE + r) / SUB_SCALE
        out = tl.where(mag < MIN_NORMAL_BITS, sub, out)
    return out


@triton.jit
def _rn_e4m3(v):
    """``quant._rn_e4m3``: nearest e4m3 value, ties to even, by integer and fp32 operations."""
    b = v.to(tl.uint32, bitcast=True)
    mag = b & 0x7FFFFFFF
    sign = b & tl.full([], 0x80000000, tl.uint32)
    rounded = (mag + 0x7FFFF + ((mag >> 20) & 1)) & tl.full([], 0xFFF00000, tl.uint32)
    normal = (rounded | sign).to(tl.float32, bitcast=True)
    t = tl.abs(v) * 512.0
    sub = ((t + 8388608.0) - 8388608.0) / 512.0
    sub = tl.where(v < 0.0, -sub, sub)
    return tl.where(mag < 0x3C800000, sub, normal)


@triton.jit
def _clamp_keep_nan(v, lim):
    """``v`` clamped to [-lim, lim], NaN kept (the GPU's plain min / max would return the bound)."""
    return tl.minimum(tl.maximum(v, -lim, propagate_nan=tl.PropagateNan.ALL), lim, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def round_to(v, u, FMT: tl.constexpr, SR: tl.constexpr, CAST_E4M3: tl.constexpr = False):
    """``quant.round_bits`` up to the final cast: fp32 ``v`` (scaled for int8 / fp8 by ``quantize_tile``:
    ``|v| <= QMAX`` up to an ulp; non-finite values leave a non-finite scale) rounded so that
    the caller's cast to the stored dtype is exact (int8: the codes themselves); nearest (the cast
    rounds) unless SR, with the random bits ``u``. CAST_E4M3: nearest e4m3 left to the caller's cast
    where that rounds to nearest even (``CAST_ROUNDS_E4M3``), instead of integer operations."""
    if FMT == 4:  # int8
        # int8 codes either way (one return type: the compiler visits code after a constexpr ``if``)
        if SR:
            r = (u >> 8).to(tl.float32) * 5.9604644775390625e-08
            q = tl.minimum(tl.maximum(tl.floor(v + r), -127.0), 127.0).to(tl.int8)
        else:
            # nearest, ties to even: adding 1.5 * 2^23 rounds |v| <= 127 to an integer in the low
            # mantissa bits, whose low byte is the two's-complement code (no FRND or F2I, quarter-rate);
            # no clamp: |v| <= 127 (1 + 2^-22) by construction (``quantize_tile``), which rounds to 127
            y = v + 12582912.0
            q = y.to(tl.int32, bitcast=True).to(tl.int8)
        return q
    elif FMT == 3:  # fp8 e4m3
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        if SR:
            v = _sr_float(v, u, 20, 0x3C800000, 512.0)
        elif not (CAST_E4M3 and CAST_ROUNDS_E4M3):
            v = _rn_e4m3(v)
        return v
    elif FMT == 2:  # fp16
        if SR:
            v = _sr_float(_clamp_keep_nan(v, 65504.0), u, 13, 0x38800000, 16777216.0)
            v = _clamp_keep_nan(v, 65504.0)
        return v
    elif FMT == 1:  # bf16
        if SR:
            v = _sr_float(v, u, 16, 0, 1.0)
        return v
    else:
        return v


@triton.jit
def codes_to_f32(q, FMT: tl.constexpr):
    """fp32 values of a tile of stored checkpoint codes, before their scales. int8 (FMT 4): the code
    ``^ 0x80`` in the mantissa of 2^23, then ``- (2^23 + 128)``: integer and fp32 operations instead
    of I2F, which runs at a quarter of the fp32 rate on sm_80 / sm_90. Others: a plain conversion
    (e4m3 through the packed f16x2 conversion is faster than moving its bits)."""
    if FMT == 4:
        u = q.to(tl.uint8, bitcast=True).to(tl.uint32) ^ 0x4B000080
        return u.to(tl.float32, bitcast=True) - 8388736.0
    else:
        return q.to(tl.float32)


@triton.jit
def biased_words(w):
    """int8 codes read four to an int32 word (``w``, the first code in the low byte), each byte xor
    0x80 for ``word_code_to_f32``: one xor a word instead of one a code."""
    return w.to(tl.uint32, bitcast=True) ^ 0x80808080


@triton.jit
def word_code_to_f32(u, SHIFT: tl.constexpr):
    """fp32 values of the codes at bit ``SHIFT`` of ``biased_words`` ``u``, before their scales: the
    byte in the mantissa of 2^23, minus 2^23 + 128 (as ``codes_to_f32``)."""
    return (((u >> SHIFT) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


#: ``quant.AMAX_FLOOR`` in the kernels
AMAX_FLOOR_F32 = tl.constexpr(AMAX_FLOOR)

@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def tile_scale(s, AXIS: tl.constexpr, FMT: tl.constexpr):
    """(encode factors, stored scales) of an fp32 tile over AXIS: ``QMAX / amax`` (0 where amax is
    below ``quant.AMAX_FLOOR`` or NaN) and ``amax / QMAX``. amax propagates NaN (``tl.max`` on the GPU
    drops it): a vector holding NaN or inf keeps a non-finite scale, as in ``quant.quantize``."""
    if FMT == 4:
        qmax = 127.0
    else:
        qmax = 448.0
    amax = tl.reduce(tl.abs(s), AXIS, _max_nan)
    enc = tl.where(amax >= AMAX_FLOOR_F32, qmax / amax, 0.0)
    return enc, amax / qmax


@triton.jit
def quantize_tile(s, u, AXIS: tl.constexpr, FMT: tl.constexpr, SR: tl.constexpr, CAST_E4M3: tl.constexpr = False):
    """fp32 tile ``s`` -> (values whose cast to the stored dtype is exact, scales over AXIS, or
    a dummy for unscaled formats). ``s`` must hold whole vectors along AXIS (masked lanes zero)."""
    if FMT >= 3:
        enc, d = tile_scale(s, AXIS, FMT)
        if AXIS == 1:
            v = s * enc[:, None]
        else:
            v = s * enc[None, :]
        return round_to(v, u, FMT, SR, CAST_E4M3), d
    else:
        return round_to(s, u, FMT, SR), tl.max(s, axis=AXIS) * 0.0


@triton.jit
def quant_probe_kernel(x_ptr, q_ptr, d_ptr, rng_ptr, M, N, AXIS: tl.constexpr, FMT: tl.constexpr, SR: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, CAST_E4M3: tl.constexpr = False):
    """Test entry: quantize one (M, N) fp32 matrix (row 0 of ``rng`` = [seed, counter]; element
    index ``m * N + n``) into ``q`` and the scales ``d`` over AXIS."""
    om = tl.arange(0, BM)
    on = tl.arange(0, BN)
    mask = (om < M)[:, None] & (on < N)[None, :]
    s = tl.load(x_ptr + om[:, None] * N + on[None, :], mask=mask, other=0.0)
    key = row_key(tl.load(rng_ptr), tl.load(rng_ptr + 1))
    u = uniform_bits(key, om[:, None] * N + on[None, :])
    q, d = quantize_tile(s, u, AXIS, FMT, SR, CAST_E4M3)
    tl.store(q_ptr + om[:, None] * N + on[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    if FMT >= 3:
        if AXIS == 1:
            tl.store(d_ptr + om, d, mask=om < M)
        else:
            tl.store(d_ptr + on, d, mask=on < N)


def quant_probe(x: torch.Tensor, dtype: torch.dtype, axis: int, rng: torch.Tensor | None, cast_e4m3: bool = False):
    """Run ``quant_probe_kernel`` on an (M, N) fp32 matrix; returns (stored values, scales or None)."""
    M, N = x.shape
    q = torch.empty((M, N), dtype=dtype, device=x.device)
    fmt = state_format(dtype)
    d = torch.empty(M if axis == 1 else N, dtype=torch.float32, device=x.device)
    r = rng if rng is not None else torch.zeros(2, dtype=torch.int64, device=x.device)
    quant_probe_kernel[(1,)](x.contiguous(), q, d, r, M, N, AXIS=axis, FMT=fmt, SR=rng is not None,
                             BM=triton.next_power_of_2(M), BN=triton.next_power_of_2(N), CAST_E4M3=cast_e4m3)
    return q, (d if fmt >= 3 else None)


@triton.jit
def codes_probe_kernel(q_ptr, out_ptr, n, FMT: tl.constexpr, BLOCK: tl.constexpr):
    """Test entry: ``codes_to_f32`` of ``n`` stored codes."""
    offs = tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, codes_to_f32(q, FMT), mask=offs < n)


def codes_probe(q: torch.Tensor) -> torch.Tensor:
    """Run ``codes_probe_kernel`` on a vector of stored codes; returns their fp32 values."""
    out = torch.empty(q.numel(), dtype=torch.float32, device=q.device)
    codes_probe_kernel[(1,)](q.contiguous(), out, q.numel(), FMT=state_format(q.dtype),
                             BLOCK=triton.next_power_of_2(q.numel()))
    return out
