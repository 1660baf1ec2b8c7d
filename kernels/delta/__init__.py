"""Delta-rule (Gated DeltaNet, Kimi Delta Attention) ReplaySSM kernels and references.

``delta_replay_decode`` / ``delta_step_decode`` dispatch on ``backend`` (see
``replayssm.kernels.backend``) to the Triton kernels or the PyTorch references, which
share one signature. Under ``torch.compile`` the dispatchers go through the custom ops of
``replayssm.kernels.delta.ops`` (``torch.ops.replayssm.delta_*``), so a compiled graph
holds one opaque node per call and needs no graph break.

Shapes (see ``reference.py`` for the maths): q, k (Bt, Hk, K); v (Bt, HV, V); g (Bt, HV)
for Gated DeltaNet or (Bt, HV, K) for KDA, fp32; beta (Bt, HV) fp32; state (Bt, HV, K, V);
u_buf (Bt, HV, L, V); k_buf (Bt, Hk, L, K); g_buf (Bt, HV, L) or (Bt, HV, L, K) fp32;
cursor (Bt,) int32.
"""

from __future__ import annotations

import torch

from ..backend import resolve_backend
from ..quant import check_step_state
from . import ops as _ops
from .reference import (
    delta_replay_decode_reference,
    delta_replay_materialize_reference,
    delta_step_decode_reference,
    l2norm_qk_reference,
)
from .verify import delta_replay_verify_reference

__all__ = [
    "delta_replay_decode",
    "delta_replay_decode_reference",
    "delta_replay_materialize",
    "delta_replay_materialize_reference",
    "delta_replay_verify",
    "delta_replay_verify_reference",
    "delta_step_decode",
    "delta_step_decode_reference",
    "l2norm_qk",
    "l2norm_qk_reference",
]


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - very old torch
        return False


def delta_replay_decode(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out=None, state_scale=None,
                        state_rng=None, *, backend: str = "auto") -> torch.Tensor:
    """One ReplaySSM decode step; see ``delta_replay_decode_reference`` for shapes (``state_scale``
    / ``state_rng``: low-precision checkpoints, ``replayssm.kernels.quant``)."""
    if _compiling():
        return _ops.replay_decode_via_op(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, backend,
                                         state_scale, state_rng)
    if resolve_backend(backend, v.device) == "triton":
        from .launch import delta_replay_decode_triton

        return delta_replay_decode_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out,
                                          state_scale=state_scale, state_rng=state_rng)
    return delta_replay_decode_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, state_scale,
                                         state_rng)


def delta_replay_verify(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out=None, state_scale=None,
                        state_rng=None, *, backend: str = "auto") -> torch.Tensor:
    """A speculative verify of T tokens per row; see ``verify.delta_replay_verify_reference``."""
    if resolve_backend(backend, v.device) == "triton":
        from .verify_ops import delta_replay_verify_triton

        return delta_replay_verify_triton(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, state_scale,
                                          state_rng)
    return delta_replay_verify_reference(q, k, v, g, beta, state, u_buf, k_buf, g_buf, cursor, out, state_scale,
                                         state_rng)


def l2norm_qk(q, k, q_scale: float, eps: float = 1e-6, *, backend: str = "auto"):
    """q, k (Bt, H, K) -> L2-normalised fp32 copies, q times ``q_scale``; one launch on the
    Triton backend (see ``l2norm_qk_reference``). Under ``torch.compile`` the PyTorch
    reference, which the compiler fuses itself."""
    if not _compiling() and resolve_backend(backend, q.device) == "triton":
        from .norm import l2norm_qk_triton

        return l2norm_qk_triton(q, k, q_scale, eps)
    return l2norm_qk_reference(q, k, q_scale, eps)


def delta_step_decode(q, k, v, g, beta, state, *, backend: str = "auto") -> torch.Tensor:
    """The ordinary per-step recurrence (baseline); see ``delta_step_decode_reference``."""
    check_step_state(state)
    if _compiling():
        return _ops.step_decode_via_op(q, k, v, g, beta, state, backend)
    if resolve_backend(backend, v.device) == "triton":
        from .launch import delta_step_decode_triton

        return delta_step_decode_triton(q, k, v, g, beta, state)
    return delta_step_decode_reference(q, k, v, g, beta, state)


def delta_replay_materialize(state, u_buf, k_buf, g_buf, cursor, state_scale=None, state_rng=None) -> torch.Tensor:
    """Fold the ring into the checkpoint (rare: before a stock prefill or an export)."""
    return delta_replay_materialize_reference(state, u_buf, k_buf, g_buf, cursor, state_scale, state_rng)
