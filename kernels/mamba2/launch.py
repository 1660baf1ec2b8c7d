"""Host side of the Mamba-2 Triton kernels: argument checks and the launches (no host sync, so a
step can be captured in a CUDA graph). Kernels: ``programs.py``; launch knobs: ``config.py``."""

from __future__ import annotations

import dataclasses

import torch
import triton

from ..backend import compiled_in, num_sms, pow2
from ..persistent import FLUSH_ROWS
from ..quant import advance_flush_counters, check_quant_args, is_scaled
from ..quant_triton import int8_words, state_format
from ..split_dot import dot_precision
from .config import LaunchConfig, StepConfig, default_config, program_split, step_config
from .programs import Flags, IoStrides, Layout, Tensors, replay_kernel, replay_kernel_dyn
from .step import step_kernel

__all__ = ["check_arrivals", "launch_replay", "launch_step", "replay_flags"]

_COUNTERS: dict = {}
_COUNTER_KEEP: list = []  # never freed: a captured CUDA graph may still point at an old one


def check_arrivals(arrivals: torch.Tensor, n: int, device: torch.device) -> None:
    """Raise ``ValueError`` unless ``arrivals`` can count the arrivals of ``n`` rows on ``device``."""
    if arrivals.dtype != torch.int32 or arrivals.dim() != 1 or arrivals.numel() < n or arrivals.stride(0) != 1 \
            or arrivals.device != device:
        raise ValueError(f"arrivals must be a contiguous int32 vector of at least {n} entries on {device}; got "
                         f"{arrivals.dtype} {tuple(arrivals.shape)} stride {tuple(arrivals.stride())} on "
                         f"{arrivals.device}")


