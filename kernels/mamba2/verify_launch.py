"""Host side of the Mamba-2 verify kernel: argument checks and the one launch (no host sync, no
decision from tensor values, so a verify can be captured in a CUDA graph). Program:
``verify_programs.py``; knobs: ``config.VerifyConfig``."""

from __future__ import annotations

import torch

from ..backend import compiled_in, num_sms, pow2
from ..cursor import cursor_word_counts_arrivals
from ..quant import check_quant_args, is_scaled
from ..quant_triton import state_format
from ..speculation import advance_fold_counters
from ..split_dot import dot_precision
from .config import VerifyConfig, program_split, verify_config
from .launch import _arrival_counter
from .reference import SCALE_DIM
from .verify import check_verify_shapes
from .verify_programs import Flags, IoStrides, Layout, Tensors, verify_kernel

__all__ = ["launch_verify", "verify_flags"]

_LOWP = (torch.bfloat16, torch.float16)


def _same_lowp(a: torch.dtype, b: torch.dtype) -> bool:
    """Whether a ``tl.dot`` of ``a`` by ``b`` operands runs as it is: both 16-bit, one dtype."""
    return a == b and a in _LOWP


def verify_flags(cfg: VerifyConfig, N: int, L: int, T: int, G: int, H: int, *, has_dt_bias: bool, has_D: bool,
                 has_z: bool, dt_softplus: bool, zero_idle: bool, on_cursor: bool, lowp_s0c: bool,
                 lowp_bc: bool, fmt: int = 0, sr: bool = False) -> Flags:
    """The compile-time switches of a verify launch of ``cfg`` (module notes of ``verify_programs``)."""
    return compiled_in(Flags(
        HAS_DT_BIAS=has_dt_bias, HAS_D=has_D, HAS_Z=has_z, DT_SOFTPLUS=bool(dt_softplus), ZERO_IDLE=bool(zero_idle),
        ON_CURSOR=on_cursor, LOWP_S0C=lowp_s0c, LOWP_BC=lowp_bc, DOT_PREC=dot_precision(cfg.dot_precision),
        BLOCK_P=cfg.block_p, BLOCK_N=min(cfg.block_n, max(16, pow2(N))), BLOCK_L=max(16, pow2(L)),
        BLOCK_T=max(8, pow2(T)), BLOCK_G=pow2(G), BLOCK_H=pow2(H), FMT=fmt, SR=bool(sr)))


def launch_verify(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                  zero_idle: bool, config: VerifyConfig | None = None, state_scale: torch.Tensor | None = None,
                  state_rng: torch.Tensor | None = None) -> None:
    """One verify step of T tokens per row written into ``out`` (Bt, T, H, P) and the in-place
    tensors (semantics: ``mamba2_replay_verify_reference``); idle rows' ``out`` gets zeros if
    ``zero_idle``. ``config``: the launch knobs (default: ``verify_config``). ``state_scale`` /
    ``state_rng``: an int8 / fp8 checkpoint's scales (the state dim then in one tile: N <= 256),
    stochastic rounding of the flush-first rows (their counters advance here, before the launch)."""
    Bt, T, H, P, G, N, L = check_verify_shapes(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, z)
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    if tuple(out.shape) != (Bt, T, H, P):
        raise ValueError(f"out must be (Bt, T, H, P) = {(Bt, T, H, P)}; got {tuple(out.shape)}")
    if Bt == 0:
        return
    cfg = config or verify_config(Bt, H, P, N, G, num_sms(x.device.type, x.device.index))
    if is_scaled(state.dtype) and cfg.block_n < N:
        raise ValueError(f"the fold of a {state.dtype} checkpoint quantizes over the whole state dim in one tile; "
                         f"expected block_n >= N = {N}, found block_n = {cfg.block_n} (N <= 256 with the defaults)")
    if state_rng is not None:
        advance_fold_counters(state_rng, cursor, T, L)
    HC, n_hc, n_pb = program_split(cfg, H, P, G)
    on_cursor = cursor_word_counts_arrivals(cursor, L)
    t = Tensors(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias if dt_bias is not None else x,
                D if D is not None else x, z if z is not None else x, out,
                cursor if on_cursor else _arrival_counter(x.device, Bt), state_scale if state_scale is not None else x,
                state_rng if state_rng is not None else cursor)
    io = IoStrides(T, *x.stride(), *dt.stride(), *B.stride(), *C.stride(), cursor.stride(0), A.stride(0),
                   dt_bias.stride(0) if dt_bias is not None else 0, D.stride(0) if D is not None else 0,
                   *(z.stride() if z is not None else (0, 0, 0, 0)), *out.stride(),
                   *(state_scale.stride() if state_scale is not None else (0, 0, 0)),
                   state_rng.stride(0) if state_rng is not None else 0)
    lay = Layout(P, N, L, G, H, H // G, HC, n_hc, n_pb, *state.stride(), *x_buf.stride(), *dt_buf.stride(),
                 *B_buf.stride())
    flags = verify_flags(cfg, N, L, T, G, H, has_dt_bias=dt_bias is not None, has_D=D is not None,
                         has_z=z is not None, dt_softplus=dt_softplus, zero_idle=zero_idle, on_cursor=on_cursor,
                         lowp_s0c=_same_lowp(state.dtype, C.dtype) or (is_scaled(state.dtype) and C.dtype in _LOWP),
                         lowp_bc=_same_lowp(B_buf.dtype, C.dtype),
                         fmt=state_format(state.dtype), sr=state_rng is not None)
    verify_kernel[(Bt * G * n_hc * n_pb,)](t, io, compiled_in(lay), flags, num_warps=cfg.num_warps, num_stages=1)
