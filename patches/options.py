"""Per-layer ReplaySSM options (validated by ``replayssm.ReplaySSMConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerReplayOptions:
    """What one rewritten layer needs to know.

    buffer_len: L, tokens buffered between flushes (1 = flush every step).
    state_dtype: dtype of the checkpoint; None keeps the cache's (fp32 in transformers).
    backend: "auto" | "triton" | "torch" (see ``replayssm.kernels.backend``).
    """

    buffer_len: int = 16
    state_dtype: torch.dtype | None = None
    backend: str = "auto"
