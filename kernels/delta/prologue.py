"""Gated DeltaNet's decode-step prologue in one launch: conv step, q / k L2 norms and gates.

``gdn_prologue(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale, beta_scale)``:
x (Bt, C) the conv inputs [q | k | v] with C = 2 Hk K + HV V (``heads`` = (Hk, K, HV, V)), conv_state
(Bt, C, W) updated in place, conv_weight (C, W); a, b (Bt, HV); A_log, dt_bias (HV,). Returns q_n, k_n
(Bt, Hk, K) fp32 (L2-normalised, q times ``q_scale``), v (Bt, HV, V) in x's dtype, g and beta (Bt, HV)
fp32: what ``conv_update`` (silu), ``l2norm_qk`` and ``gdn_gates`` return in three launches (the conv
output is rounded to x's dtype before the norms, as it is between those launches; the norms' sums may
add in another order); ``count`` as ``conv_update``'s. A decode step at batch 1 is launch-bound: one
launch instead of three per layer. Each program owns one head's channels of one row (a q or k head: its
norm needs all K of them), and one more program per row computes the gates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..conv import advance_count, check_count, conv_step_tile, conv_update_reference
from ..dependent import dependent, launch_options, start_dependent
from .gdn_gates import gate_values, gdn_gates_reference
from .reference import l2norm_qk_reference

__all__ = ["gdn_prologue", "gdn_prologue_reference", "gdn_prologue_triton"]


def _split(out: torch.Tensor, heads: tuple[int, int, int, int]):
    Hk, K, HV, V = heads
    batch = out.shape[0]
    q, k, v = torch.split(out, [Hk * K, Hk * K, HV * V], dim=-1)
    return q.reshape(batch, Hk, K), k.reshape(batch, Hk, K), v.reshape(batch, HV, V)


def gdn_prologue_reference(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale,
                           beta_scale=1.0, eps=1e-6, count=None):
    """PyTorch reference of ``gdn_prologue`` (the CPU path): the three steps it fuses."""
    q, k, v = _split(conv_update_reference(conv_state, x, conv_weight, conv_bias, "silu", count), heads)
    qn, kn = l2norm_qk_reference(q, k, q_scale, eps)
    g, beta = gdn_gates_reference(a, b, A_log, dt_bias, beta_scale)
    return qn, kn, v.contiguous(), g, beta


@triton.jit
def _gdn_prologue_kernel(state_ptr, x_ptr, w_ptr, bias_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, qn_ptr, kn_ptr, v_ptr,
                         g_ptr, beta_ptr, count_ptr, stride_sb, stride_sc, stride_sk, stride_xb, stride_xc,
                         stride_a, stride_b,
                         q_scale, beta_scale, eps, Hk, HV, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                         WP: tl.constexpr, BC: tl.constexpr, BH: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_COUNT: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    advance_count(count_ptr, 1, HAS_COUNT)
    row = tl.program_id(0)
    j = tl.program_id(1)  # q heads, k heads, v heads, then the gates
    lanes = tl.arange(0, BC)
    if j < 2 * Hk:
        cols = j * K + lanes
        cmask = lanes < K
        acc = conv_step_tile(state_ptr, x_ptr, w_ptr, bias_ptr, row, cols, cmask, stride_sb, stride_sc, stride_sk,
                             stride_xb, stride_xc, W, WP, HAS_BIAS, True)
        y = tl.where(cmask, acc.to(v_ptr.dtype.element_ty).to(tl.float32), 0.0)  # rounded as between launches
        y = y * tl.math.rsqrt(tl.sum(y * y, axis=0) + eps)
        out = (row * Hk + j % Hk).to(tl.int64) * K + lanes
        if j < Hk:
            tl.store(qn_ptr + out, y * q_scale, mask=cmask)
        else:
            tl.store(kn_ptr + out, y, mask=cmask)
    elif j < 2 * Hk + HV:
        hv = j - 2 * Hk
        cols = 2 * Hk * K + hv * V + lanes
        cmask = lanes < V
        acc = conv_step_tile(state_ptr, x_ptr, w_ptr, bias_ptr, row, cols, cmask, stride_sb, stride_sc, stride_sk,
                             stride_xb, stride_xc, W, WP, HAS_BIAS, True)
        tl.store(v_ptr + (row * HV + hv).to(tl.int64) * V + lanes, acc.to(v_ptr.dtype.element_ty), mask=cmask)
    else:
        heads = tl.arange(0, BH)
        mask = heads < HV
        g, beta = gate_values(a_ptr, b_ptr, alog_ptr, dtb_ptr, row, stride_a, stride_b, heads, mask, beta_scale)
        tl.store(g_ptr + row * HV + heads, g, mask=mask)
        tl.store(beta_ptr + row * HV + heads, beta, mask=mask)


def gdn_prologue_triton(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale, beta_scale=1.0,
                        eps=1e-6, count=None):
    """Triton ``gdn_prologue`` (one launch; no checks beyond the wrapper's)."""
    Hk, K, HV, V = heads
    batch, _, width = conv_state.shape
    dev = x.device
    qn = torch.empty((batch, Hk, K), dtype=torch.float32, device=dev)
    kn = torch.empty_like(qn)
    v = torch.empty((batch, HV, V), dtype=x.dtype, device=dev)
    g = torch.empty((batch, HV), dtype=torch.float32, device=dev)
    beta = torch.empty_like(g)
    if batch == 0:
        if count is not None:
            count.add_(1)
        return qn, kn, v, g, beta
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    weight = conv_weight.contiguous()
    block = triton.next_power_of_2(max(K, V))
    pdl = dependent(dev)
    _gdn_prologue_kernel[(batch, 2 * Hk + HV + 1)](
        conv_state, x, weight, conv_bias if conv_bias is not None else weight, a, b, A_log, dt_bias, qn, kn, v, g,
        beta, count if count is not None else g, *conv_state.stride(), *x.stride(), a.stride(0), b.stride(0),
        float(q_scale), float(beta_scale), float(eps), Hk, HV, K=K, V=V, W=width, WP=triton.next_power_of_2(width),
        BC=block, BH=triton.next_power_of_2(HV), HAS_BIAS=conv_bias is not None, HAS_COUNT=count is not None,
        PDL=pdl, num_warps=4, **launch_options(pdl))
    return qn, kn, v, g, beta


def gdn_prologue(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale, beta_scale=1.0,
                 eps=1e-6, count=None, *, backend: str = "auto"):
    """The prologue of one Gated DeltaNet decode step (see the module notes); dispatches on ``backend``."""
    from ..backend import resolve_backend

    Hk, K, HV, V = heads
    C = 2 * Hk * K + HV * V
    if x.dim() != 2 or x.shape[1] != C or conv_state.shape[:2] != x.shape or conv_weight.shape != (
            C, conv_state.shape[2]):
        raise ValueError(f"gdn_prologue expects x (B, {C}) = (B, 2 Hk K + HV V), conv_state (B, {C}, W), conv_weight "
                         f"({C}, W); got {tuple(x.shape)}, {tuple(conv_state.shape)}, {tuple(conv_weight.shape)}")
    if a.shape != (x.shape[0], HV) or b.shape != a.shape or A_log.shape != (HV,) or dt_bias.shape != (HV,):
        raise ValueError(f"gdn_prologue expects a, b ({x.shape[0]}, {HV}) and A_log, dt_bias ({HV},); got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(A_log.shape)}, {tuple(dt_bias.shape)}")
    check_count(count, x.device)
    if not torch.compiler.is_compiling() and resolve_backend(backend, x.device) == "triton":
        return gdn_prologue_triton(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale,
                                   beta_scale, eps, count)
    return gdn_prologue_reference(conv_state, x, conv_weight, conv_bias, a, b, A_log, dt_bias, heads, q_scale,
                                  beta_scale, eps, count)
