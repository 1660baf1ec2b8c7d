"""Low-precision checkpoints in the cache: what a rewritten layer stores beside an int8 / fp8
checkpoint (its fp32 scales) or a stochastically rounded one (each row's [seed, flush counter]),
and the conversions between the exact fp32 state and the stored checkpoint.

The extra tensors live in the layer's ``ReplayBuffers.tensors`` (``state_scale``, ``state_rng``),
batch first, so beam search and batch edits move them with their rows. The rounding itself is
``replayssm.kernels.quant`` (the kernels' reference).
"""

from __future__ import annotations

import torch

from replayssm.kernels.quant import init_state_rng, is_scaled, load_state, scale_shape, store_state

from .options import LayerReplayOptions

SCALE = "state_scale"
RNG = "state_rng"


def quant_specs(options: LayerReplayOptions, state_shape: tuple[int, ...], batch: int, scale_dim: int,
                state_dtype: torch.dtype | None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The extra cache tensors of a layer whose per-sequence state is ``state_shape`` (its
    checkpoint of ``state_dtype``; None: fp32), scaled over ``scale_dim``."""
    specs = {}
    if state_dtype is not None and is_scaled(state_dtype):
        specs[SCALE] = ((batch, *scale_shape(tuple(state_shape), scale_dim)), torch.float32)
    if options.stochastic and state_dtype not in (None, torch.float32):
        specs[RNG] = ((batch, 2), torch.int64)
    return specs


def init_quant_tensors(tensors: dict[str, torch.Tensor], options: LayerReplayOptions, layer_idx: int) -> None:
    """Seed the rows' random-number state (the seed mixed with the layer index and the row)."""
    rng = tensors.get(RNG)
    if rng is not None:
        rng.copy_(init_state_rng(rng.shape[0], options.state_seed, layer_idx, rng.device))


def encode_state(exact: torch.Tensor, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 scale_dim: int) -> torch.Tensor:
    """The exact fp32 state (B, ...) as a new checkpoint of ``dtype``: every row rounded once (its
    scales written; with stochastic rounding its counter advanced)."""
    scale, rng = tensors.get(SCALE), tensors.get(RNG)
    if scale is None and rng is None:
        return exact.to(dtype)
    out = torch.empty(exact.shape, dtype=dtype, device=exact.device)
    rows = torch.ones(exact.shape[0], dtype=torch.bool, device=exact.device)
    store_state(out, scale if is_scaled(dtype) else None, rng, exact.float(), rows, scale_dim)
    return out


def decode_state(state: torch.Tensor, tensors: dict[str, torch.Tensor], scale_dim: int) -> torch.Tensor:
    """The checkpoint as fp32 (int8 / fp8 ones through their scales)."""
    return load_state(state, tensors.get(SCALE) if is_scaled(state.dtype) else None, scale_dim)


def kernel_args(tensors: dict[str, torch.Tensor], state: torch.Tensor) -> tuple[torch.Tensor | None,
                                                                                 torch.Tensor | None]:
    """(state_scale, state_rng) to hand a kernel with the checkpoint ``state``: None where the layer
    has none, or where the checkpoint is not (yet, or any more) of a dtype that uses them."""
    scale = tensors.get(SCALE) if is_scaled(state.dtype) else None
    rng = tensors.get(RNG) if state.dtype != torch.float32 else None
    return scale, rng


def needs_replay_path(options: LayerReplayOptions) -> bool:
    """Whether a layer must take the replay kernels even at ``buffer_len == 1`` (the fused
    per-step kernels store plain, nearest-rounded states)."""
    return options.stochastic or (options.state_dtype is not None and is_scaled(options.state_dtype))


