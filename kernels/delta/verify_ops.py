"""The delta-rule verify step as a PyTorch custom operator (``torch.ops.replayssm.delta_replay_verify``):
opaque to ``torch.compile`` and free of host synchronisation, so it can be captured in a CUDA graph.

On CUDA tensors, and on CPU tensors under the Triton interpreter, the operator launches the fused
Triton program (``verify_launch.launch_verify``: each checkpoint tile read once for all T outputs,
advanced over the ring by one matrix product, then the window's tokens stepped on it in registers);
elsewhere (no Triton, or CPU tensors without the interpreter) it runs the PyTorch reference
(``verify.delta_replay_verify_reference``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backend import triton_available, triton_interpreter_on
from .verify import delta_replay_verify_reference

__all__ = ["delta_replay_verify_triton", "verify_op"]


@torch.library.custom_op("replayssm::delta_replay_verify",
                         mutates_args=("state", "u_buf", "k_buf", "g_buf", "cursor", "out", "state_scale", "state_rng"))
def verify_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, u_buf: torch.Tensor, k_buf: torch.Tensor, g_buf: torch.Tensor, cursor: torch.Tensor,
              out: torch.Tensor, zero_idle: bool, state_scale: Optional[torch.Tensor],
              state_rng: Optional[torch.Tensor]) -> None:
    """One verify step written into ``out`` (idle rows: zeros if ``zero_idle``, else untouched)."""
    if triton_available() and (v.is_cuda or triton_interpreter_on()):
        from .verify_launch import launch_verify

        launch_verify(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle=zero_idle,
                      state_scale=state_scale, state_rng=state_rng)
        return
    o = delta_replay_verify_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, None if zero_idle else out,
                                      state_scale, state_rng)
    if zero_idle:
        out.copy_(o)


@verify_op.register_fake
def _verify_fake(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, zero_idle, state_scale,
                 state_rng) -> None:
    return None


def delta_replay_verify_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out=None, state_scale=None,
                               state_rng=None):
    """The verify step through the custom operator; same signature and semantics as
    ``delta_replay_verify_reference``."""
    zero_idle = out is None
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    verify_op(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, zero_idle, state_scale, state_rng)
    return out
