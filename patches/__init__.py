"""Per-family ReplaySSM layers (transformers-aware). Imports kernels, never the CLI.

The rewrite is per instance and reversible: a patched mixer's ``__class__`` becomes a
subclass that intercepts single-token decode and delegates everything else to the
original class, so parameters, buffers, hooks and state-dict names stay the same.
"""

from .registry import MIXER_KINDS, classify_mixer, replay_class_for, restore_class
from .options import LayerReplayOptions

__all__ = ["MIXER_KINDS", "LayerReplayOptions", "classify_mixer", "replay_class_for", "restore_class"]
