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
from .convert import ConvertResult, convert
from .io import from_pretrained, save_pretrained
from .validate import ValidationResult, validate_checkpoint
from .errors import (
    CheckpointError,
    ConfigError,
    ModelSpecError,
    NoSSMLayersError,
    OutOfDiskError,
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
    "ConvertResult",
    "ModelSpecError",
    "NoSSMLayersError",
    "OutOfDiskError",
    "OutputExistsError",
    "ReplaySSMConfig",
    "ReplaySSMError",
    "SSMLayerInfo",
    "SchemaVersionError",
    "UnsupportedLayerError",
    "ValidationFailedError",
    "ValidationResult",
    "__version__",
    "convert",
    "find_ssm_layers",
    "from_pretrained",
    "is_patched",
    "patch",
    "replayssm_report",
    "save_pretrained",
    "unpatch",
    "validate_checkpoint",
]
