"""Triton kernel of the query / key L2 normalisation before a delta-rule decode step.

One launch normalises both: program (row, key head, which) loads one q or k vector of K
channels in its own dtype, computes ``x * rsqrt(sum(x^2) + eps)`` in fp32 (then ``* q_scale``
for q) and stores it as fp32. In eager PyTorch the same takes about a dozen small launches per
layer and step. Semantics: ``l2norm_qk_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import check_qk_shapes

__all__ = ["l2norm_qk_triton"]


@triton.jit
def _l2norm_qk_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    H, K, q_scale, eps,
    BK: tl.constexpr,
):
    pid = tl.program_id(0)
    which = tl.program_id(1)  # 0: q, 1: k
    b = (pid // H).to(tl.int64)
    h = pid % H
    offs = tl.arange(0, BK)
    m = offs < K
    if which == 0:
        x = tl.load(q_ptr + b * sq_b + h * sq_h + offs * sq_k, mask=m, other=0.0).to(tl.float32)
    else:
        x = tl.load(k_ptr + b * sk_b + h * sk_h + offs * sk_k, mask=m, other=0.0).to(tl.float32)
    y = x * tl.math.rsqrt(tl.sum(x * x, axis=0) + eps)
    out = pid.to(tl.int64) * K + offs
    if which == 0:
        tl.store(qo_ptr + out, y * q_scale, mask=m)
    else:
        tl.store(ko_ptr + out, y, mask=m)


def l2norm_qk_triton(q: torch.Tensor, k: torch.Tensor, q_scale: float, eps: float = 1e-6):
    """q, k (Bt, H, K), any float dtype and strides -> (q_n, k_n), contiguous fp32 (Bt, H, K)."""
    check_qk_shapes(q, k)
    Bt, H, K = q.shape
    qo = torch.empty(Bt, H, K, dtype=torch.float32, device=q.device)
    ko = torch.empty_like(qo)
    if Bt * H == 0 or K == 0:
        return qo, ko
    _l2norm_qk_kernel[(Bt * H, 2)](
        q, k, qo, ko, *q.stride(), *k.stride(), H, K, float(q_scale), float(eps),
        BK=triton.next_power_of_2(K), num_warps=1 if K <= 256 else 4,
    )
    return qo, ko
