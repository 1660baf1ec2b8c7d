"""Loading and saving ReplaySSM checkpoints.

    model = replayssm.from_pretrained("out/nemotron-replay", dtype=torch.bfloat16, device_map="cuda")
    replayssm.save_pretrained(model, "out/copy")

A ReplaySSM checkpoint directory is a Hugging Face checkpoint directory whose ``config.json`` has a
``replayssm`` block; ``from_pretrained`` loads it with transformers and applies the block,
exactly like ``replayssm.patch(AutoModelForCausalLM.from_pretrained(path))``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .checkpoint_dir import CONFIG_NAME, dump_config_json, read_config_json
from .output_dir import atomic_output_dir, remove_stale_temp_dirs
from .config import CONFIG_KEY, ReplaySSMConfig
from .errors import CheckpointError, ConfigError, ModelSpecError

# from_pretrained keywords that also matter when reading the config
_CONFIG_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "trust_remote_code",
                  "subfolder", "proxies")


def from_pretrained(path: str | os.PathLike, **hf_kwargs: Any):
    """Load a converted checkpoint with transformers and apply its recorded ReplaySSM configuration.

    ``hf_kwargs`` go to the model class's ``from_pretrained`` (dtype, device_map, ...); the class is
    AutoModelForCausalLM's for the config (or the one named in ``config.architectures``).
    The ``replayssm`` block is checked before any weight is read: a missing block raises
    ConfigError, a block written by a newer package raises SchemaVersionError.
    """
    from transformers import AutoConfig

    from .api import patch
    from .resolve import causal_lm_class

    _check_source(path)
    config = hf_kwargs.pop("config", None)
    if config is None:
        config_kwargs = {k: hf_kwargs[k] for k in _CONFIG_KWARGS if k in hf_kwargs}
        try:
            config = AutoConfig.from_pretrained(str(path), **config_kwargs)
        except OSError as exc:  # a hub id that is not there (or not reachable)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelSpecError(f"cannot load {path}: {first}",
                                 hint="pass a directory written by `replayssm convert` or replayssm.save_pretrained, "
                                      "or a hub id") from None
    block = getattr(config, CONFIG_KEY, None)
    if block is None:
        raise ConfigError(
            f"{path} is not a ReplaySSM checkpoint: its config.json has no {CONFIG_KEY!r} block",
            hint="convert it with `replayssm convert MODEL OUT_DIR`, or load it with transformers and call "
                 "replayssm.patch(model)",
        )
    ReplaySSMConfig.from_block(block)  # SchemaVersionError / ConfigError before loading weights
    cls = causal_lm_class(config, trust_remote_code=bool(hf_kwargs.get("trust_remote_code")))
    model = cls.from_pretrained(str(path), config=config, **hf_kwargs)
    return patch(model)


def _check_source(path) -> None:
    """A missing local directory is this tool's error, not transformers' "Repo id must be ..."."""
    from .resolve import _check_directory, _looks_like_path

    spec = str(path)
    local = Path(spec).expanduser()
    if local.exists():
        _check_directory(local.absolute(), spec)
    elif isinstance(path, os.PathLike) or _looks_like_path(spec):
        raise ModelSpecError(f"{spec}: no such directory",
                             hint="pass a directory written by `replayssm convert` or replayssm.save_pretrained")


def save_pretrained(model, out_dir: str | os.PathLike, *, force: bool = False, **hf_kwargs: Any) -> Path:
    """Save a patched model (weights, config with its ``replayssm`` block) atomically; return OUT_DIR.

    ``hf_kwargs`` go to ``model.save_pretrained`` (e.g. ``max_shard_size``). The directory is
    written beside ``out_dir`` and renamed into place; an existing ``out_dir`` is refused
    unless ``force``.
    """
    from .api import is_patched

    block = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    if block is None or not is_patched(model):
        raise ConfigError(
            "the model is not patched, so there is no replayssm configuration to save",
            hint="call replayssm.patch(model) first (or use model.save_pretrained for a plain checkpoint)",
        )
    ReplaySSMConfig.from_block(block)
    remove_stale_temp_dirs(Path(out_dir))
    with atomic_output_dir(Path(out_dir), force=force) as tmp:
        model.save_pretrained(str(tmp), **hf_kwargs)
        if not (tmp / CONFIG_NAME).is_file():
            raise CheckpointError(f"transformers wrote no {CONFIG_NAME}")
        data = read_config_json(tmp)
        expected = json.loads(json.dumps(block))
        if data.get(CONFIG_KEY) != expected:
            data[CONFIG_KEY] = expected
            (tmp / CONFIG_NAME).write_text(dump_config_json(data), encoding="utf-8")
    return Path(out_dir).expanduser().absolute()


__all__ = ["from_pretrained", "save_pretrained"]
