"""MODEL arguments -> local checkpoint directories, and models built on the meta device.

A MODEL is one of:

* a local checkpoint directory (holding ``config.json``);
* a ``tiny:<model_type>`` spec (a built-in tiny checkpoint, written once to the cache);
* a Hugging Face hub id (``org/name``) whose snapshot is already in the local HF cache.
  Nothing is ever downloaded: the lookup is offline (``local_files_only=True``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint_dir import read_config_json
from .errors import CheckpointError, ModelSpecError
from .tiny import TINY_FAMILIES, is_tiny_spec, materialize_tiny, tiny_config, tiny_family


@dataclass(frozen=True)
class ResolvedModel:
    """Where a MODEL argument points. ``path`` is None only for a tiny spec not materialised."""

    spec: str
    kind: str  # "directory" | "tiny" | "hub"
    path: Path | None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "kind": self.kind, "path": str(self.path) if self.path else None}


def _looks_like_path(spec: str) -> bool:
    """True for strings that cannot be a hub id ("org/name" or "name")."""
    return spec.startswith((".", "/", "~")) or spec.endswith("/") or "\\" in spec or spec.count("/") > 1


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot directory of a hub model, or None if not cached. Never downloads."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return None
    try:
        path = snapshot_download(repo_id, local_files_only=True)
    except HFValidationError:
        return None
    except Exception:  # LocalEntryNotFoundError, OfflineModeIsEnabled, ...
        return None
    return Path(path) if path else None


def _hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover
        return "the Hugging Face cache"


def _check_directory(path: Path, spec: str) -> Path:
    if not path.is_dir():
        if path.exists():
            raise CheckpointError(
                f"{spec} is a file, not a checkpoint directory",
                hint="pass the directory that holds config.json and the weights",
            )
        raise ModelSpecError(f"{spec}: no such directory")  # pragma: no cover - callers check existence
    if not os.access(path, os.R_OK | os.X_OK):
        raise CheckpointError(f"cannot read {path}: permission denied", hint="check the directory's permissions")
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{path} has no config.json, so it is not a Hugging Face checkpoint directory",
            hint="pass the directory that holds config.json and the weights",
        )
    return path


def resolve_model(spec: str, *, materialize: bool = True) -> ResolvedModel:
    """Resolve a MODEL argument to a local checkpoint directory.

    ``materialize=False`` leaves a ``tiny:`` spec unwritten (``path`` None): its config is
    built in memory by ``load_config``. Raises ModelSpecError (unknown spec, not found) or
    CheckpointError (a file, an unreadable directory, no config.json).
    """
    spec = str(spec)
    if not spec.strip():
        raise ModelSpecError("MODEL is empty", hint="pass a checkpoint directory, a tiny:<family> spec or a hub id")
    if is_tiny_spec(spec):
        tiny_family(spec)  # raises ModelSpecError listing the families
        return ResolvedModel(spec, "tiny", materialize_tiny(spec) if materialize else None)
    path = Path(spec).expanduser()
    if path.exists():
        return ResolvedModel(spec, "directory", _check_directory(path.absolute(), spec))
    if not _looks_like_path(spec):
        snapshot = _hub_snapshot(spec)
        if snapshot is not None:
            return ResolvedModel(spec, "hub", _check_directory(snapshot, spec))
        raise ModelSpecError(
            f"{spec!r} is neither a directory nor a model in the local Hugging Face cache ({_hub_cache_dir()})",
            hint=f"check the spelling; download it first (hf download {spec}), or pass a local directory "
                 f"or tiny:<family> (families: {', '.join(list(TINY_FAMILIES)[:4])}, ...)",
        )
    raise ModelSpecError(
        f"{spec}: no such directory",
        hint="pass an existing checkpoint directory (holding config.json), a hub id or tiny:<family>",
    )


def check_config_dict(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """Refuse a config.json that no library can read as a model (no ``model_type``); return it."""
    if not isinstance(raw.get("model_type"), str) or not raw["model_type"]:
        raise CheckpointError(
            f"{path}/config.json has no model_type, so no library can tell which model it describes",
            hint='restore the checkpoint\'s original config.json (it names the family, e.g. "model_type": '
                 '"nemotron_h")',
        )
    return raw


def load_config(resolved: ResolvedModel, *, trust_remote_code: bool = False):
    """The transformers config object of a resolved model (reads config.json only)."""
    if resolved.kind == "tiny" and resolved.path is None:
        return tiny_config(resolved.spec)
    raw = check_config_dict(read_config_json(resolved.path), resolved.path)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(resolved.path), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = ("the checkpoint ships its own modelling code; pass --trust-remote-code if you trust it"
                if "trust_remote_code" in str(exc) else
                f"model type {raw['model_type']!r} may be newer than the installed transformers: upgrade it")
        raise ModelSpecError(f"transformers cannot read {resolved.path}/config.json: {message}", hint=hint) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {resolved.path}/config.json: {exc}") from None


def causal_lm_class(config, *, trust_remote_code: bool = False):
    """The transformers class that builds and loads a generating model for ``config``.

    ``replayssm.tiny.model_class_for`` (AutoModelForCausalLM's class for the config, else the
    class named in ``config.architectures``); for remote-code configs, ``AutoModelForCausalLM``
    itself (it then needs ``trust_remote_code``).
    """
    from .tiny import model_class_for

    try:
        return model_class_for(config)
    except ModelSpecError:
        if trust_remote_code:
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM
        raise ModelSpecError(
            f"transformers has no generating model class for model type {getattr(config, 'model_type', '?')!r}",
            hint="replayssm converts causal language models; if the checkpoint ships its own modelling code, "
                 "pass --trust-remote-code",
        ) from None


def build_meta_model(config, *, trust_remote_code: bool = False, causal_lm_only: bool = True):
    """Instantiate the model on the meta device from its config: no weights, no memory.

    Uses ``causal_lm_class`` (the class ``replayssm.from_pretrained`` loads with, so layer
    names match); with ``causal_lm_only=False`` falls back to AutoModel for other architectures.
    """
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    try:
        cls = causal_lm_class(config, trust_remote_code=trust_remote_code)
    except ModelSpecError:
        if causal_lm_only:
            raise
        cls = AutoModel
    try:
        with torch.device("meta"):
            if cls in (AutoModel, AutoModelForCausalLM):
                return cls.from_config(config, trust_remote_code=trust_remote_code)
            return cls._from_config(config)
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelSpecError(
            f"transformers cannot build {getattr(cls, '__name__', cls)} for model type "
            f"{getattr(config, 'model_type', '?')!r}: {first}",
            hint="upgrade transformers if the model type is newer than the installed version",
        ) from None


__all__ = ["ResolvedModel", "build_meta_model", "causal_lm_class", "check_config_dict", "load_config", "resolve_model"]
