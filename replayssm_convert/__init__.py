"""replayssm: rewrite the SSM layers of Hugging Face hybrid models into ReplaySSM layers.

    import replayssm
    model = replayssm.patch(model)          # in place, reversible: replayssm.unpatch(model)
    model.generate(...)

A ReplaySSM layer keeps a checkpoint state plus a ring buffer of the recent per-token SSM
inputs, computes each decode step's output from them, and writes the state once every
``buffer_len`` steps.
"""

__version__ = "0.1.0"

from .api import is_patched, patch, replayssm_report, unpatch
from .config import SCHEMA_VERSION, ReplaySSMConfig
from .discovery import SSMLayerInfo, find_ssm_layers
from .errors import (
    CheckpointError,
    ConfigError,
    ModelSpecError,
    NoSSMLayersError,
    OutputExistsError,
    ReplaySSMError,
    SchemaVersionError,
    UnsupportedLayerError,
    ValidationFailedError,
)

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointError",
    "ConfigError",
    "ModelSpecError",
    "NoSSMLayersError",
    "OutputExistsError",
    "ReplaySSMConfig",
    "ReplaySSMError",
    "SSMLayerInfo",
    "SchemaVersionError",
    "UnsupportedLayerError",
    "ValidationFailedError",
    "__version__",
    "find_ssm_layers",
    "is_patched",
    "patch",
    "replayssm_report",
    "unpatch",
]
