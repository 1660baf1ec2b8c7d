"""``find_ssm_layers``: one record per SSM layer of a model (works on the meta device)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from replayssm.patches.registry import KIND_LABELS, classify_mixer, original_class, rewrite_blocker

_FP32 = 4


@dataclass(frozen=True)
class SSMLayerInfo:
    """One SSM layer.

    name: qualified module name. kind: "mamba2" | "gated_deltanet" | "kda" | "mamba1".
    shapes: per kind — mamba2: num_heads, head_dim, state_size, n_groups; gated_deltanet:
    num_k_heads, num_v_heads, head_k_dim, head_v_dim; kda: num_heads, head_dim; mamba1:
    intermediate_size, state_size. state_bytes: fp32 recurrent-state bytes per sequence.
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
        return KIND_LABELS.get(self.kind, self.kind)

    def buffer_bytes(self, buffer_len: int, act_bytes: int = 2) -> int:
        """Extra bytes per sequence of the ring buffer at length ``buffer_len``."""
        s, L = self.shapes, buffer_len
        if self.kind == "mamba2":
            return L * (s["num_heads"] * s["head_dim"] * act_bytes + s["num_heads"] * _FP32
                        + s["n_groups"] * s["state_size"] * act_bytes)
        if self.kind == "gated_deltanet":
            return L * (s["num_v_heads"] * s["head_v_dim"] * act_bytes + s["num_k_heads"] * s["head_k_dim"] * act_bytes
                        + s["num_v_heads"] * _FP32)
        if self.kind == "kda":
            return L * s["num_heads"] * s["head_dim"] * (2 * act_bytes + _FP32)
        return 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind_label"] = self.kind_label
        return d


def _int(module, *names, default=0) -> int:
    for n in names:
        v = getattr(module, n, None)
        if isinstance(v, int):
            return v
    return default


def _shapes(module: torch.nn.Module, kind: str) -> tuple[dict[str, int], int]:
    if kind == "mamba2":
        H = _int(module, "num_heads")
        P = _int(module, "head_dim")
        N = _int(module, "ssm_state_size")
        G = _int(module, "n_groups", default=1)
        if not H and hasattr(module, "A_log"):
            H = int(module.A_log.shape[0])
        return {"num_heads": H, "head_dim": P, "state_size": N, "n_groups": G}, H * P * N * _FP32
    if kind == "gated_deltanet":
        hk, hv = _int(module, "num_k_heads"), _int(module, "num_v_heads")
        dk, dv = _int(module, "head_k_dim"), _int(module, "head_v_dim")
        return {"num_k_heads": hk, "num_v_heads": hv, "head_k_dim": dk, "head_v_dim": dv}, hv * dk * dv * _FP32
    if kind == "kda":
        h, d = _int(module, "num_heads"), _int(module, "head_dim", "head_k_dim")
        return {"num_heads": h, "head_dim": d}, h * d * d * _FP32
    inner = _int(module, "intermediate_size")
    n = _int(module, "ssm_state_size")
    return {"intermediate_size": inner, "state_size": n}, inner * n * _FP32


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
        shapes, state_bytes = _shapes(module, kind)
        reason = rewrite_blocker(module)
        records.append(
            SSMLayerInfo(
                name=name,
                kind=kind,
                class_name=original_class(module).__name__,
                layer_idx=getattr(module, "layer_idx", None),
                shapes=shapes,
                state_bytes=state_bytes,
                can_rewrite=reason is None,
                reason=reason,
                patched=type(module) is not original_class(module),
                known_class=known,
            )
        )
    return records
