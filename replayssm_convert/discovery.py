"""``find_ssm_layers``: one record per SSM layer of a model (works on the meta device)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from replayssm.patches.kinds import KINDS
from replayssm.patches.registry import classify_mixer, original_class, rewrite_blocker


@dataclass(frozen=True)
class SSMLayerInfo:
    """One SSM layer.

    name: qualified module name. kind: a ``replayssm.patches.kinds.KINDS`` name ("mamba2",
    "gated_deltanet", "kda", "mamba1"). shapes: what that kind's shape reader returns (e.g.
    mamba2: num_heads, head_dim, state_size, n_groups). state_bytes: fp32 recurrent-state
    bytes per sequence.
    """

    name: str
    kind: str
    class_name: str
    layer_idx: int | None
    shapes: dict[str, int]
    state_bytes: int
    can_rewrite: bool
    reason: str | None = None
    patched: bool = False
    known_class: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind_label(self) -> str:
        kind = KINDS.get(self.kind)
        return kind.label if kind is not None else self.kind

    @property
    def kind_short(self) -> str:
        kind = KINDS.get(self.kind)
        return kind.short if kind is not None else self.kind

    def buffer_bytes(self, buffer_len: int, act_bytes: int = 2) -> int:
        """Extra bytes per sequence of the ring buffer at length ``buffer_len``."""
        return KINDS[self.kind].buffer_bytes(self.shapes, buffer_len, act_bytes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind_label"] = self.kind_label
        d["kind_short"] = self.kind_short
        return d


def find_ssm_layers(model: torch.nn.Module) -> list[SSMLayerInfo]:
    """Walk the module tree and describe every SSM layer, in module order.

    Detection: the transformers mixer classes this package knows, plus a structural
    signature (A_log / dt_bias / conv1d / projections), so a remote-code class with an
    SSM structure is reported (as not rewritable) rather than missed. Reads attributes
    only, so it works on a model built on the meta device.
    """
    records: list[SSMLayerInfo] = []
    for name, module in model.named_modules():
        found = classify_mixer(module)
        if found is None:
            continue
        kind, known = found
        shapes = kind.shapes(module)
        reason = rewrite_blocker(module)
        records.append(
            SSMLayerInfo(
                name=name,
                kind=kind.name,
                class_name=original_class(module).__name__,
                layer_idx=getattr(module, "layer_idx", None),
                shapes=shapes,
                state_bytes=kind.state_bytes(shapes),
                can_rewrite=reason is None,
                reason=reason,
                patched=type(module) is not original_class(module),
                known_class=known,
            )
        )
    return records
