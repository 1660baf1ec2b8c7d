"""Triton program of the ordinary per-step Mamba-2 decode step (the baseline ReplaySSM is
measured against; semantics: ``mamba2_step_decode_reference``). Launch: ``launch.launch_step``."""

from __future__ import annotations

import triton
import triton.language as tl

from .heads import softplus


@triton.jit
def step_kernel(
    x_ptr, dt_ptr, B_ptr, C_ptr, state_ptr, A_ptr, dtbias_ptr, D_ptr, z_ptr, out_ptr,
    H, P, N, HPG, n_pb,
    sx_b, sx_h, sx_p,
    sdt_b, sdt_h,
    sB_b, sB_g, sB_n,
    sC_b, sC_g, sC_n,
    ss_b, ss_h, ss_p, ss_n,
    sA, sdtb, sD,
    sz_b, sz_h, sz_p,
    so_b, so_h, so_p,
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The per-step recurrence (the baseline): ``S <- exp(A dt) S + dt x B^T`` in fp32, written back
    in the state dtype, ``y = S C + D x`` (then the optional ``z`` gate). One program per (row,
    head, block of BLOCK_P lanes); the state dim streamed in BLOCK_N tiles."""
    pid = tl.program_id(0)
    pb = pid % n_pb
    t = pid // n_pb
    h = t % H
    b = (t // H).to(tl.int64)
    g = h // HPG

    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < P
    offs_n = tl.arange(0, BLOCK_N)

    a_h = tl.load(A_ptr + h * sA).to(tl.float32)
    d = tl.load(dt_ptr + b * sdt_b + h * sdt_h).to(tl.float32)
    if HAS_DT_BIAS:
        d += tl.load(dtbias_ptr + h * sdtb).to(tl.float32)
    if DT_SOFTPLUS:
        d = softplus(d)
    decay = tl.exp(d * a_h)
    xc = tl.load(x_ptr + b * sx_b + h * sx_h + offs_p * sx_p, mask=mask_p, other=0.0).to(tl.float32)

    s_h = state_ptr + b * ss_b + h * ss_h
    B_row = B_ptr + b * sB_b + g * sB_g
    C_row = C_ptr + b * sC_b + g * sC_g
    acc = tl.zeros([BLOCK_P], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        nn = n0 + offs_n
        mn = nn < N
        sp = s_h + offs_p[:, None] * ss_p + nn[None, :] * ss_n
        m2 = mask_p[:, None] & mn[None, :]
        s = tl.load(sp, mask=m2, other=0.0).to(tl.float32)
        bv = tl.load(B_row + nn * sB_n, mask=mn, other=0.0).to(tl.float32)
        cv = tl.load(C_row + nn * sC_n, mask=mn, other=0.0).to(tl.float32)
        s = s * decay + (d * bv)[None, :] * xc[:, None]
        tl.store(sp, s.to(state_ptr.dtype.element_ty), mask=m2)
        acc += tl.sum(s * cv[None, :], 1)
    y = acc
    if HAS_D:
        y += tl.load(D_ptr + h * sD).to(tl.float32) * xc
    if HAS_Z:
        zv = tl.load(z_ptr + b * sz_b + h * sz_h + offs_p * sz_p, mask=mask_p, other=0.0).to(tl.float32)
        y = y * (zv * tl.sigmoid(zv))
    tl.store(out_ptr + b * so_b + h * so_h + offs_p * so_p, y.to(out_ptr.dtype.element_ty), mask=mask_p)
