"""The Mamba-2 verify step as a PyTorch custom operator (``torch.ops.replayssm.mamba2_replay_verify``):
opaque to ``torch.compile`` and free of host synchronisation, so it can be captured in a CUDA graph.

The operator runs the Triton program (``verify_launch.launch_verify``: one launch, the checkpoint
read once for all T outputs, flush-first rows folded inside it) on CUDA tensors and, with
``TRITON_INTERPRET=1``, on CPU tensors; elsewhere (CPU tensors without the interpreter, or no
Triton) the PyTorch reference ``verify.mamba2_replay_verify_reference``, same semantics.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backend import triton_available, triton_interpreter_on
from .verify import mamba2_replay_verify_reference

__all__ = ["mamba2_replay_verify_triton", "runs_triton", "verify_op"]


def runs_triton(device: torch.device) -> bool:
    """Whether the operator launches the Triton program for tensors on ``device``."""
    return triton_available() and (device.type == "cuda" or triton_interpreter_on())


@torch.library.custom_op("replayssm::mamba2_replay_verify",
                         mutates_args=("state", "x_buf", "dt_buf", "B_buf", "cursor", "out", "state_scale",
                                       "state_rng"))
def verify_op(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, state: torch.Tensor,
              x_buf: torch.Tensor, dt_buf: torch.Tensor, B_buf: torch.Tensor, cursor: torch.Tensor, A: torch.Tensor,
              dt_bias: Optional[torch.Tensor], D: Optional[torch.Tensor], z: Optional[torch.Tensor], dt_softplus: bool,
              out: torch.Tensor, zero_idle: bool, state_scale: Optional[torch.Tensor],
              state_rng: Optional[torch.Tensor]) -> None:
    """One verify step written into ``out`` (idle rows: zeros if ``zero_idle``, else untouched)."""
    if runs_triton(x.device):
        from .verify_launch import launch_verify

        launch_verify(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                      zero_idle, state_scale=state_scale, state_rng=state_rng)
        return
    y = mamba2_replay_verify_reference(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                       dt_softplus, None if zero_idle else out, state_scale, state_rng)
    if zero_idle:
        out.copy_(y)


@verify_op.register_fake
def _verify_fake(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                 zero_idle, state_scale, state_rng) -> None:
    return None


def mamba2_replay_verify_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                                dt_softplus=True, out=None, state_scale=None, state_rng=None):
    """The verify step through the custom operator; same signature and semantics as
    ``mamba2_replay_verify_reference``."""
    zero_idle = out is None
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    verify_op(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, bool(dt_softplus), out, zero_idle,
              state_scale, state_rng)
    return out
