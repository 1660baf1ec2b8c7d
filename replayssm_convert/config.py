"""``ReplaySSMConfig``: the validated configuration of a rewrite, and its config.json block."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .errors import ConfigError, SchemaVersionError

SCHEMA_VERSION = 1
CONFIG_KEY = "replayssm"
BACKENDS = ("auto", "triton", "torch")
STATE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
}
MAX_BUFFER_LEN = 256


def normalize_state_dtype(value: Any) -> str | None:
    """None, a torch dtype or a name ("bf16", "bfloat16", ...) -> "fp32" | "bf16" | "fp16" | None."""
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        for name, dt in STATE_DTYPES.items():
            if dt == value:
                return name
        raise ConfigError(f"state_dtype must be one of {', '.join(STATE_DTYPES)}; got {value}")
    key = str(value).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ConfigError(f"state_dtype must be one of {', '.join(STATE_DTYPES)} (or None to keep fp32); got {value!r}")
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True)
class ReplaySSMConfig:
    """How to rewrite a model's SSM layers.

    buffer_len: tokens buffered between checkpoint writes (L); 1 writes every step.
    state_dtype: checkpoint dtype, "fp32" | "bf16" | "fp16", or None for the cache's (fp32).
    layers: names or regular expressions (full match) of the layers to rewrite; None = all.
    backend: "auto" | "triton" | "torch".
    strict: raise on a selected layer this version cannot rewrite (else skip and report it).
    cuda_graphs: run every decode step of ``generate()`` as a replayed CUDA graph (CUDA only;
        anything the graphs cannot serve falls back to the eager path with a log line).
    graph_max_len: with ``cuda_graphs``, the most cache positions (prompt + new tokens) one call may
        need; None sizes each pooled cache to the call, rounded up to 256.
    """

    buffer_len: int = 16
    state_dtype: str | None = None
    layers: tuple[str, ...] | None = None
    backend: str = "auto"
    strict: bool = True
    cuda_graphs: bool = False
    graph_max_len: int | None = None
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self):
        if isinstance(self.buffer_len, bool) or not isinstance(self.buffer_len, int):
            raise ConfigError(f"buffer_len must be an integer in [1, {MAX_BUFFER_LEN}]; got {self.buffer_len!r}")
        if not 1 <= self.buffer_len <= MAX_BUFFER_LEN:
            raise ConfigError(f"buffer_len must be in [1, {MAX_BUFFER_LEN}]; got {self.buffer_len}")
        object.__setattr__(self, "state_dtype", normalize_state_dtype(self.state_dtype))
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        if self.layers is not None:
            layers = (self.layers,) if isinstance(self.layers, str) else tuple(self.layers)
            if not layers:
                raise ConfigError("layers must name at least one layer (or be None for all); got an empty list")
            for pattern in layers:
                if not isinstance(pattern, str):
                    raise ConfigError(f"layers must be strings (names or regular expressions); got {pattern!r}")
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ConfigError(f"layers must be valid regular expressions; got {pattern!r} ({exc})") from None
            object.__setattr__(self, "layers", layers)
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"cuda_graphs must be True or False; got {self.cuda_graphs!r}")
        if self.graph_max_len is not None and (isinstance(self.graph_max_len, bool)
                                               or not isinstance(self.graph_max_len, int) or self.graph_max_len < 2):
            raise ConfigError(f"graph_max_len must be an integer >= 2 or None; got {self.graph_max_len!r}")
        if not isinstance(self.schema_version, int) or self.schema_version < 1:
            raise ConfigError(f"schema_version must be a positive integer; got {self.schema_version!r}")
        if self.schema_version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"this replayssm understands schema version {SCHEMA_VERSION}, but the configuration has version "
                f"{self.schema_version}",
                hint="upgrade replayssm to read this checkpoint's replayssm block",
            )

    @property
    def torch_state_dtype(self) -> torch.dtype | None:
        return STATE_DTYPES[self.state_dtype] if self.state_dtype else None

    def selects(self, layer_name: str) -> bool:
        if self.layers is None:
            return True
        return any(layer_name == p or re.fullmatch(p, layer_name) for p in self.layers)

    def to_block(self, rewritten: list[dict[str, Any]]) -> dict[str, Any]:
        """The config.json block: settings plus the rewritten layers (name, kind)."""
        from . import __version__

        return {
            "schema_version": SCHEMA_VERSION,
            "package_version": __version__,
            "buffer_len": self.buffer_len,
            "state_dtype": self.state_dtype or "fp32",
            "backend": self.backend,
            "cuda_graphs": self.cuda_graphs,
            "graph_max_len": self.graph_max_len,
            "layers": rewritten,
        }

    @classmethod
    def from_block(cls, block: Any) -> "ReplaySSMConfig":
        """Read a config.json ``replayssm`` block (refusing newer schema versions)."""
        if not isinstance(block, dict):
            raise ConfigError(f"the replayssm block in config.json must be an object; got {type(block).__name__}")
        version = block.get("schema_version")
        if not isinstance(version, int):
            raise ConfigError(f"the replayssm block has no integer schema_version; got {version!r}")
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"config.json's replayssm block has schema version {version}; this replayssm "
                f"understands up to {SCHEMA_VERSION}",
                hint="upgrade replayssm (pip install -U replayssm) to load this checkpoint",
            )
        names = [entry["name"] for entry in block.get("layers", []) if isinstance(entry, dict) and "name" in entry]
        return cls(
            buffer_len=block.get("buffer_len", 16),
            state_dtype=block.get("state_dtype"),
            layers=tuple(re.escape(n) for n in names) or None,
            backend=block.get("backend", "auto"),
            cuda_graphs=block.get("cuda_graphs", False),
            graph_max_len=block.get("graph_max_len"),
            strict=True,
            schema_version=version,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
