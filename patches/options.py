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
    state_rounding: "nearest" | "stochastic": how a checkpoint below fp32 is rounded when written.
    state_seed: seed of stochastic rounding (mixed with the layer index and the row).
    """

    buffer_len: int = 16
    state_dtype: torch.dtype | None = None
    backend: str = "auto"
    state_rounding: str = "nearest"
    state_seed: int = 0

    @property
    def stochastic(self) -> bool:
        return self.state_rounding == "stochastic"
