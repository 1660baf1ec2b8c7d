"""One-token decode attention over a (static) KV cache: ``decode_attention(query, key, value, mask, scale)``.

Shapes, as transformers passes them to its attention functions in a decode step:

* query (B, Hq, 1, Dk); key (B, Hkv, C, Dk); value (B, Hkv, C, Dv); Hq a multiple of Hkv (G = Hq / Hkv
  query heads per key/value head); any strides;
* mask None (every position attends) or bool broadcastable to (B, 1, 1, C), True = attend;
* scale the factor of q . k (None: Dk ** -0.5);
* returns (B, 1, Hq, Dv), contiguous, in query's dtype: the layout transformers' attention functions
  return (``sdpa_attention_forward`` transposes sdpa's (B, Hq, 1, Dv)). Its memory is that of a
  contiguous (B, Hq, 1, Dv), so ``.transpose(1, 2)`` gives sdpa's shape without a copy.

query, key and value of one dtype, fp32, bf16 or fp16; Dk and Dv up to 256 (any size: the tiles are
padded to a power of two, e.g. Kimi-Linear's 192-wide keys and 128-wide values); G up to 64.

Why a kernel: a flash kernel tiles 64 or more query rows, and a grouped one-token query has G of them
per key/value head, so cuDNN's and the efficient kernels spend most of a decode step on empty rows.
Here one program per (row, key/value head) holds all G query heads of its group (padded to 16 rows,
the smallest ``tl.dot`` tile) and streams the group's K and V tiles once each: the bytes read are the
cache's K and V and nothing else. Positions whose mask is False are never read (predicated loads),
and a program stops after its last kept position (found from the mask first, C bytes), so the unused
tail of a static cache costs neither K/V bytes nor the dots on them. Scores and the online softmax are
fp32 (exp2 with the scale folded into log2 units); P is rounded to V's dtype for the P.V product, as
flash attention does. fp32 inputs multiply as ``tf32x3`` (each operand split into a TF32 part and
its TF32 remainder, three tensor-core products): errors of the size of fp32 rounding, where a plain
TF32 product would lose 13 mantissa bits and the FMA dot of IEEE fp32 is an order of magnitude slower.

Long caches with few (row, head) pairs split C over more programs (flash-decoding): each split writes
its normalised fp32 partial output and its log2-sum-exp, and a second launch combines the splits
exactly (each weighted by exp2(lse_s - max lse)). The split count depends on the shapes only, so a
call is CUDA-graph safe (no host synchronisation; the workspace comes from the caching allocator,
inside a capture from the graph's pool).

Rows whose mask is all False give zeros, no NaN: what torch's sdpa (>= 2.5) gives for a bool mask
without a True on the CPU and in its math backend on CUDA ("safe softmax"), which the tests check. In
transformers such rows exist only for the padding queries of a left-padded prefill (several query
tokens, never this kernel's input): a decode step's query always attends to its own position.

``decode_attention_reference`` (sdpa on the repeated keys and values) is the CPU path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import num_sms, resolve_backend
from .dependent import dependent, launch_options, start_dependent
from .split_dot import dot_precision

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
MAX_GROUP = 64
#: smallest M tile of ``tl.dot``: a group of fewer query heads is padded to it
MIN_BLOCK_H = 16
#: mask positions a program reads at once while looking for its last kept position
MASK_CHUNK = 1024


def decode_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
    """PyTorch reference of ``decode_attention`` (the CPU path): sdpa on keys and values repeated per
    query head, transposed to transformers' (B, 1, Hq, Dv)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).contiguous()


