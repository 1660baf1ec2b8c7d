"""Host side of the delta-rule verify step: argument checks and the launch (one, or two without
arrivals on the cursor word; none syncs with the host, so a verify step can be captured in a CUDA
graph). Programs: ``verify_programs.py``; knobs: ``config.VerifyConfig``."""

from __future__ import annotations

import torch
import triton

from ..backend import compiled_in
from ..cursor import cursor_word_counts_arrivals
from ..quant import check_quant_args
from ..quant_triton import state_format
from ..speculation import advance_fold_counters
from ..split_dot import dot_precision
from .config import VerifyConfig, default_verify_config
from .programs import Layout, Tensors
from .reference import SCALE_DIM
from .verify import check_verify_shapes
from .verify_programs import VerifyStrides, commit_kernel, verify_kernel

__all__ = ["launch_verify"]


def _strides(q, k, v, g, beta, out, cursor, scale, rng) -> VerifyStrides:
    """Strides of the window inputs, the output, the cursor, the scales and the random-number state; a
    Gated DeltaNet gate's key-channel stride is 0."""
    return VerifyStrides(*q.stride(), *k.stride(), *v.stride(), *g.stride()[:3], g.stride(3) if g.dim() == 4 else 0,
                         *beta.stride(), *out.stride(), cursor.stride(0),
                         *(scale.stride() if scale is not None else (0, 0, 0)), rng.stride(0) if rng is not None else 0)


def launch_verify(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, *, write_idle: bool,
                  config: VerifyConfig | None = None, state_scale: torch.Tensor | None = None,
                  state_rng: torch.Tensor | None = None) -> torch.Tensor:
    """The verify step of ``verify.delta_replay_verify_reference`` into ``out`` (Bt, T, HV, V);
    ``write_idle``: zeros into idle rows' outputs (else they keep theirs). ``config``: the launch
    knobs (default: ``default_verify_config``). ``state_scale`` / ``state_rng``: an int8 / fp8
    checkpoint's scales, stochastic rounding of the flush-first rows (their counters advance here,
    before the launch)."""
    Bt, T, HV, Hk, L, K, V = check_verify_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor)
    check_quant_args(state, state_scale, state_rng, SCALE_DIM)
    if cursor.dtype != torch.int32:
        raise ValueError(f"cursor must be int32; got {cursor.dtype}")
    if tuple(out.shape) != (Bt, T, HV, V):
        raise ValueError(f"out must be (Bt, T, HV, V) = {(Bt, T, HV, V)}; got {tuple(out.shape)}")
    BK = max(16, triton.next_power_of_2(K))
    if BK > 256:
        raise ValueError(f"the verify kernel keeps the key dim in one tile (K <= 256); got K={K}")
    if Bt == 0:
        return out
    if state_rng is not None:
        advance_fold_counters(state_rng, cursor, T, L)
    kda = g.dim() == 4
    cfg = config or default_verify_config(K, Bt, kda, rounds=state.dtype != torch.float32)
    BV = max(16, min(cfg.block_v, triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    TP = triton.next_power_of_2(T)
    arrive = cfg.arrive and cursor_word_counts_arrivals(cursor, L)
    t = Tensors(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out,
                state_scale if state_scale is not None else v, state_rng if state_rng is not None else cursor, cursor)
    io = _strides(q, k, v, g, beta, out, cursor, state_scale, state_rng)
    gb = (*g_buf.stride()[:3], g_buf.stride(3) if kda else 0)
    lay = compiled_in(Layout(HV, HV // Hk, K, V, L, *state.stride(), *u_buf.stride(), *k_buf.stride(), *gb))
    # a flush row's appends in tiles of up to 8192 elements (HC heads x TP tokens x BK channels)
    tiles = dict(TP=TP, HC=min(triton.next_power_of_2(HV), max(1, 8192 // (TP * BK))), HP=triton.next_power_of_2(HV))
    verify_kernel[(Bt * HV * NV,)](t, io, lay, NV, T, KDA=kda, BK=BK, BV=BV, LP=max(16, triton.next_power_of_2(L)),
                                   WRITE_IDLE=bool(write_idle), ARRIVE=arrive,
                                   DOT_PREC=dot_precision("bf16x3"),
                                   FMT=state_format(state.dtype), SR=state_rng is not None,
                                   num_warps=cfg.num_warps, **tiles)
    if not arrive:
        commit_kernel[(Bt,)](t, io, lay, T, KDA=kda, BK=BK, num_warps=cfg.num_warps, **tiles)
    return out
