"""PyTorch custom operators around the Mamba-2 Triton kernels, and the Triton entry points.

``torch.ops.replayssm.mamba2_replay_decode`` and ``torch.ops.replayssm.mamba2_step_decode`` are
opaque, in-place operators: they return nothing and write ``out`` and the declared mutated
arguments, so ``torch.compile(fullgraph=True)`` traces a call as one node (the fake
implementations give it the shapes without running a kernel).
"""

from __future__ import annotations

from typing import Optional

import torch

from .launch import launch_replay, launch_step

__all__ = ["mamba2_replay_decode_triton", "mamba2_step_decode_triton", "replay_decode_op", "step_decode_op"]


@torch.library.custom_op(
    "replayssm::mamba2_replay_decode",
    mutates_args=("state", "x_buf", "dt_buf", "B_buf", "cursor", "out", "arrivals", "state_scale", "state_rng"),
)
def replay_decode_op(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    x_buf: torch.Tensor,
    dt_buf: torch.Tensor,
    B_buf: torch.Tensor,
    cursor: torch.Tensor,
    A: torch.Tensor,
    dt_bias: Optional[torch.Tensor],
    D: Optional[torch.Tensor],
    z: Optional[torch.Tensor],
    dt_softplus: bool,
    out: torch.Tensor,
    zero_idle: bool,
    arrivals: Optional[torch.Tensor],
    state_scale: Optional[torch.Tensor],
    state_rng: Optional[torch.Tensor],
) -> None:
    """One ReplaySSM decode step written into ``out`` (idle rows: zeros if ``zero_idle``, else untouched);
    ``state_scale`` / ``state_rng``: low-precision checkpoints (``replayssm.kernels.quant``)."""
    launch_replay(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out, zero_idle,
                  arrivals, state_scale=state_scale, state_rng=state_rng)


@replay_decode_op.register_fake
def _replay_decode_fake(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                        zero_idle, arrivals, state_scale, state_rng) -> None:
    return None


@torch.library.custom_op("replayssm::mamba2_step_decode", mutates_args=("state", "out"))
def step_decode_op(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    state: torch.Tensor,
    A: torch.Tensor,
    dt_bias: Optional[torch.Tensor],
    D: Optional[torch.Tensor],
    z: Optional[torch.Tensor],
    dt_softplus: bool,
    out: torch.Tensor,
) -> None:
    """One per-step (baseline) decode step written into ``out``; ``state`` updated in place."""
    launch_step(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out)


@step_decode_op.register_fake
def _step_decode_fake(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out) -> None:
    return None


def mamba2_replay_decode_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                                dt_softplus=True, out=None, arrivals=None, state_scale=None, state_rng=None):
    """Triton ReplaySSM decode step through the custom operator; same signature and semantics as
    ``mamba2_replay_decode_reference``."""
    zero_idle = out is None
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    replay_decode_op(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, bool(dt_softplus), out,
                     zero_idle, arrivals, state_scale, state_rng)
    return out


def mamba2_step_decode_triton(x, dt, B, C, state, A, dt_bias=None, D=None, z=None, dt_softplus=True):
    """Fused per-step decode through the custom operator; same signature and semantics as
    ``mamba2_step_decode_reference``."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step_decode_op(x, dt, B, C, state, A, dt_bias, D, z, bool(dt_softplus), out)
    return out
