"""Host side of the delta-rule Triton kernels: argument checks and the launches (none syncs with
the host, so a step can be captured in a CUDA graph). Programs: ``programs.py`` (three launches),
``small_batch.py`` (one launch), ``step.py`` (the per-step baseline); knobs: ``config.py``."""

from __future__ import annotations

import torch
import triton

from ..backend import compiled_in, dependent_launch_supported, num_sms, triton_interpreter_on
from ..cursor import advance_cursor_triton, cursor_word_counts_arrivals
from ..dependent import launch_options
from ..persistent import flush_row_chunks
from .config import LaunchConfig, default_config
from .programs import IoStrides, Layout, Scratch, Tensors, coef_kernel, flush_kernel, gdn_coef_kernel, output_kernel
from ..quant import advance_flush_counters, check_quant_args, is_scaled
from ..quant_triton import int8_words, state_format
from ..split_dot import dot_precision
from .reference import check_shapes
from .small_batch import small_batch_kernel
from .step import step_kernel

__all__ = ["delta_replay_decode_triton", "delta_step_decode_triton"]


def _io_strides(q, k, v, g, beta, out, cursor_stride: int, state_scale=None, state_rng=None) -> IoStrides:
    """Strides of the step's inputs and output; the key-channel stride of a Gated DeltaNet gate is 0."""
    return IoStrides(*q.stride(), *k.stride(), *v.stride(), g.stride(0), g.stride(1),
                     g.stride(2) if g.dim() == 3 else 0, *beta.stride(), *out.stride(), cursor_stride,
                     *(state_scale.stride() if state_scale is not None else (0, 0, 0)),
                     state_rng.stride(0) if state_rng is not None else 0)


