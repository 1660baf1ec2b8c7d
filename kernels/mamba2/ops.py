"""PyTorch custom operators around the Mamba-2 Triton decode kernels.

``torch.ops.replayssm.mamba2_replay_decode`` and ``torch.ops.replayssm.mamba2_step_decode``
are opaque, in-place operators: they return nothing and write ``out`` and the declared
mutated arguments. ``torch.compile(fullgraph=True)`` traces them without graph breaks and
the fake (meta) implementations let it propagate shapes without running a kernel.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["replay_decode_op", "step_decode_op"]


@torch.library.custom_op(
    "replayssm::mamba2_replay_decode",
    mutates_args=("state", "x_buf", "dt_buf", "B_buf", "cursor", "out", "arrivals"),
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
) -> None:
    """One ReplaySSM decode step written into ``out`` (idle rows: zeros if ``zero_idle``, else untouched)."""
    from .triton_decode import launch_mamba2_replay_decode

    launch_mamba2_replay_decode(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus,
                                out, zero_idle, arrivals=arrivals)


@replay_decode_op.register_fake
def _replay_decode_fake(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                        zero_idle, arrivals) -> None:
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
    from .triton_step import launch_mamba2_step_decode

    launch_mamba2_step_decode(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out)


@step_decode_op.register_fake
def _step_decode_fake(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus, out) -> None:
    return None
