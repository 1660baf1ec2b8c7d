"""Fused Triton kernel of the ordinary per-step delta-rule recurrence (the baseline).

One program owns one (row, value head, block of BV value columns) and the whole key dim:
load the state tile, decay it, ``r = S^T k``, ``u = beta (v - r)``, ``S += k u^T``,
``o = S^T q``, store the state tile. The state is read and written every step.
Same conventions as ``delta_step_decode_reference`` (Hugging Face's order, fp32
arithmetic, the state rounded once to its dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["delta_step_decode_triton"]


@triton.jit
def _delta_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr,
    sq_b, sq_h, sq_k,
    sk_b, sk_h, sk_k,
    sv_b, sv_h, sv_v,
    sg_b, sg_h, sg_k,
    sbt_b, sbt_h,
    ss_b, ss_h, ss_k, ss_v,
    so_b, so_h, so_v,
    HV, GROUP, K, V, NV,
    KDA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    pid = tl.program_id(0)
    i_v = pid % NV
    i_bh = pid // NV
    b = (i_bh // HV).to(tl.int64)
    h = i_bh % HV
    hk = h // GROUP

    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    s_ptrs = s_ptr + b * ss_b + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
    s_mask = mk[:, None] & mv[None, :]

    s = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    qv = tl.load(q_ptr + b * sq_b + hk * sq_h + offs_k * sq_k, mask=mk, other=0.0).to(tl.float32)
    kv = tl.load(k_ptr + b * sk_b + hk * sk_h + offs_k * sk_k, mask=mk, other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + b * sv_b + h * sv_h + offs_v * sv_v, mask=mv, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * sbt_b + h * sbt_h).to(tl.float32)
    if KDA:
        gv = tl.load(g_ptr + b * sg_b + h * sg_h + offs_k * sg_k, mask=mk, other=0.0).to(tl.float32)
        s = s * tl.exp(gv)[:, None]
    else:
        gs = tl.load(g_ptr + b * sg_b + h * sg_h).to(tl.float32)
        s = s * tl.exp(gs)
    r = tl.sum(s * kv[:, None], axis=0)
    u = (vv - r) * beta
    s = s + kv[:, None] * u[None, :]
    o = tl.sum(s * qv[:, None], axis=0)
    tl.store(s_ptrs, s.to(s_ptr.dtype.element_ty), mask=s_mask)
    tl.store(o_ptr + b * so_b + h * so_h + offs_v * so_v, o.to(o_ptr.dtype.element_ty), mask=mv)


def delta_step_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Triton version of ``delta_step_decode_reference`` (same arguments and result)."""
    Bt, Hk, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    if HV % Hk != 0 or tuple(q.shape) != (Bt, Hk, K) or tuple(state.shape) != (Bt, HV, K, V):
        raise ValueError("shapes: q, k (Bt, Hk, K); v (Bt, HV, V); state (Bt, HV, K, V); HV a multiple of Hk")
    kda = g.dim() == 3
    BK = max(16, triton.next_power_of_2(K))
    if BK > 256:
        raise NotImplementedError("delta_step_decode_triton keeps the whole key dim in one tile (K <= 256)")
    out = torch.empty((Bt, HV, V), dtype=v.dtype, device=v.device)
    if Bt == 0:
        return out
    # Defaults from a launch sweep on an H200 at batch 256 (examples/benchmarks/bench_delta.py):
    # 64 value columns per program for fp32 states, 32 for 16-bit ones; 4 warps.
    BV = block_v or ((64 if state.element_size() >= 4 else 32) if BK <= 128 else 16)
    BV = max(16, min(BV, triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    sg = (g.stride(0), g.stride(1), g.stride(2) if kda else 0)
    _delta_step_kernel[(Bt * HV * NV,)](
        q, k, v, g, beta, state, out,
        *q.stride(), *k.stride(), *v.stride(), *sg, *beta.stride(), *state.stride(), *out.stride(),
        HV, HV // Hk, K, V, NV,
        KDA=kda, BK=BK, BV=BV,
        num_warps=num_warps or (4 if BK <= 128 else 8),
    )
    return out
