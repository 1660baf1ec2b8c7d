"""Low-precision state checkpoints: rounding, scales and the counter-based random numbers of
stochastic rounding, in PyTorch (the reference, and the CPU path). The Triton kernels compute the
same functions with the same integer and fp32 operations (``quant_triton.py``), so a flush can be
checked against this module bit for bit where the fp32 state it rounds is the same.

Stored dtypes below fp32:

* bf16 / fp16: the value itself, rounded (no scale).
* int8 / fp8 e4m3 (``torch.float8_e4m3fn``): scaled. One fp32 scale per vector over the state
  dimension (Mamba-2: per (row, head, head-dim lane) over N; the delta rule: per (row, value
  head, value column) over the key dim K), absmax: ``d = amax / QMAX`` (``QMAX`` = 127 for int8,
  448 for e4m3), stored value ``Q(x / d)``, read back as ``Q * d``. A vector of zeros has d = 0.
  Why these vectors: every read of the checkpoint is a reduction over the state dimension
  (``S0 C``, ``S0^T k``), so the scale multiplies the reduced value once, and a flush tile that
  spans the state dimension holds every vector it scales.

Rounding (``rounding``): nearest (ties to even, every format), or
stochastic: unbiased, ``Q(x)`` is one of the two neighbours with probability linear in the
distance. The random bits of element ``i`` of a row's state at a flush come from a hash of (the
row's seed, the row's flush counter, i): ``state_rng`` (B, 2) int64 holds [seed, counter] per row.
A flush first advances its row's counter, then draws (so every flush draws anew, and a reordered
batch carries its rows' streams with them). Nothing is drawn on the host, so a step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import torch

__all__ = [
    "QMAX", "QuantStateError", "advance_flush_counters", "check_quant_args", "check_step_state", "dequantize", "hash_uniform_bits", "init_state_rng",
    "is_scaled", "load_state", "quantize", "round_bits", "scale_shape", "store_state",
]

#: largest stored magnitude of the scaled dtypes
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
#: vectors whose absmax is below this are stored as zero codes (``QMAX / amax`` must be finite)
AMAX_FLOOR = 2.0 ** -100

MASK32 = 0xFFFFFFFF
#: the hash's constants (lowbias32 by C. Wellons; golden-ratio increments)
M1, M2, GOLD, GOLD2 = 0x7FEB352D, 0x846CA68B, 0x9E3779B9, 0x9E3779B1
#: fp32 bit patterns: smallest normal e4m3 (2^-6) and fp16 (2^-14) values
E4M3_MIN_NORMAL_BITS, FP16_MIN_NORMAL_BITS = 0x3C800000, 0x38800000


class QuantStateError(ValueError):
    """A quantized checkpoint was passed without its scales or random-number state, or with wrong shapes."""


def is_scaled(dtype: torch.dtype) -> bool:
    """Whether checkpoints of ``dtype`` keep fp32 scales (int8, fp8 e4m3)."""
    return dtype in QMAX


def scale_shape(state_shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """Shape of the scales of a state of ``state_shape`` scaled over dimension ``dim``."""
    shape = list(state_shape)
    del shape[dim]
    return tuple(shape)


def check_quant_args(state: torch.Tensor, state_scale: torch.Tensor | None, state_rng: torch.Tensor | None,
                     dim: int) -> None:
    """Raise QuantStateError unless the scales match the checkpoint's dtype and shape (fp32, the
    state's shape without ``dim``) and ``state_rng`` is None or a (B, 2) int64 tensor."""
    want = scale_shape(tuple(state.shape), dim)
    if is_scaled(state.dtype):
        if state_scale is None or tuple(state_scale.shape) != want or state_scale.dtype != torch.float32:
            found = None if state_scale is None else (state_scale.dtype, tuple(state_scale.shape))
            raise QuantStateError(f"a {state.dtype} checkpoint needs state_scale, fp32 of shape {want}; found {found}")
    elif state_scale is not None:
        raise QuantStateError(f"state_scale is only for int8 / fp8 checkpoints; found a {state.dtype} checkpoint")
    if state_rng is not None:
        if state.dtype == torch.float32:
            raise QuantStateError("stochastic rounding (state_rng) needs a checkpoint below fp32; found fp32")
        if state_rng.dtype != torch.int64 or tuple(state_rng.shape) != (state.shape[0], 2):
            raise QuantStateError(f"state_rng must be int64 of shape ({state.shape[0]}, 2); found {state_rng.dtype} "
                                  f"{tuple(state_rng.shape)}")


def check_step_state(state: torch.Tensor) -> None:
    """The fused per-step kernels store plain states: raise QuantStateError for a scaled one (the
    replay kernels, at any buffer length including 1, handle int8 / fp8 checkpoints)."""
    if is_scaled(state.dtype):
        raise QuantStateError(f"the per-step decode keeps no scales; found a {state.dtype} state (use the replay "
                              "decode, which takes state_scale, at buffer_len 1 if every step must flush)")