def _arrival_counter(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters on ``device`` (left at zero by every launch), shared by every
    call on the device without ``arrivals``: such calls on concurrent streams must not overlap."""
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(4096, triton.next_power_of_2(n)), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
        _COUNTER_KEEP.append(buf)
    return buf


def _check(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, out):
    Bt, H, P = x.shape
    if state.shape[:3] != (Bt, H, P) or state.dim() != 4:
        raise ValueError(f"state must be (B, H, P, N) = ({Bt}, {H}, {P}, N); got {tuple(state.shape)}")
    N = state.shape[3]
    G = B.shape[1]
    if H % G != 0:
        raise ValueError(f"H={H} must be a multiple of G={G}")
    L = x_buf.shape[2]
    if x_buf.shape != (Bt, H, L, P) or dt_buf.shape != (Bt, H, L) or B_buf.shape != (Bt, G, L, N):
        raise ValueError("x_buf/dt_buf/B_buf must be (B,H,L,P)/(B,H,L)/(B,G,L,N)")
    if B.shape != (Bt, G, N) or C.shape != (Bt, G, N) or dt.shape != (Bt, H) or cursor.shape != (Bt,):
        raise ValueError("B, C must be (B,G,N); dt (B,H); cursor (B,)")
    if out is not None and out.shape != (Bt, H, P):
        raise ValueError("out must be (B, H, P)")
    return Bt, H, P, N, G, L


def uses_lowp_dot(state_dtype: torch.dtype, x_buf_dtype: torch.dtype, B_buf_dtype: torch.dtype) -> bool:
    """Whether the flush ``tl.dot`` runs on 16-bit operands: 16-bit rings of one dtype beside a 16-bit
    checkpoint, or an 8-bit one (whose rounding after the product is coarser than the 16-bit
    rounding of its decay-weighted B operand)."""
    return state_dtype.itemsize <= 2 and x_buf_dtype.itemsize == 2 and x_buf_dtype == B_buf_dtype


def split_routes(cfg: LaunchConfig, n_rows: int) -> bool:
    """Whether a replay launch of ``cfg`` over ``n_rows`` rows runs as two launches (``LaunchConfig``)."""
    return cfg.split_routes and n_rows <= FLUSH_ROWS


def state_words(state: torch.Tensor, cfg: LaunchConfig) -> torch.Tensor | None:
    """An int8 checkpoint viewed as int32 words of 4 codes along N, for the one-tile output-only launch
    of split routes (``Flags.WORDS``); None where the checkpoint is not int8, the launch does not read
    one tile, or N or a stride is not a multiple of 4 (the launch then reads bytes)."""
    return int8_words(state) if cfg.block_n >= state.shape[3] else None


def replay_flags(cfg: LaunchConfig, N: int, L: int, n_rows: int, *, has_dt_bias: bool, has_D: bool, has_z: bool,
                 dt_softplus: bool, zero_idle: bool, lowp: bool, fmt: int = 0, sr: bool = False,
                 route: int = 0, words: bool = False) -> Flags:
    """The compile-time switches of a replay launch of ``cfg`` over ``n_rows`` rows; ``route``: 0 one
    launch, 1 / 2 the output-only / flush launch of ``split_routes``; ``words``: the launch has the
    checkpoint's int32 view (``state_words``), which the output-only launch reads (``WORDS`` 1, or 2
    with ``cfg.word_dots``)."""
    # one state tile: the first head's loads go out before the cursor (not in a flush launch, whose
    # other rows' programs only arrive)
    early = cfg.block_n >= N and route != 2
    flush_first = (cfg.flush_first and route != 1) or route == 2
    flush_first_bb = pow2(n_rows) if flush_first and n_rows <= FLUSH_ROWS else 0
    return compiled_in(Flags(
        HAS_DT_BIAS=has_dt_bias, HAS_D=has_D, HAS_Z=has_z, DT_SOFTPLUS=bool(dt_softplus),
        ZERO_IDLE=bool(zero_idle), DOT_LOWP=lowp, DOT_PREC=dot_precision(cfg.dot_precision),
        FLUSH_FMA=cfg.flush_fma, EARLY=early,
        FLUSH_FROM_EARLY=early and cfg.flush_block_n == cfg.block_n, FLUSH_FIRST_BB=flush_first_bb,
        BLOCK_P=cfg.block_p, BLOCK_N=cfg.block_n, BLOCK_NF=cfg.flush_block_n, BLOCK_L=max(16, pow2(L)), FMT=fmt,
        SR=bool(sr), ROUTE=route, WORDS=(2 if cfg.word_dots else 1) if early and words and route == 1 else 0))


def quant_config(cfg: LaunchConfig, N: int, scaled: bool, given: bool) -> LaunchConfig:
    """``cfg`` for an int8 / fp8 checkpoint: the flush's tile must span N (its scales are absmax
    over N). A default configuration is widened; a given one that is too narrow is an error."""
    if not scaled or cfg.flush_block_n >= N:
        return cfg
    if given:
        raise ValueError(f"an int8 / fp8 checkpoint needs a flush tile over the whole state dim: "
                         f"flush_block_n >= N = {N}; found {cfg.flush_block_n}")
    return dataclasses.replace(cfg, flush_block_n=pow2(N))


def launch_config(config: LaunchConfig | None, Bt: int, H: int, P: int, N: int, G: int, L: int,
                  state_dtype: torch.dtype, ring_dtype: torch.dtype, n_sm: int) -> LaunchConfig:
    """The knobs a replay launch runs with: ``config`` (checked by ``quant_config``), else
    ``default_config`` for these shapes and dtypes (widened by it)."""
    cfg = config or default_config(Bt, H, P, N, G, L, state_dtype.itemsize, ring_dtype.itemsize, n_sm,
                                   state_dtype == torch.float8_e4m3fn)
    return quant_config(cfg, N, is_scaled(state_dtype), config is not None)


def launch_replay(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                  zero_idle: bool, arrivals: torch.Tensor | None = None, config: LaunchConfig | None = None,
                  state_scale: torch.Tensor | None = None, state_rng: torch.Tensor | None = None) -> None:
    """One replay step written into ``out`` and the in-place tensors (semantics:
    ``mamba2_replay_decode_reference``); idle rows' ``out`` gets zeros if ``zero_idle``.

    ``arrivals``: the counters of the in-launch cursor advance (int32, at least B entries, zero
    between launches and left at zero; per row, or entry 0 alone with the flush-first order);
    None uses one vector per device shared by every call. ``config``: the launch knobs (default:
    ``default_config``). ``state_scale`` / ``state_rng``: an int8 / fp8 checkpoint's scales (B, H, P)
    and stochastic rounding's per-row [seed, counter] (``replayssm.kernels.quant``).
    """
    Bt, H, P, N, G, L = _check(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, out)
    check_quant_args(state, state_scale, state_rng, -1)
    if arrivals is not None:
        check_arrivals(arrivals, Bt, x.device)
    if Bt == 0:
        return
    cfg = launch_config(config, Bt, H, P, N, G, L, state.dtype, x_buf.dtype, num_sms(x.device.type, x.device.index))
    if state_rng is not None:
        advance_flush_counters(state_rng, cursor, L)  # before the launch reads them
    HC, n_hc, n_pb = program_split(cfg, H, P, G)
    cnt = arrivals if arrivals is not None else _arrival_counter(x.device, Bt)
    split = split_routes(cfg, Bt)
    words = state_words(state, cfg) if split else None
    t = Tensors(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias if dt_bias is not None else x,
                D if D is not None else x, z if z is not None else x, out, cnt,
                state_scale if state_scale is not None else x, state_rng if state_rng is not None else cursor,
                words if words is not None else cursor)
    io = IoStrides(*x.stride(), *dt.stride(), *B.stride(), *C.stride(), cursor.stride(0), A.stride(0),
                   dt_bias.stride(0) if dt_bias is not None else 0, D.stride(0) if D is not None else 0,
                   *(z.stride() if z is not None else (0, 0, 0)), *out.stride(),
                   *(state_scale.stride() if state_scale is not None else (0, 0, 0)),
                   state_rng.stride(0) if state_rng is not None else 0)
    lay = Layout(P, N, L, G, H // G, HC, n_hc, n_pb, *state.stride(), *x_buf.stride(), *dt_buf.stride(),
                 *B_buf.stride())
    if cfg.specialize:
        kernel, lay = replay_kernel, compiled_in(lay)
    else:
        kernel = replay_kernel_dyn
    for route in (1, 2) if split else (0,):
        flags = replay_flags(cfg, N, L, Bt, has_dt_bias=dt_bias is not None, has_D=D is not None,
                             has_z=z is not None, dt_softplus=dt_softplus, zero_idle=zero_idle,
                             lowp=uses_lowp_dot(state.dtype, x_buf.dtype, B_buf.dtype),
                             fmt=state_format(state.dtype), sr=state_rng is not None, route=route,
                             words=words is not None)
        warps = cfg.flush_warps if route == 2 and cfg.flush_warps else cfg.num_warps
        kernel[(Bt * G * n_hc * n_pb,)](t, io, lay, flags, num_warps=warps, num_stages=1)


def launch_step(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out, config: StepConfig | None = None) -> None:
    """One per-step (baseline) decode step written into ``out``; ``state`` updated in place."""
    Bt, H, P = x.shape
    N = state.shape[3]
    G = B.shape[1]
    if state.shape != (Bt, H, P, N) or B.shape != (Bt, G, N) or C.shape != (Bt, G, N) or dt.shape != (Bt, H):
        raise ValueError("shapes: x (B,H,P), dt (B,H), B/C (B,G,N), state (B,H,P,N)")
    if H % G != 0:
        raise ValueError(f"H={H} must be a multiple of G={G}")
    if Bt == 0:
        return
    cfg = config or step_config(Bt, H, P, N, state.element_size(), num_sms(x.device.type, x.device.index))
    n_pb = triton.cdiv(P, cfg.block_p)
    step_kernel[(Bt * H * n_pb,)](
        x, dt, B, C, state, A, dt_bias if dt_bias is not None else x, D if D is not None else x,
        z if z is not None else x, out,
        H, P, N, H // G, n_pb,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *state.stride(), A.stride(0),
        dt_bias.stride(0) if dt_bias is not None else 0, D.stride(0) if D is not None else 0,
        *(z.stride() if z is not None else (0, 0, 0)), *out.stride(),
        HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_P=cfg.block_p, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=1,
    )
