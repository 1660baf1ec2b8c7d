"""The Mamba-2 verify step as a PyTorch custom operator (``torch.ops.replayssm.mamba2_replay_verify``):
opaque to ``torch.compile`` and free of host synchronisation, so it can be captured in a CUDA graph.

First step: the operator runs the PyTorch reference (``verify.mamba2_replay_verify_reference``) on
the device, which forms the T outputs from the checkpoint and the ring with a handful of batched
einsums (no per-token state write; flush-first rows write the checkpoint once). A fused Triton
program replaces it here without changing the signature.
"""

from __future__ import annotations

from typing import Optional

import torch

from .verify import mamba2_replay_verify_reference

__all__ = ["mamba2_replay_verify_triton", "verify_op"]


@torch.library.custom_op("replayssm::mamba2_replay_verify",
                         mutates_args=("state", "x_buf", "dt_buf", "B_buf", "cursor", "out"))
def verify_op(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, state: torch.Tensor,
              x_buf: torch.Tensor, dt_buf: torch.Tensor, B_buf: torch.Tensor, cursor: torch.Tensor, A: torch.Tensor,
              dt_bias: Optional[torch.Tensor], D: Optional[torch.Tensor], z: Optional[torch.Tensor], dt_softplus: bool,
              out: torch.Tensor, zero_idle: bool) -> None:
    """One verify step written into ``out`` (idle rows: zeros if ``zero_idle``, else untouched)."""
    if zero_idle:
        out.copy_(mamba2_replay_verify_reference(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                                 dt_softplus))
    else:
        mamba2_replay_verify_reference(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z,
                                       dt_softplus, out)


@verify_op.register_fake
def _verify_fake(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, dt_softplus, out,
                 zero_idle) -> None:
    return None


def mamba2_replay_verify_triton(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias=None, D=None, z=None,
                                dt_softplus=True, out=None):
    """The verify step through the custom operator; same signature and semantics as
    ``mamba2_replay_verify_reference``."""
    zero_idle = out is None
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    verify_op(x, dt, B, C, state, x_buf, dt_buf, B_buf, cursor, A, dt_bias, D, z, bool(dt_softplus), out, zero_idle)
    return out