# ------------------------------------------------------------------------------------------- hash
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32), without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on uint32 values held in int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, M1)
    x = x ^ (x >> 15)
    x = _mul32(x, M2)
    return x ^ (x >> 16)


def row_key(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Per-row 32-bit key of one flush from the row's seed and flush counter (int64 tensors)."""
    h = _mix((seed & MASK32) ^ GOLD)
    h = _mix(h ^ (counter & MASK32))
    return _mix(h ^ ((counter >> 32) & MASK32))


def hash_uniform_bits(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """32 random bits (int64 in [0, 2^32)) for element ``index`` under row key ``key`` (broadcast)."""
    return _mix(_mul32(index & MASK32, GOLD2) ^ key)


def init_state_rng(batch: int, seed: int, salt: int, device) -> torch.Tensor:
    """(batch, 2) int64 [seed, counter 0] per row: row ``r``'s seed mixes ``seed``, ``salt`` (the
    layer) and r, so that rows and layers draw different streams."""
    rows = torch.arange(batch, dtype=torch.int64, device=device)
    base = _mix(torch.full_like(rows, seed & MASK32) ^ _mix(torch.full_like(rows, (salt * GOLD) & MASK32)))
    return torch.stack([_mix(base ^ _mul32(rows, GOLD2)), torch.zeros_like(rows)], dim=1)


def _state_bits(state_rng: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Random bits (B, *shape) for every element of each row's state, at the rows' current counters."""
    key = row_key(state_rng[:, 0], state_rng[:, 1]).view(-1, *([1] * len(shape)))
    idx = torch.arange(int(torch.tensor(shape).prod()) if shape else 1, dtype=torch.int64,
                       device=state_rng.device).view(1, *shape)
    return hash_uniform_bits(key, idx)


# --------------------------------------------------------------------------------------- rounding
def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _float(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).contiguous().view(torch.float32)


def _sr_float(v: torch.Tensor, u: torch.Tensor, drop: int, min_normal_bits: int | None, sub_scale: float | None):
    """Stochastic rounding of fp32 ``v`` to a float format keeping ``23 - drop`` mantissa bits:
    add ``drop`` random bits to the magnitude, truncate (unbiased; carries into the exponent).
    Below the format's smallest normal (``min_normal_bits``) its fixed quantum ``1 / sub_scale``:
    ``floor(v * sub_scale + r) / sub_scale``."""
    b = _bits(v).to(torch.int64)
    mag = b & 0x7FFFFFFF
    sign = b & 0x80000000
    rand = u >> (32 - drop)
    keep = ~((1 << drop) - 1)
    finite = mag < 0x7F800000
    rounded = torch.where(finite, (mag + rand) & keep, mag)
    word = rounded | sign  # the uint32 pattern, as the int32 it is
    out = _float(torch.where(word >= 2**31, word - 2**32, word))
    if min_normal_bits is not None:
        r = (u >> 8).to(torch.float32) * 2.0 ** -24
        sub = torch.floor(v * sub_scale + r) / sub_scale
        out = torch.where(mag < min_normal_bits, sub, out)
    return out


def _rn_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``v`` (|v| <= 448) to the nearest e4m3 value, ties to even, with integer and fp32
    operations only (so the Triton kernels round identically, whatever their cast does)."""
    b = _bits(v).to(torch.int64)
    mag = b & 0x7FFFFFFF
    sign = b & 0x80000000
    rounded = (mag + 0x7FFFF + ((mag >> 20) & 1)) & ~0xFFFFF
    word = rounded | sign
    normal = _float(torch.where(word >= 2**31, word - 2**32, word))
    t = v.abs() * 512.0  # below 2^-6: multiples of 2^-9; adding 2^23 rounds to an integer, ties to even
    sub = torch.copysign(((t + 8388608.0) - 8388608.0) / 512.0, v)
    return torch.where(mag < E4M3_MIN_NORMAL_BITS, sub, normal)


def round_bits(v: torch.Tensor, dtype: torch.dtype, u: torch.Tensor | None) -> torch.Tensor:
    """fp32 ``v`` (already scaled for int8 / fp8) -> ``dtype``: nearest if ``u`` is None, else
    stochastic with the random bits ``u`` (int64 in [0, 2^32), broadcast against ``v``)."""
    v = v.float()
    if dtype == torch.int8:
        if u is None:
            return torch.round(torch.clamp(v, -127.0, 127.0)).to(torch.int8)
        r = (u >> 8).to(torch.float32) * 2.0 ** -24
        return torch.clamp(torch.floor(v + r), -127.0, 127.0).to(torch.int8)
    if dtype == torch.float8_e4m3fn:
        v = torch.clamp(v, -448.0, 448.0)
        v = _rn_e4m3(v) if u is None else _sr_float(v, u, 20, E4M3_MIN_NORMAL_BITS, 512.0)
        return v.to(dtype)
    if dtype == torch.float16 and u is not None:
        v = _sr_float(torch.clamp(v, -65504.0, 65504.0), u, 13, FP16_MIN_NORMAL_BITS, 2.0 ** 24)
        return torch.clamp(v, -65504.0, 65504.0).to(dtype)
    if dtype == torch.bfloat16 and u is not None:
        return _sr_float(v, u, 16, None, None).to(dtype)
    return v.to(dtype)


def quantize(s: torch.Tensor, dtype: torch.dtype, dim: int, u: torch.Tensor | None = None):
    """fp32 ``s`` -> (stored values in ``dtype``, fp32 scales over ``dim`` or None).

    int8 / fp8: absmax over ``dim``, ``d = amax / QMAX``, values ``round(s * (QMAX / amax))``
    (0 where amax is below ``AMAX_FLOOR`` or NaN; a NaN or inf in a vector leaves its scale non-finite).
    Other dtypes: ``round_bits`` of ``s`` itself."""
    s = s.float()
    if not is_scaled(dtype):
        return round_bits(s, dtype, u), None
    qmax = QMAX[dtype]
    amax = s.abs().amax(dim=dim, keepdim=True)
    enc = torch.where(amax >= AMAX_FLOOR, qmax / amax, torch.zeros((), device=s.device))
    return round_bits(s * enc, dtype, u), (amax / qmax).squeeze(dim)


def dequantize(q: torch.Tensor, scale: torch.Tensor | None, dim: int) -> torch.Tensor:
    """Stored values (and their scales over ``dim``) -> fp32."""
    if scale is None:
        return q.float()
    return q.float() * scale.unsqueeze(dim)


# ---------------------------------------------------------------------------- checkpoint in place
def load_state(state: torch.Tensor, state_scale: torch.Tensor | None, dim: int) -> torch.Tensor:
    """The checkpoint as fp32 (B, ...)."""
    return dequantize(state, state_scale if is_scaled(state.dtype) else None, dim)


def advance_flush_counters(state_rng: torch.Tensor, cursor: torch.Tensor, L: int) -> None:
    """Advance the counter of every row that flushes this step (cursor ``L - 1``): what
    ``store_state`` does for its rows, as one device op a Triton launch runs first."""
    state_rng[:, 1].add_((cursor == L - 1).to(torch.int64))


def store_state(state: torch.Tensor, state_scale: torch.Tensor | None, state_rng: torch.Tensor | None,
                s: torch.Tensor, rows: torch.Tensor, dim: int) -> None:
    """Write fp32 ``s`` (B, ...) as the checkpoint of the rows where ``rows`` (B,) bool is true,
    in place (their scales too). With ``state_rng`` the rounding is stochastic: those rows'
    counters advance by one first, and the draws use the advanced counters."""
    B = state.shape[0]
    u = None
    if state_rng is not None:
        state_rng[:, 1].add_(rows.to(torch.int64))
        u = _state_bits(state_rng, tuple(state.shape[1:]))
    q, scale = quantize(s, state.dtype, dim, u)
    sel = rows.view(B, *([1] * (state.dim() - 1)))
    if state.dtype == torch.float8_e4m3fn:  # (torch.where has no fp8 kernels: select the bytes)
        state.view(torch.uint8).copy_(torch.where(sel, q.view(torch.uint8), state.view(torch.uint8)))
    else:
        state.copy_(torch.where(sel, q, state))
    if scale is not None:
        state_scale.copy_(torch.where(rows.view(B, *([1] * (scale.dim() - 1))), scale, state_scale))


def commit_materialized(state: torch.Tensor, state_scale: torch.Tensor | None, state_rng: torch.Tensor | None,
                        cursor: torch.Tensor, s: torch.Tensor, s0: torch.Tensor, dim: int) -> torch.Tensor:
    """End of a reference materialize: rows with entries (``cursor > 0``) take the folded fp32 ``s``,
    the others keep ``s0``; the result is written as the checkpoint (a plain one rounded whole, a
    quantized or stochastic one only where entries were folded) and those rows' cursors reset to 0.
    Returns the fp32 states (B, ...)."""
    active = cursor > 0
    s = torch.where(active.view(-1, *([1] * (s.dim() - 1))), s, s0)
    if state_scale is None and state_rng is None:
        state.copy_(s.to(state.dtype))
    else:
        store_state(state, state_scale, state_rng, s, active, dim)
    cursor.copy_(torch.where(active, torch.zeros_like(cursor), cursor))
    return s
