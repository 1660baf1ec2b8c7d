"""PyTorch custom ops for the delta-rule decode kernels, so ``torch.compile`` can trace them.

* ``torch.ops.replayssm.delta_replay_decode(q, k, v, g, beta, state, u_buf, k_buf, g_buf,
  cursor, out, write_idle, backend) -> ()`` mutates ``state``, ``u_buf``, ``k_buf``,
  ``g_buf``, ``cursor`` and ``out``.
* ``torch.ops.replayssm.delta_step_decode(q, k, v, g, beta, state, backend) -> Tensor``
  mutates ``state``.

Each op runs the Triton kernel or the PyTorch reference as ``backend`` resolves (see
``replayssm.kernels.backend``); a compiled graph holds them as opaque nodes (fake
implementations give the shapes). ``delta_replay_decode`` / ``delta_step_decode`` in the
package switch to these ops while ``torch.compile`` traces, and call the kernels directly
otherwise (eager calls skip the op dispatch).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.library import custom_op

from ..backend import resolve_backend
from .reference import delta_replay_decode_reference, delta_step_decode_reference

__all__ = ["replay_decode_via_op", "step_decode_via_op"]


@custom_op("replayssm::delta_replay_decode",
           mutates_args=("state", "u_buf", "k_buf", "g_buf", "cursor", "out", "state_scale", "state_rng"))
def _delta_replay_decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    u_buf: torch.Tensor,
    k_buf: torch.Tensor,
    g_buf: torch.Tensor,
    cursor: torch.Tensor,
    out: torch.Tensor,
    write_idle: bool,
    backend: str,
    state_scale: Optional[torch.Tensor],
    state_rng: Optional[torch.Tensor],
) -> None:
    if resolve_backend(backend, v.device) == "triton":
        from .launch import delta_replay_decode_triton

        delta_replay_decode_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle=write_idle,
                                   state_scale=state_scale, state_rng=state_rng)
    elif write_idle:
        out.copy_(delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, None,
                                                state_scale, state_rng))
    else:
        delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, state_scale,
                                      state_rng)


@_delta_replay_decode_op.register_fake
def _(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle, backend, state_scale,
      state_rng) -> None:
    return None


@custom_op("replayssm::delta_step_decode", mutates_args=("state",))
def _delta_step_decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    backend: str,
) -> torch.Tensor:
    if resolve_backend(backend, v.device) == "triton":
        from .launch import delta_step_decode_triton

        return delta_step_decode_triton(q, k, v, g, beta, state)
    return delta_step_decode_reference(q, k, v, g, beta, state)


@_delta_step_decode_op.register_fake
def _(q, k, v, g, beta, state, backend):
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


def replay_decode_via_op(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, backend, state_scale=None,
                         state_rng=None):
    """``delta_replay_decode`` through the custom op (what ``torch.compile`` traces)."""
    write_idle = out is None
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    torch.ops.replayssm.delta_replay_decode(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, write_idle,
                                            backend, state_scale, state_rng)
    return out


def step_decode_via_op(q, k, v, g, beta, state, backend):
    """``delta_step_decode`` through the custom op."""
    return torch.ops.replayssm.delta_step_decode(q, k, v, g, beta, state, backend)
