"""One declaration per SSM layer kind: what discovery, patching and the tests know about it.

A ``LayerKind`` names the transformers mixer classes of the kind, its structural signature
(for classes it does not name, e.g. remote code), how to read its shapes from a module, the
per-sequence recurrent state, the replay ring buffers, and the replay mixin that rewrites it.
Adding a layer kind is one ``LayerKind`` in ``KINDS``; adding a class of a known kind is one
name in its ``mixer_classes``. Imports nothing heavy at module level (the mixins import kernels).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable

#: bytes of one fp32 element (recurrent states and the fp32 ring entries)
_FP32 = 4

Shapes = dict[str, int]
#: name -> (shape, dtype); dtype None marks an activation-dtype buffer
BufferSpecs = dict[str, tuple[tuple[int, ...], Any]]


def _has(module, *names) -> bool:
    return all(hasattr(module, n) for n in names)


def _int(module, *names, default=0) -> int:
    for n in names:
        v = getattr(module, n, None)
        if isinstance(v, int):
            return v
    return default


@dataclass(frozen=True)
class LayerKind:
    """An SSM layer kind. ``shapes(module)`` reads attributes only (works on the meta device);
    ``state_shape(shapes)`` is the fp32 recurrent state of one sequence; ``buffer_specs(shapes,
    batch, buffer_len, act_dtype)`` the replay ring buffers (act_dtype None: activations);
    ``mixin`` is "module:Class" of the replay mixin, None where replay is not implemented."""

    name: str
    label: str
    #: a few characters for table columns
    short: str
    mixer_classes: tuple[str, ...]
    signature: Callable[[Any], bool]
    shapes: Callable[[Any], Shapes]
    state_shape: Callable[[Shapes], tuple[int, ...]]
    buffer_specs: Callable[[Shapes, int, int, Any], BufferSpecs] = lambda s, b, L, act: {}
    mixin: str | None = None
    #: the transformers function a replay decode step never calls (the stock per-step recurrence)
    stock_step: str | None = None

    def replay_mixin(self) -> type | None:
        """The replay mixin class (imported on first use), None where this version has none."""
        if self.mixin is None:
            return None
        module, _, cls = self.mixin.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except ImportError:
            return None

    def state_bytes(self, shapes: Shapes) -> int:
        return math.prod(self.state_shape(shapes)) * _FP32

    def buffer_bytes(self, shapes: Shapes, buffer_len: int, act_bytes: int = 2) -> int:
        """Bytes per sequence of the ring buffers at length ``buffer_len``."""
        specs = self.buffer_specs(shapes, 1, buffer_len, None)
        return sum(math.prod(shape) * (act_bytes if dtype is None else dtype.itemsize)
                   for shape, dtype in specs.values())


def _fp32():
    import torch

    return torch.float32


def _mamba2_shapes(m) -> Shapes:
    H = _int(m, "num_heads")
    if not H and hasattr(m, "A_log"):
        H = int(m.A_log.shape[0])
    return {"num_heads": H, "head_dim": _int(m, "head_dim"), "state_size": _int(m, "ssm_state_size"),
            "n_groups": _int(m, "n_groups", default=1)}


def _mamba2_buffers(s: Shapes, batch: int, L: int, act) -> BufferSpecs:
    H, P, G, N = s["num_heads"], s["head_dim"], s["n_groups"], s["state_size"]
    return {"x_buf": ((batch, H, L, P), act), "dt_buf": ((batch, H, L), _fp32()), "B_buf": ((batch, G, L, N), act)}


MAMBA2 = LayerKind(
    name="mamba2", label="Mamba-2", short="Mamba-2",
    mixer_classes=("Mamba2Mixer", "NemotronHMamba2Mixer", "BambaMixer", "FalconH1Mixer", "Zamba2MambaMixer",
                   "GraniteMoeHybridMambaLayer"),
    signature=lambda m: _has(m, "A_log", "dt_bias", "in_proj", "out_proj", "norm"),
    shapes=_mamba2_shapes,
    state_shape=lambda s: (s["num_heads"], s["head_dim"], s["state_size"]),
    buffer_specs=_mamba2_buffers,
    mixin="replayssm.patches.mamba2:ReplayMamba2Mixer",
    stock_step="mamba2_selective_state_update",
)


def _gdn_buffers(s: Shapes, batch: int, L: int, act) -> BufferSpecs:
    return {"u_buf": ((batch, s["num_v_heads"], L, s["head_v_dim"]), act),
            "k_buf": ((batch, s["num_k_heads"], L, s["head_k_dim"]), act),
            "g_buf": ((batch, s["num_v_heads"], L), _fp32())}


GATED_DELTANET = LayerKind(
    name="gated_deltanet", label="Gated DeltaNet", short="GDN",
    mixer_classes=("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet",
                   "Qwen4ExpTextGatedDeltaNet", "OlmoHybridGatedDeltaNet", "LaraMiniGatedDeltaNet"),
    signature=lambda m: _has(m, "A_log", "dt_bias") and (
        _has(m, "in_proj_qkvz") or _has(m, "in_proj_qkv") or _has(m, "q_proj", "a_proj", "b_proj")),
    shapes=lambda m: {"num_k_heads": _int(m, "num_k_heads"), "num_v_heads": _int(m, "num_v_heads"),
                      "head_k_dim": _int(m, "head_k_dim"), "head_v_dim": _int(m, "head_v_dim")},
    state_shape=lambda s: (s["num_v_heads"], s["head_k_dim"], s["head_v_dim"]),
    buffer_specs=_gdn_buffers,
    mixin="replayssm.patches.delta:ReplayGatedDeltaNetMixer",
    stock_step="torch_recurrent_gated_delta_rule",
)


def _kda_buffers(s: Shapes, batch: int, L: int, act) -> BufferSpecs:
    H, D = s["num_heads"], s["head_dim"]
    return {"u_buf": ((batch, H, L, D), act), "k_buf": ((batch, H, L, D), act), "g_buf": ((batch, H, L, D), _fp32())}


KDA = LayerKind(
    name="kda", label="Kimi Delta Attention", short="KDA",
    mixer_classes=("KimiLinearDeltaAttention", "BailingHybridDeltaAttention", "Glm5NextTextLinearAttention"),
    signature=lambda m: _has(m, "forget_gate", "b_proj"),
    shapes=lambda m: {"num_heads": _int(m, "num_heads"), "head_dim": _int(m, "head_dim", "head_k_dim")},
    state_shape=lambda s: (s["num_heads"], s["head_dim"], s["head_dim"]),
    buffer_specs=_kda_buffers,
    mixin="replayssm.patches.delta:ReplayKimiDeltaMixer",
    stock_step="recurrent_kimi_delta_attention",
)

MAMBA1 = LayerKind(
    name="mamba1", label="Mamba-1", short="Mamba-1",
    mixer_classes=("MambaMixer", "FalconMambaMixer", "JambaMambaMixer", "ZambaMambaMixer"),
    signature=lambda m: _has(m, "A_log") and (_has(m, "dt_proj", "x_proj") or _has(m, "dt_proj_weight")),
    shapes=lambda m: {"intermediate_size": _int(m, "intermediate_size"), "state_size": _int(m, "ssm_state_size")},
    state_shape=lambda s: (s["intermediate_size"], s["state_size"]),
)

#: every layer kind, by name; the order is the structural signatures' precedence
KINDS: dict[str, LayerKind] = {k.name: k for k in (KDA, GATED_DELTANET, MAMBA2, MAMBA1)}


def kind_of_class(class_name: str) -> LayerKind | None:
    """The kind that names ``class_name`` among its mixer classes."""
    return next((k for k in KINDS.values() if class_name in k.mixer_classes), None)


def structural_kind(module) -> LayerKind | None:
    """The kind whose structural signature the module has (for classes no kind names)."""
    if not hasattr(module, "conv1d") and not hasattr(module, "conv"):
        return None
    return next((k for k in KINDS.values() if k.signature(module)), None)