def delta_replay_decode_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out=None, *,
                               write_idle: bool | None = None, config: LaunchConfig | None = None,
                               state_scale: torch.Tensor | None = None,
                               state_rng: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of ``delta_replay_decode_reference`` (same arguments and result).

    ``write_idle``: store zeros for idle rows (default: ``out is None``). ``config``: the launch
    knobs (default: ``default_config``). ``state_scale`` / ``state_rng``: an int8 / fp8
    checkpoint's column scales (Bt, HV, V) and stochastic rounding's per-row [seed, counter]
    (``replayssm.kernels.quant``); a scaled checkpoint needs K <= 256 (one key tile holds the
    vectors its scales run over).
    """
    Bt, HV, Hk, L, K, V = check_shapes(q, k, v, g, beta, state, u_buf, k_buf, g_buf)
    check_quant_args(state, state_scale, state_rng, -2)
    if is_scaled(state.dtype) and triton.next_power_of_2(K) > 256:
        raise ValueError(f"int8 / fp8 checkpoints need the key dim in one tile (K <= 256); found K={K}")
    if cursor.dtype != torch.int32 or tuple(cursor.shape) != (Bt,):
        raise ValueError("cursor must be a (Bt,) int32 tensor")
    kda = g.dim() == 3
    if write_idle is None:
        write_idle = out is None
    if out is None:
        out = torch.empty((Bt, HV, V), dtype=v.dtype, device=v.device)
    if Bt == 0:
        return out
    cfg = config or default_config(Bt, K, V, state.dtype, kda)
    if state_rng is not None:
        advance_flush_counters(state_rng, cursor, L)  # before the launches read them
    words = int8_words(state)  # for the output launch's WORDS: four value columns a word
    t = Tensors(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out,
                state_scale if state_scale is not None else v, state_rng if state_rng is not None else cursor,
                words if words is not None else state)
    io = _io_strides(q, k, v, g, beta, out, cursor.stride(0), state_scale, state_rng)
    qf = dict(FMT=state_format(state.dtype), SR=state_rng is not None)
    gb = (*g_buf.stride()[:3], g_buf.stride(3) if kda else 0)
    lay = Layout(HV, HV // Hk, K, V, L, *state.stride(), *u_buf.stride(), *k_buf.stride(), *gb)
    if cfg.one_launch:
        _launch_one(t, io, lay, Bt, cfg, kda, bool(write_idle), qf)
    else:
        _launch_three(t, io, lay, Bt, cfg, kda, bool(write_idle), qf)
    return out


def _launch_one(t, io, lay, Bt, cfg, kda, write_idle, qf):
    """The one-launch kernel; the cursors move on inside it (a second launch for buffers over 127)."""
    BK = max(16, triton.next_power_of_2(lay.K))
    if BK > 256:
        raise ValueError(f"the one-launch kernel keeps the whole key dim in one tile (K <= 256); got K={lay.K}")
    BV = max(16, min(cfg.block_v, triton.next_power_of_2(lay.V)))
    NV = triton.cdiv(lay.V, BV)
    arrive = (1 if cfg.arrive_first else 2) if cursor_word_counts_arrivals(t.cursor, lay.L) else 0
    small_batch_kernel[(Bt * lay.HV * NV,)](t, io, lay, NV, KDA=kda, BK=BK, BV=BV,
                                            LP=max(16, triton.next_power_of_2(lay.L)), WRITE_IDLE=write_idle,
                                            ARRIVE=arrive, num_warps=cfg.num_warps, **qf)
    if arrive == 0:
        advance_cursor_triton(t.cursor, lay.L)


def _launch_three(t, io, lay, Bt, cfg, kda, write_idle, qf):
    """Coefficient, output and persistent flush launches (module notes of ``programs.py``)."""
    HV, Hk, K, V, L = lay.HV, lay.HV // lay.GROUP, lay.K, lay.V, lay.L
    kp = triton.next_power_of_2(K)
    vp = max(16, triton.next_power_of_2(V))
    BV, BVF = max(16, min(cfg.block_v, vp)), max(16, min(cfg.flush_block_v, vp))
    BK = max(16, min(cfg.block_k, kp))
    LP = max(16, triton.next_power_of_2(L))
    NV, NVF = triton.cdiv(V, BV), triton.cdiv(V, BVF)
    dev = t.v.device
    per_key = not kda and cfg.coef_per_key_head
    write_x = per_key and cfg.coef_write_x
    x_from_keys = per_key and not write_x  # then no launch touches the x scratch
    fused_flush = (cfg.flush_output or qf["FMT"] >= 3) and kp <= 256  # scaled: the flush spans the key dim
    BKF = kp if fused_flush else BK
    # one 4-byte scratch allocation per call, viewed as: x (Bt, HV, 2, K) [exp(G_c) k_c, exp(G_c) q] (absent
    # when the output launch scales k_c and q itself), cw (Bt, HV, 3, LP) [ck, cq, (k_c . q, exp(G_c))],
    # uf (Bt, HV, V) u_c of flush rows (absent with flush_output), fp32; cn (Bt,) int32 the advanced cursors
    n_x, n_c = (0 if x_from_keys else Bt * HV * 2 * K), Bt * HV * 3 * LP
    n_u = 0 if fused_flush else Bt * HV * V
    scratch = torch.empty(n_x + n_c + n_u + Bt, dtype=torch.float32, device=dev)
    sc = Scratch(scratch if x_from_keys else scratch[:n_x].view(Bt, HV, 2, K),
                 scratch[n_x:n_x + n_c].view(Bt, HV, 3, LP),
                 scratch if fused_flush else scratch[n_x + n_c:n_x + n_c + n_u].view(Bt, HV, V),
                 scratch[n_x + n_c + n_u:].view(torch.int32))
    pdl_ok = dependent_launch_supported(dev.type, dev.index)
    pdl = cfg.dependent_launch and pdl_ok
    # the flush launch as a dependent of the output launch, unless the output launch is one itself (its
    # flush-row programs exit before waiting for the coefficient launch, whose next cursors the flush reads)
    flush_pdl = not pdl and pdl_ok
    clay = compiled_in(lay)
    # an int8 checkpoint in one key tile, read by the output launch as int32 words
    words = t.words.dtype == torch.int32 and fused_flush and BK >= K
    BKC = max(16, min(cfg.coef_block_k, kp))
    if per_key:
        gdn_coef_kernel[(Bt * Hk,)](t, sc, io, clay, BK=BKC, NK=triton.cdiv(K, BKC), LP=LP,
                                    GP=triton.next_power_of_2(HV // Hk), WRITE_X=write_x, PDL=pdl,
                                    SKIP_FLUSH=fused_flush, num_warps=1)
    else:
        coef_kernel[(Bt * HV,)](t, sc, io, clay, KDA=kda, BK=BKC, NK=triton.cdiv(K, BKC), LP=LP,
                                WINDOWS=cfg.coef_windows if kda else 1, PDL=pdl, SKIP_FLUSH=fused_flush, num_warps=1)
    output_kernel[(Bt * HV * NV,)](t, sc, io, clay, NV, KDA=kda, BK=BK, NK=triton.cdiv(K, BK), BV=BV,
                                   LP=LP, WRITE_IDLE=write_idle, X_FROM_KEYS=x_from_keys, PDL=pdl,
                                   SKIP_FLUSH_ROWS=fused_flush, LAUNCH_DEPENDENTS=flush_pdl, num_warps=cfg.num_warps,
                                   FMT=qf["FMT"], WORDS=words,
                                   **launch_options(pdl))
    interp = triton_interpreter_on()
    exact_ring = t.u_buf if kda else t.k_buf  # the product operand that is not decay-weighted
    bf16_split = exact_ring.dtype == torch.bfloat16 and not interp and cfg.flush_bf16_split
    n_prog = cfg.flush_programs * num_sms(dev.type, dev.index)
    for row0, n_rows, BB in flush_row_chunks(Bt):
        flush_kernel[(max(1, min(n_prog, n_rows * HV * (1 if cfg.flush_head_items else NVF))),)](
            t, sc, io, lay, row0, n_rows, NVF, KDA=kda, BK=BKF, NK=triton.cdiv(K, BKF), BV=BVF, LP=LP, BB=BB,
            DOT_PREC=dot_precision(None), BF16_SPLIT=bf16_split, HEAD_ITEMS=cfg.flush_head_items,
            OUTPUT=fused_flush, PREFETCH=cfg.flush_prefetch, PDL=flush_pdl, **qf,
            num_warps=cfg.flush_warps, num_stages=cfg.flush_stages, **launch_options(flush_pdl))


def delta_step_decode_triton(q, k, v, g, beta, state, *, block_v: int | None = None,
                             num_warps: int | None = None) -> torch.Tensor:
    """Triton version of ``delta_step_decode_reference`` (same arguments and result)."""
    Bt, Hk, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    if HV % Hk != 0 or tuple(q.shape) != (Bt, Hk, K) or tuple(state.shape) != (Bt, HV, K, V):
        raise ValueError("shapes: q, k (Bt, Hk, K); v (Bt, HV, V); state (Bt, HV, K, V); HV a multiple of Hk")
    BK = max(16, triton.next_power_of_2(K))
    if BK > 256:
        raise NotImplementedError("delta_step_decode_triton keeps the whole key dim in one tile (K <= 256)")
    out = torch.empty((Bt, HV, V), dtype=v.dtype, device=v.device)
    if Bt == 0:
        return out
    # 64 value columns per program for fp32 states, 32 for 16-bit ones; 4 warps (a sweep at batch 256)
    BV = block_v or ((64 if state.element_size() >= 4 else 32) if BK <= 128 else 16)
    BV = max(16, min(BV, triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    # the state in the place of the rings and the cursor, which this kernel does not read
    t = Tensors(q, k, v, g, beta, state, state, state, state, state, out, state, state, state)
    io = _io_strides(q, k, v, g, beta, out, 0)
    lay = Layout(HV, HV // Hk, K, V, 1, *state.stride(), *(0,) * 12)
    step_kernel[(Bt * HV * NV,)](t, io, lay, NV, KDA=g.dim() == 3, BK=BK, BV=BV,
                                 num_warps=num_warps or (4 if BK <= 128 else 8))
    return out
