"""replayssm: rewrite the SSM layers of Hugging Face hybrid models into ReplaySSM layers.

    import replayssm
    model = replayssm.patch(model)          # in place, reversible: replayssm.unpatch(model)
    model.generate(...)

A ReplaySSM layer keeps a checkpoint state plus a ring buffer of the recent per-token SSM
inputs, computes each decode step's output from them, and writes the state once every
``buffer_len`` steps.
"""

__version__ = "0.1.0"

from .errors import (
    CacheStateError,
    CacheError,
    CheckpointError,
    ConfigError,
    ModelSpecError,
    NoSSMLayersError,
    OutOfDiskError,
    OutputExistsError,
    ReplaySSMError,
    RollbackError,
    SchemaVersionError,
    UnsupportedLayerError,
    ValidationFailedError,
    VerifyWindowError,
)

# Everything else is imported on first use, so that `import replayssm` (and every CLI start,
# `--help` and `--version` included) does not pay for importing torch and transformers.
_LAZY = {
    "graph_report": "api", "is_patched": "api", "patch": "api", "release_graphs": "api", "replayssm_report": "api", "unpatch": "api",
    "SCHEMA_VERSION": "config", "ReplaySSMConfig": "config",
    "rollback": "speculation", "verify": "speculation",
    "SSMLayerInfo": "discovery", "find_ssm_layers": "discovery",
    "ConvertResult": "conversion", "convert": "conversion", "describe": "inspection",
    "from_pretrained": "io", "save_pretrained": "io",
    "ValidationResult": "validate", "validate_checkpoint": "validate",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replayssm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "SCHEMA_VERSION",
    "CacheStateError",
    "CacheError",
    "CheckpointError",
    "ConfigError",
    "ConvertResult",
    "ModelSpecError",
    "NoSSMLayersError",
    "OutOfDiskError",
    "OutputExistsError",
    "ReplaySSMConfig",
    "ReplaySSMError",
    "RollbackError",
    "SSMLayerInfo",
    "SchemaVersionError",
    "UnsupportedLayerError",
    "ValidationFailedError",
    "ValidationResult",
    "VerifyWindowError",
    "__version__",
    "convert",
    "describe",
    "find_ssm_layers",
    "from_pretrained",
    "graph_report",
    "is_patched",
    "patch",
    "release_graphs",
    "replayssm_report",
    "rollback",
    "save_pretrained",
    "unpatch",
    "validate_checkpoint",
    "verify",
]
