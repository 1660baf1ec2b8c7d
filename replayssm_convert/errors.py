"""Exception classes. Every message says what was expected and what was found."""

from __future__ import annotations


class ReplaySSMError(Exception):
    """Base class of every error this package raises on purpose."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class ConfigError(ReplaySSMError, ValueError):
    """A configuration field has an invalid value."""


class NoSSMLayersError(ReplaySSMError):
    """The model has no SSM layer that this package knows."""


class UnsupportedLayerError(ReplaySSMError):
    """An SSM layer was found but this version cannot rewrite it."""


class ModelSpecError(ReplaySSMError):
    """A model argument (path, hub id or ``tiny:`` spec) cannot be resolved."""


class CheckpointError(ReplaySSMError):
    """A checkpoint directory is missing files, truncated or corrupt."""


class OutputExistsError(ReplaySSMError):
    """The output directory exists and overwriting was not asked for."""


class ValidationFailedError(ReplaySSMError):
    """The patched model's outputs differ from the original's beyond tolerance."""


class SchemaVersionError(ReplaySSMError):
    """A ``replayssm`` block in config.json was written by a newer package."""


class BackendError(ReplaySSMError):
    """The requested kernel backend cannot run on these tensors."""


class CacheError(ReplaySSMError):
    """The cache of built-in tiny checkpoints ($REPLAYSSM_CACHE) cannot be written."""


class OutOfDiskError(ReplaySSMError, OSError):
    """Not enough free disk space to write the output."""


class CacheStateError(ReplaySSMError):
    """A generation cache's ReplaySSM buffers do not match the cache they live in."""


class RollbackError(ReplaySSMError, RuntimeError):
    """A cache cannot be rolled back as asked: the tokens to remove are no longer in the ReplaySSM
    ring (folded into the checkpoint), or the cache was not recording its past."""


class VerifyWindowError(ReplaySSMError, ValueError):
    """A multi-token (verify) forward holds more tokens than the ReplaySSM ring can keep."""


class GraphDecodeError(ReplaySSMError, RuntimeError):
    """A CUDA-graph decode step ran on other inputs than ``generate()`` then passed (an internal
    error: the call's result is discarded rather than returned wrong)."""
