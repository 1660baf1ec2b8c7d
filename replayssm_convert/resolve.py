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


def load_config(resolved: ResolvedModel, *, trust_remote_code: bool = False):
    """The transformers config object of a resolved model (reads config.json only)."""
    if resolved.kind == "tiny" and resolved.path is None:
        return tiny_config(resolved.spec)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(resolved.path), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = ("the checkpoint ships its own modelling code; pass --trust-remote-code if you trust it"
                if "trust_remote_code" in str(exc) else
                "upgrade transformers if the model type is newer than the installed version")
        raise ModelSpecError(f"transformers cannot read {resolved.path}/config.json: {message}", hint=hint) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {resolved.path}/config.json: {exc}") from None


def build_meta_model(config, *, trust_remote_code: bool = False, causal_lm_only: bool = True):
    """Instantiate the model on the meta device from its config: no weights, no memory.

    Uses AutoModelForCausalLM (the class ``from_pretrained`` will use); with
    ``causal_lm_only=False`` falls back to AutoModel for other architectures.
    """
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    kwargs = {"trust_remote_code": trust_remote_code} if trust_remote_code else {}
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    except ValueError as exc:
        first_error = exc
    if not causal_lm_only:
        try:
            with torch.device("meta"):
                return AutoModel.from_config(config, **kwargs)
        except ValueError:
            pass
    model_type = getattr(config, "model_type", "?")
    raise ModelSpecError(
        f"transformers has no causal-LM class for model type {model_type!r} "
        f"({str(first_error).splitlines()[0] if str(first_error) else 'unrecognised configuration'})",
        hint="replayssm converts causal language models; if the model ships its own code, pass --trust-remote-code",
    )


__all__ = ["ResolvedModel", "build_meta_model", "load_config", "resolve_model"]
