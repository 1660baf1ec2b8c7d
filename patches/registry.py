"""Which mixer classes are SSM layers, of which kind (``kinds.KINDS``), and their replay classes."""

from __future__ import annotations

import torch

from .kinds import KINDS, LayerKind, kind_of_class, structural_kind

#: transformers mixer class name -> SSM kind name (derived from ``KINDS``)
MIXER_KINDS: dict[str, str] = {cls: kind.name for kind in KINDS.values() for cls in kind.mixer_classes}

_CLASS_CACHE: dict[type, type] = {}


def original_class(module: torch.nn.Module) -> type:
    cls = type(module)
    return getattr(cls, "_replayssm_original_class", cls)


def classify_mixer(module: torch.nn.Module) -> tuple[LayerKind, bool] | None:
    """(kind, known_class) for an SSM mixer, else None. Rewritten mixers classify as their original."""
    kind = kind_of_class(original_class(module).__name__)
    if kind is not None:
        return kind, True
    kind = structural_kind(module)
    return (kind, False) if kind is not None else None


def replay_mixins() -> dict[str, type]:
    """SSM kind name -> replay mixin class, for the kinds this version can rewrite."""
    return {k.name: k.replay_mixin() for k in KINDS.values() if k.replay_mixin() is not None}


def rewrite_blocker(module: torch.nn.Module) -> str | None:
    """Why this version cannot rewrite the module, or None if it can."""
    found = classify_mixer(module)
    if found is None:
        return "not an SSM layer"
    kind, known = found
    if not known:
        return (f"{original_class(module).__name__} has a {kind.label} structure but is not a transformers "
                f"class this version knows (remote code?); known classes: {', '.join(sorted(MIXER_KINDS))}")
    if kind.replay_mixin() is None:
        return f"ReplaySSM for {kind.label} layers is not implemented in this version"
    if getattr(module, "layer_idx", None) is None:
        return "the layer has no layer_idx, so its cache entry cannot be found"
    return None


def replay_class_for(module: torch.nn.Module) -> type:
    """The replay subclass of the module's original class (created once per class)."""
    base = original_class(module)
    kind, _ = classify_mixer(module)
    mixin = kind.replay_mixin()
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
