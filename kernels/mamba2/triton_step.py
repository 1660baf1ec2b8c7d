"""Fused per-step Mamba-2 decode kernel (the baseline ReplaySSM is measured against).

Same semantics as ``mamba2_step_decode_reference``: every step reads the whole state,
applies ``S <- exp(A dt) S + dt x B^T`` in fp32, writes it back in the state dtype and
reads ``y = S C + D x`` (then the optional ``z`` gate) from the fp32 state.

One program per (row, head, block of ``BLOCK_P`` head-dim lanes); the state dim is
streamed in ``BLOCK_N`` tiles. One launch, no host sync.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..backend import num_sms
from .triton_decode import _pow2, _softplus

__all__ = ["mamba2_step_decode_triton", "launch_mamba2_step_decode", "make_step_config", "step_config"]


@triton.jit
def _mamba2_step_kernel(
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
        d = _softplus(d)
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


def make_step_config(P: int, N: int, BLOCK_P: int, BLOCK_N: int | None = None, num_warps: int = 4,
                     num_stages: int = 1) -> dict:
    if BLOCK_N is None:
        BLOCK_N = max(16, min(_pow2(N), 256)) if N <= 256 else 128
    return dict(BLOCK_P=int(BLOCK_P), BLOCK_N=int(BLOCK_N), n_pb=triton.cdiv(P, BLOCK_P), num_warps=int(num_warps),
                num_stages=int(num_stages))


@functools.lru_cache(maxsize=1024)
def step_config(Bt: int, H: int, P: int, N: int, state_bytes: int, n_sm: int) -> dict:
    BLOCK_N = max(16, min(_pow2(N), 256)) if N <= 256 else 128
    if state_bytes == 4:
        # fp32 state: small tiles, two warps (best of the H200 sweep: 0.95 of the byte floor)
        return make_step_config(P, N, max(1, min(_pow2(P), 1024 // BLOCK_N)), BLOCK_N, num_warps=2)
    BLOCK_P = max(4, min(_pow2(P), 4096 // BLOCK_N))
    while BLOCK_P > 8 and Bt * H * triton.cdiv(P, BLOCK_P) < 4 * n_sm:
        BLOCK_P //= 2
    return make_step_config(P, N, BLOCK_P, BLOCK_N)


def launch_mamba2_step_decode(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out, config=None):
    Bt, H, P = x.shape
    N = state.shape[3]
    G = B.shape[1]
    if state.shape != (Bt, H, P, N) or B.shape != (Bt, G, N) or C.shape != (Bt, G, N) or dt.shape != (Bt, H):
        raise ValueError("shapes: x (B,H,P), dt (B,H), B/C (B,G,N), state (B,H,P,N)")
    if H % G != 0:
        raise ValueError(f"H={H} must be a multiple of G={G}")
    if Bt == 0:
        return
    cfg = dict(config) if config is not None else step_config(
        Bt, H, P, N, state.element_size(), num_sms(x.device.type, x.device.index))
    dummy = x
    grid = (Bt * H * cfg["n_pb"],)
    _mamba2_step_kernel[grid](
        x, dt, B, C, state, A,
        dt_bias if dt_bias is not None else dummy, D if D is not None else dummy,
        z if z is not None else dummy, out,
        H, P, N, H // G, cfg["n_pb"],
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *state.stride(), A.stride(0),
        dt_bias.stride(0) if dt_bias is not None else 0, D.stride(0) if D is not None else 0,
        *(z.stride() if z is not None else (0, 0, 0)), *out.stride(),
        HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_P=cfg["BLOCK_P"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def mamba2_step_decode_triton(x, dt, B, C, state, A, dt_bias=None, D=None, z=None, dt_softplus=True):
    """Fused per-step decode; same signature and semantics as ``mamba2_step_decode_reference``."""
    from .ops import step_decode_op

    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step_decode_op(x, dt, B, C, state, A, dt_bias, D, z, bool(dt_softplus), out)
    return out
