"""Which mixer classes are SSM layers, of which kind, and which replay mixin rewrites them."""

from __future__ import annotations

import torch

#: transformers mixer class name -> SSM kind
MIXER_KINDS: dict[str, str] = {
    # Mamba-2 (SSD)
    "Mamba2Mixer": "mamba2",
    "NemotronHMamba2Mixer": "mamba2",
    "BambaMixer": "mamba2",
    "FalconH1Mixer": "mamba2",
    "Zamba2MambaMixer": "mamba2",
    "GraniteMoeHybridMambaLayer": "mamba2",
    # Gated DeltaNet
    "Qwen3NextGatedDeltaNet": "gated_deltanet",
    "Qwen3_5GatedDeltaNet": "gated_deltanet",
    "Qwen3_5MoeGatedDeltaNet": "gated_deltanet",
    "Qwen4ExpTextGatedDeltaNet": "gated_deltanet",
    "OlmoHybridGatedDeltaNet": "gated_deltanet",
    # Kimi Delta Attention
    "KimiLinearDeltaAttention": "kda",
    "BailingHybridDeltaAttention": "kda",
    "Glm5NextTextLinearAttention": "kda",
    # Mamba-1 (selective scan)
    "MambaMixer": "mamba1",
    "FalconMambaMixer": "mamba1",
    "JambaMambaMixer": "mamba1",
    "ZambaMambaMixer": "mamba1",
}

KIND_LABELS = {
    "mamba2": "Mamba-2",
    "gated_deltanet": "Gated DeltaNet",
    "kda": "Kimi Delta Attention",
    "mamba1": "Mamba-1",
}

_CLASS_CACHE: dict[type, type] = {}


def _has(module, *names) -> bool:
    return all(hasattr(module, n) for n in names)


def structural_kind(module: torch.nn.Module) -> str | None:
    """Guess the SSM kind from parameter/submodule names (for classes not in MIXER_KINDS)."""
    if not hasattr(module, "conv1d") and not hasattr(module, "conv"):
        return None
    if _has(module, "forget_gate", "b_proj"):
        return "kda"
    if _has(module, "A_log", "dt_bias") and (
        _has(module, "in_proj_qkvz") or _has(module, "in_proj_qkv") or _has(module, "q_proj", "a_proj", "b_proj")
    ):
        return "gated_deltanet"
    if _has(module, "A_log", "dt_bias", "in_proj", "out_proj", "norm"):
        return "mamba2"
    if _has(module, "A_log") and (_has(module, "dt_proj", "x_proj") or _has(module, "dt_proj_weight")):
        return "mamba1"
    return None


def original_class(module: torch.nn.Module) -> type:
    cls = type(module)
    return getattr(cls, "_replayssm_original_class", cls)


def classify_mixer(module: torch.nn.Module) -> tuple[str, bool] | None:
    """(kind, known_class) for an SSM mixer, else None. Rewritten mixers classify as their original."""
    name = original_class(module).__name__
    if name in MIXER_KINDS:
        return MIXER_KINDS[name], True
    kind = structural_kind(module)
    if kind is not None:
        return kind, False
    return None


def replay_mixins() -> dict[str, type]:
    """SSM kind -> replay mixin class (imported lazily: kernels import torch/triton)."""
    from .mamba2 import ReplayMamba2Mixer

    mixins: dict[str, type] = {"mamba2": ReplayMamba2Mixer}
    try:
        from .delta import ReplayGatedDeltaNetMixer, ReplayKimiDeltaMixer

        mixins["gated_deltanet"] = ReplayGatedDeltaNetMixer
        mixins["kda"] = ReplayKimiDeltaMixer
    except ImportError:
        pass
    return mixins


def rewrite_blocker(module: torch.nn.Module) -> str | None:
    """Why this version cannot rewrite the module, or None if it can."""
    found = classify_mixer(module)
    if found is None:
        return "not an SSM layer"
    kind, known = found
    if not known:
        return (f"{original_class(module).__name__} has a {KIND_LABELS[kind]} structure but is not a transformers "
                f"class this version knows (remote code?); known classes: {', '.join(sorted(MIXER_KINDS))}")
    if kind not in replay_mixins():
        return f"ReplaySSM for {KIND_LABELS[kind]} layers is not implemented in this version"
    if getattr(module, "layer_idx", None) is None:
        return "the layer has no layer_idx, so its cache entry cannot be found"
    return None


def replay_class_for(module: torch.nn.Module) -> type:
    """The replay subclass of the module's original class (created once per class)."""
    base = original_class(module)
    kind, _ = classify_mixer(module)
    mixin = replay_mixins()[kind]
    cls = _CLASS_CACHE.get(base)
    if cls is None:
        cls = type(
            f"Replay{base.__name__}",
            (mixin, base),
            {"__module__": mixin.__module__, "_replayssm_original_class": base,
             "__doc__": f"{base.__name__} rewritten by replayssm ({mixin.__name__})."},
        )
        _CLASS_CACHE[base] = cls
    return cls


def restore_class(module: torch.nn.Module) -> None:
    """Give a rewritten module its original class back."""
    module.__class__ = original_class(module)
