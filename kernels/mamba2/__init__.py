"""Mamba-2 ReplaySSM decode kernels and their PyTorch references.

``mamba2_replay_decode`` / ``mamba2_step_decode`` dispatch on ``backend`` (see
``replayssm.kernels.backend``) to the Triton kernels or the PyTorch references, which
share one signature.
"""

from __future__ import annotations

import torch

from ..backend import resolve_backend
from ..quant import check_step_state
from .reference import (
    mamba2_replay_decode_reference,
    mamba2_replay_materialize_reference,
    mamba2_step_decode_reference,
    process_dt,
)
from .verify import mamba2_replay_verify_reference

__all__ = [
    "mamba2_replay_decode",
    "mamba2_replay_decode_reference",
    "mamba2_replay_materialize",
    "mamba2_replay_materialize_reference",
    "mamba2_replay_verify",
    "mamba2_replay_verify_reference",
    "mamba2_step_decode",
    "mamba2_step_decode_reference",
    "process_dt",
]


def mamba2_replay_decode(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                         dt_softplus=True, out=None, arrivals=None, state_scale=None, state_rng=None, *,
                         backend: str = "auto") -> torch.Tensor:
    """One ReplaySSM decode step; see ``mamba2_replay_decode_reference`` for shapes (``state_scale``
    / ``state_rng``: low-precision checkpoints, ``replayssm.kernels.quant``)."""
    if resolve_backend(backend, x.device) == "triton":
        from .ops import mamba2_replay_decode_triton

        return mamba2_replay_decode_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                           dt_softplus, out, arrivals, state_scale, state_rng)
    return mamba2_replay_decode_reference(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                          dt_softplus, out, arrivals, state_scale, state_rng)


def mamba2_replay_verify(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                         dt_softplus=True, out=None, state_scale=None, state_rng=None, *,
                         backend: str = "auto") -> torch.Tensor:
    """A speculative verify of T tokens per row; see ``verify.mamba2_replay_verify_reference``."""
    if resolve_backend(backend, x.device) == "triton":
        from .verify_ops import mamba2_replay_verify_triton

        return mamba2_replay_verify_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                           dt_softplus, out, state_scale, state_rng)
    return mamba2_replay_verify_reference(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                          dt_softplus, out, state_scale, state_rng)


def mamba2_step_decode(x, dt, B, C, state, A, dt_bias=None, D=None, z=None, dt_softplus=True, *,
                       backend: str = "auto") -> torch.Tensor:
    """The ordinary per-step recurrence (baseline); see ``mamba2_step_decode_reference``."""
    check_step_state(state)
    if resolve_backend(backend, x.device) == "triton":
        from .ops import mamba2_step_decode_triton

        return mamba2_step_decode_triton(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus)
    return mamba2_step_decode_reference(x, dt, B, C, state, A, dt_bias, D, z, dt_softplus)


def mamba2_replay_materialize(state, x_buf, dt_buf, B_buf, cursor, A, state_scale=None,
                              state_rng=None) -> torch.Tensor:
    """Fold the buffer into the checkpoint (rare: before a stock prefill or an export)."""
    return mamba2_replay_materialize_reference(state, x_buf, dt_buf, B_buf, cursor, A, state_scale, state_rng)