def unsupported(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> str | None:
    """Why the Triton kernel cannot take these inputs (a sentence), or None when it can."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return f"expected 4-D query, key and value; got {query.dim()}-D, {key.dim()}-D, {value.dim()}-D"
    B, Hq, T, Dk = query.shape
    Bk, Hkv, C, Dk2 = key.shape
    if T != 1:
        return f"expected one query token (query (B, Hq, 1, D)); got {T}"
    if (Bk, Hkv, C) != tuple(value.shape[:3]) or Bk != B or Dk2 != Dk:
        return (f"expected query (B, Hq, 1, Dk), key (B, Hkv, C, Dk), value (B, Hkv, C, Dv); got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if Hkv == 0 or Hq % Hkv or Hq // Hkv > MAX_GROUP:
        return f"expected Hq a multiple of Hkv with at most {MAX_GROUP} query heads per key head; got {Hq}, {Hkv}"
    if max(Dk, value.shape[-1]) > MAX_HEAD_DIM or C == 0 or B == 0:
        return f"expected head dims up to {MAX_HEAD_DIM} and a non-empty cache; got {Dk}, {value.shape[-1]}, C={C}"
    if query.dtype not in DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"expected query, key and value of one dtype among fp32/bf16/fp16; got {query.dtype}, " \
               f"{key.dtype}, {value.dtype}"
    if key.device != query.device or value.device != query.device:
        return "expected query, key and value on one device"
    if mask is not None:
        if mask.dtype != torch.bool or mask.device != query.device:
            return f"expected a bool mask on the query's device; got {mask.dtype} on {mask.device}"
        if mask.dim() != 4 or mask.shape[1:3] != (1, 1) or mask.shape[0] not in (1, B) or mask.shape[3] != C:
            return f"expected a mask broadcastable to (B, 1, 1, C) = {(B, 1, 1, C)}; got {tuple(mask.shape)}"
    return None


@dataclass(frozen=True)
class DecodeLaunch:
    """Launch parameters: ``block_n`` cache positions per tile, ``splits`` programs per (row, head)
    over the cache (1: one launch, no workspace), warps and pipeline stages of the main kernel."""

    block_n: int
    splits: int
    num_warps: int = 4
    num_stages: int = 2


def default_launch(batch: int, kv_heads: int, length: int, head_dim: int, device: torch.device) -> DecodeLaunch:
    """Tiles of 64 positions (32 for head dims over 128, to keep a K and a V tile per stage within
    shared memory); a split over the cache only when the (row, head) pairs fill fewer than two
    programs per multiprocessor, and then of at least two tiles per split."""
    block_n = 64 if head_dim <= 128 else 32
    tiles = triton.cdiv(length, block_n)
    pairs = batch * kv_heads
    want = triton.cdiv(2 * num_sms(device.type, device.index), pairs)
    splits = max(1, min(want, tiles // 2))
    splits = triton.cdiv(tiles, triton.cdiv(tiles, splits))  # no empty split
    return DecodeLaunch(block_n=block_n, splits=splits)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, lse_ptr, scale_log2, C, G, DK, DV, tiles_per_split,
                   stride_qb, stride_qh, stride_qd, stride_kb, stride_kh, stride_kc, stride_kd,
                   stride_vb, stride_vh, stride_vc, stride_vd, stride_mb, stride_mc,
                   stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_MASK: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                   MASK_CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    # program (b, h, s): the G query heads of key/value head h of row b, against the tiles of split s
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    rows = tl.arange(0, BLOCK_H)
    heads = h * G + rows
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dk[None, :] * stride_qd,
                mask=(rows[:, None] < G) & (dk[None, :] < DK), other=0.0)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    start = s * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, C)
    if HAS_MASK:  # stop after the split's last kept position: a static cache's unused tail costs no tiles
        last = start - 1
        for c0 in range(start, end, MASK_CHUNK):
            c = c0 + tl.arange(0, MASK_CHUNK)
            kept = tl.load(mask_ptr + b * stride_mb + c * stride_mc, mask=c < end, other=0) != 0
            last = tl.maximum(last, tl.max(tl.where(kept, c, -1), axis=0))
        end = last + 1
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        keep = n < end
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptr + b * stride_mb + n * stride_mc, mask=keep, other=0) != 0)
        kt = tl.load(k_base + n[None, :] * stride_kc + dk[:, None] * stride_kd,
                     mask=keep[None, :] & (dk[:, None] < DK), other=0.0)  # (BLOCK_DK, BLOCK_N)
        scores = tl.dot(q, kt, input_precision=PRECISION) * scale_log2
        scores = tl.where(keep[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing kept yet stays at zero
        alpha = tl.exp2(m - shift)
        p = tl.exp2(scores - shift[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * stride_vc + dv[None, :] * stride_vd,
                    mask=keep[:, None] & (dv[None, :] < DV), other=0.0)  # (BLOCK_N, BLOCK_DV)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]  # no position kept: zeros
    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + dv[None, :] * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < G) & (dv[None, :] < DV))
    if SPLIT:
        lse = tl.where(l > 0.0, m + tl.log2(tl.where(l > 0.0, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + s * stride_ls, lse, mask=rows < G)


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, out_ptr, S, DV, stride_pb, stride_ph, stride_ps, stride_pd,
                    stride_lb, stride_lh, stride_ls, stride_ob, stride_oh, stride_od,
                    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    # program (b, head): out = sum_s w_s o_s / sum_s w_s, w_s = exp2(lse_s - max lse); empty splits weigh 0
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    dv = tl.arange(0, BLOCK_DV)
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + sp * stride_ls, mask=sp < S, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))
    part = tl.load(part_ptr + b * stride_pb + h * stride_ph + sp[:, None] * stride_ps + dv[None, :] * stride_pd,
                   mask=(sp[:, None] < S) & (dv[None, :] < DV), other=0.0)
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dv * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=dv < DV)


def decode_attention_triton(query, key, value, mask, scale, *, launch: DecodeLaunch | None = None) -> torch.Tensor:
    """Triton ``decode_attention`` (inputs checked by the caller); ``launch`` overrides ``default_launch``."""
    B, Hq, _, Dk = query.shape
    _, Hkv, C, Dv = value.shape
    G = Hq // Hkv
    launch = launch or default_launch(B, Hkv, C, max(Dk, Dv), query.device)
    tiles = triton.cdiv(C, launch.block_n)
    tiles_per_split = triton.cdiv(tiles, launch.splits)
    splits = triton.cdiv(tiles, tiles_per_split)
    out = torch.empty((B, 1, Hq, Dv), dtype=query.dtype, device=query.device)
    if mask is not None:
        mask = mask.expand(B, 1, 1, C).view(torch.uint8)
    m_arg, m_strides = (mask, (mask.stride(0), mask.stride(3))) if mask is not None else (out, (0, 0))
    if splits > 1:
        part = torch.empty((B, Hq, splits, Dv), dtype=torch.float32, device=query.device)
        lse = torch.empty((B, Hq, splits), dtype=torch.float32, device=query.device)
        dest, dest_strides, lse_strides = part, part.stride(), lse.stride()
    else:
        lse = None
        dest, dest_strides, lse_strides = out, (out.stride(0), out.stride(2), 0, out.stride(3)), (0, 0, 0)
    scale = Dk ** -0.5 if scale is None else float(scale)
    pdl = dependent(query.device)
    precision = dot_precision(None) if query.dtype == torch.float32 else "tf32"  # tf32: unused by 16-bit inputs
    _decode_kernel[(B, Hkv, splits)](
        query, key, value, m_arg, dest, lse if lse is not None else dest, scale * math.log2(math.e), C, G, Dk, Dv,
        tiles_per_split, query.stride(0), query.stride(1), query.stride(3), *key.stride(), *value.stride(),
        *m_strides, *dest_strides, *lse_strides,
        BLOCK_H=max(MIN_BLOCK_H, triton.next_power_of_2(G)), BLOCK_N=launch.block_n,
        BLOCK_DK=max(16, triton.next_power_of_2(Dk)), BLOCK_DV=max(16, triton.next_power_of_2(Dv)),
        HAS_MASK=mask is not None, SPLIT=splits > 1, PRECISION=precision,
        MASK_CHUNK=MASK_CHUNK, NUM_STAGES=launch.num_stages, PDL=pdl, num_warps=launch.num_warps, **launch_options(pdl))
    if splits > 1:
        _combine_kernel[(B, Hq)](
            part, lse, out, splits, Dv, *part.stride(), *lse.stride(), out.stride(0), out.stride(2), out.stride(3),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_DV=max(16, triton.next_power_of_2(Dv)), PDL=pdl, num_warps=4,
            **launch_options(pdl))
    return out


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None, *, backend: str = "auto") -> torch.Tensor:
    """Attention of one query token per row over the whole cache (see the module notes); dispatches on
    ``backend`` like the other kernels. Raises ValueError for inputs the kernel does not take."""
    reason = unsupported(query, key, value, mask)
    if reason is not None:
        raise ValueError(f"decode_attention: {reason}")
    if resolve_backend(backend, query.device) == "triton":
        return decode_attention_triton(query, key, value, mask, scale)
    return decode_attention_reference(query, key, value, mask, scale)
