"""``ReplaySSMConfig``, its config.json block, and the one vocabulary of options.

Every entry point (``replayssm.patch``, ``replayssm.convert``, the CLI) accepts the same
spellings because each option is parsed here, once: ``parse_backend``,
``parse_state_dtype``, ``parse_state_rounding``, ``parse_state_seed``, ``parse_model_dtype``,
``parse_buffer_len``, ``parse_strict``, ``parse_layers``. The module does not import torch, so the CLI checks options before
paying for it.
"""

from __future__ import annotations

import operator
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable

from .errors import ConfigError, SchemaVersionError

#: version 2 records layer names relative to the decoder stack ("layers.0.mixer"); version 1
#: recorded them as qualified in the class that was patched ("model.layers.0.mixer")
SCHEMA_VERSION = 2
CONFIG_KEY = "replayssm"
DEFAULT_BUFFER_LEN = 16
MAX_BUFFER_LEN = 256


class Backend(str, Enum):
    """Kernel backend: Triton for CUDA tensors when it runs ("auto"), always Triton, or the PyTorch reference.
    The same names as ``replayssm.kernels.backend.BACKENDS`` (kept apart: this module imports no torch)."""

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


class StateDtype(str, Enum):
    """dtype of the state checkpoint (the 16/32-bit ones also of activations, for size estimates).

    fp8 (e4m3) and int8 checkpoints are scaled: one fp32 scale per head-dim vector over the state
    dimension is stored beside them (``replayssm.kernels.quant``)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"

    @property
    def itemsize(self) -> int:
        return {"fp32": 4, "bf16": 2, "fp16": 2}.get(self.value, 1)

    @property
    def scaled(self) -> bool:
        """Whether the checkpoint keeps fp32 scales beside it (the 8-bit dtypes)."""
        return self in (StateDtype.FP8, StateDtype.INT8)

    @property
    def torch_dtype(self):
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8": torch.float8_e4m3fn, "int8": torch.int8}[self.value]


class StateRounding(str, Enum):
    """How a checkpoint below fp32 is rounded when it is written (prefill end and every flush)."""

    NEAREST = "nearest"
    STOCHASTIC = "stochastic"


class ModelDtype(str, Enum):
    """dtype a model is loaded in for validation; "auto": the checkpoint's on GPUs, fp32 on CPU."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


#: every spelling of a dtype that the options accept (case-insensitive), and str(torch dtype)
DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "e4m3": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "torch.float8_e4m3fn": "fp8",
    "int8": "int8", "torch.int8": "int8",
}
#: every spelling of a rounding mode (case-insensitive)
ROUNDING_ALIASES = {"nearest": "nearest", "rtn": "nearest", "round": "nearest",
                    "stochastic": "stochastic", "sr": "stochastic"}
#: the largest state seed (seeds are mixed as 32-bit words)
MAX_STATE_SEED = 2**32 - 1


def _names(enum: type[Enum]) -> str:
    return ", ".join(m.value for m in enum)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def parse_backend(value: Any) -> str:
    """"auto" | "triton" | "torch" (any case) -> its canonical name."""
    value = _plain(value)
    key = value.strip().lower() if isinstance(value, str) else None
    if key not in {m.value for m in Backend}:
        raise ConfigError(f"backend must be one of {_names(Backend)}; got {value!r}")
    return key


def _dtype_key(value: Any) -> str | None:
    value = _plain(value)
    if type(value).__module__ == "torch":  # a torch.dtype, without importing torch here
        value = str(value)
    return DTYPE_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None


def parse_state_dtype(value: Any) -> str | None:
    """None, a torch dtype or a name ("bf16", "bfloat16", "half", "e4m3", ...) -> "fp32" | "bf16" |
    "fp16" | "fp8" | "int8" | None."""
    if value is None:
        return None
    key = _dtype_key(value)
    if key is None:
        raise ConfigError(f"state_dtype must be one of {_names(StateDtype)} (also float32, bfloat16, float16, "
                          f"half, e4m3, a torch dtype, or None to keep the cache's fp32); got {_plain(value)!r}")
    return key


def parse_state_rounding(value: Any) -> str:
    """"nearest" | "stochastic" (also rtn, sr; any case) -> its canonical name."""
    value = _plain(value)
    key = ROUNDING_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if key is None:
        raise ConfigError(f"state_rounding must be one of {_names(StateRounding)} (also rtn, sr); got {value!r}")
    return key


def _parse_int(name: str, value: Any, lo: int, hi: int) -> int:
    """An integer in [lo, hi]: not a bool, not a float (an index-like value)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}]; got {value!r}") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{name} must be in [{lo}, {hi}]; got {n}")
    return n


def parse_state_seed(value: Any) -> int:
    """An integer in [0, 2**32 - 1] (not a bool): the seed of stochastic rounding."""
    return _parse_int("state_seed", value, 0, MAX_STATE_SEED)


def parse_model_dtype(value: Any) -> str:
    """None, "auto", a torch dtype or a dtype name -> "auto" | "fp32" | "bf16" | "fp16"."""
    if value is None or (isinstance(_plain(value), str) and _plain(value).strip().lower() == "auto"):
        return "auto"
    key = _dtype_key(value)
    if key not in {m.value for m in ModelDtype}:
        raise ConfigError(f"dtype must be one of {_names(ModelDtype)} (also float32, bfloat16, float16, half "
                          f"or a torch dtype); got {_plain(value)!r}")
    return key


def parse_buffer_len(value: Any) -> int:
    """An integer in [1, MAX_BUFFER_LEN] (not a bool, not a float)."""
    return _parse_int("buffer_len", value, 1, MAX_BUFFER_LEN)


def parse_strict(value: Any) -> bool:
    """True or False only: a string such as "no" is truthy in Python and would silently mean True."""
    if not isinstance(value, bool):
        raise ConfigError(f"strict must be True or False; got {value!r}")
    return value


def parse_layers(value: Any) -> tuple[str, ...] | None:
    """None (all layers), a name / regular expression, or an iterable of them -> a tuple."""
    if value is None:
        return None
    layers = (value,) if isinstance(value, str) else tuple(value)
    if not layers:
        raise ConfigError("layers must name at least one layer (or be None for all); got an empty list")
    for pattern in layers:
        if not isinstance(pattern, str):
            raise ConfigError(f"layers must be strings (names or regular expressions); got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"layers must be valid regular expressions; got {pattern!r} ({exc})") from None
    return layers


def config_dtype_name(config: dict[str, Any]) -> str | None:
    """"fp32" | "bf16" | "fp16" recorded in a config.json dict (dtype / torch_dtype), or None."""
    for source in (config, config.get("text_config") or {}):
        if not isinstance(source, dict):
            continue
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.lower() in DTYPE_ALIASES:
                return DTYPE_ALIASES[value.lower()]
    return None


def activation_dtype(config: dict[str, Any]) -> tuple[str, bool]:
    """(dtype name, assumed) of a model's activations, for buffer-size estimates.

    The dtype config.json records; when it records none, 16-bit ("bf16") is assumed and
    ``assumed`` is True, so that displays can say so.
    """
    name = config_dtype_name(config)
    return (name, False) if name else (StateDtype.BF16.value, True)


_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d+)?)")


def parse_device(value: Any) -> str:
    """"auto" | "cpu" | "cuda" | "cuda:N" | "mps" (or a torch.device); checks the spelling, not availability."""
    text = str(_plain(value)).strip().lower() if value is not None else "auto"
    if not _DEVICE.fullmatch(text):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps; got {value!r}")
    return text


def stack_relative_name(name: str) -> str:
    """A layer's name from its decoder stack on: "model.language_model.layers.3.linear_attn" -> "layers.3.linear_attn".

    The same layer has this name in every class of a family (``XModel``, ``XForCausalLM``,
    ``XForConditionalGeneration``), whose qualified names differ only in the prefix. Names
    without a list index are returned unchanged.
    """
    parts = name.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.isdigit():
            return ".".join(parts[i - 1:])
    return name


def block_layer_names(block: dict[str, Any]) -> list[str]:
    """The stack-relative names of the layers a config.json block records (any schema version)."""
    return [stack_relative_name(entry["name"]) for entry in block.get("layers") or []
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)]


@dataclass(frozen=True)
class ReplaySSMConfig:
    """How to rewrite a model's SSM layers.

    buffer_len: tokens buffered between state-checkpoint writes (L); 1 writes every step.
    state_dtype: state-checkpoint dtype, "fp32" | "bf16" | "fp16" | "fp8" (e4m3) | "int8", or None for
      the cache's (fp32). fp8 and int8 keep an fp32 scale per head-dim vector beside the checkpoint.
    state_rounding: "nearest" | "stochastic": how a checkpoint below fp32 is rounded when written
      (the prefill's final state and every flush). Stochastic rounding is unbiased; it is
      reproducible for a given ``state_seed`` and different at every flush.
    state_seed: the seed of stochastic rounding (mixed with the layer and the row).
    layers: names or regular expressions (full match) of the layers to rewrite; None = all.
      A name matches qualified ("model.layers.0.mixer") or from the decoder stack on ("layers.0.mixer").
    backend: "auto" | "triton" | "torch".
    strict: raise on a selected layer this version cannot rewrite (else skip and report it).
    cuda_graphs: run every decode step of ``generate()`` as a replayed CUDA graph (CUDA only;
        anything the graphs cannot serve falls back to the eager path with a log line).
    graph_max_len: with ``cuda_graphs``, the most cache positions (prompt + new tokens) one call may
        need; None sizes each pooled cache to the call, rounded up to a power of two (at least 64).
    """

    buffer_len: int = DEFAULT_BUFFER_LEN
    state_dtype: str | None = None
    state_rounding: str = StateRounding.NEAREST.value
    state_seed: int = 0
    layers: tuple[str, ...] | None = None
    backend: str = Backend.AUTO.value
    strict: bool = True
    cuda_graphs: bool = False
    graph_max_len: int | None = None
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self):
        object.__setattr__(self, "buffer_len", parse_buffer_len(self.buffer_len))
        object.__setattr__(self, "state_dtype", parse_state_dtype(self.state_dtype))
        object.__setattr__(self, "state_rounding", parse_state_rounding(self.state_rounding))
        object.__setattr__(self, "state_seed", parse_state_seed(self.state_seed))
        if self.state_rounding == StateRounding.STOCHASTIC.value and self.state_dtype in (None, "fp32"):
            raise ConfigError("state_rounding='stochastic' needs a state_dtype below fp32 (bf16, fp16, fp8, int8); "
                              f"got state_dtype={self.state_dtype or 'fp32'!r}")
        object.__setattr__(self, "layers", parse_layers(self.layers))
        object.__setattr__(self, "backend", parse_backend(self.backend))
        object.__setattr__(self, "strict", parse_strict(self.strict))
        if not isinstance(self.cuda_graphs, bool):
            raise ConfigError(f"cuda_graphs must be True or False; got {self.cuda_graphs!r}")
        if self.graph_max_len is not None and (isinstance(self.graph_max_len, bool)
                                               or not isinstance(self.graph_max_len, int) or self.graph_max_len < 2):
            raise ConfigError(f"graph_max_len must be an integer >= 2 or None; got {self.graph_max_len!r}")
        if isinstance(self.schema_version, bool) or not isinstance(self.schema_version, int) \
                or self.schema_version < 1:
            raise ConfigError(f"schema_version must be a positive integer; got {self.schema_version!r}")
        if self.schema_version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"this replayssm understands schema version {SCHEMA_VERSION}, but the configuration has version "
                f"{self.schema_version}",
                hint="upgrade replayssm to read this checkpoint's replayssm block",
            )

    @property
    def torch_state_dtype(self):
        """The state checkpoint's torch dtype, or None (keep the cache's)."""
        return StateDtype(self.state_dtype).torch_dtype if self.state_dtype else None

    def selects(self, layer_name: str) -> bool:
        if self.layers is None:
            return True
        names = {layer_name, stack_relative_name(layer_name)}
        return any(n == p or re.fullmatch(p, n) for p in self.layers for n in names)

    def to_block(self, rewritten: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """The config.json block: settings plus the rewritten layers (name, kind).

        Names are stored from the decoder stack on, so that the block applies to every class
        of the family built from the same config (base model, causal LM, composite model).
        """
        from . import __version__

        layers = [{**entry, "name": stack_relative_name(entry["name"])} for entry in rewritten]
        return {
            "schema_version": SCHEMA_VERSION,
            "package_version": __version__,
            "buffer_len": self.buffer_len,
            "state_dtype": self.state_dtype or StateDtype.FP32.value,
            "state_rounding": self.state_rounding,
            "state_seed": self.state_seed,
            "backend": self.backend,
            "cuda_graphs": self.cuda_graphs,
            "graph_max_len": self.graph_max_len,
            "layers": layers,
        }

    @classmethod
    def from_block(cls, block: Any) -> "ReplaySSMConfig":
        """Read a config.json ``replayssm`` block (refusing newer schema versions; reading older ones)."""
        if not isinstance(block, dict):
            raise ConfigError(f"the replayssm block in config.json must be an object; got {type(block).__name__}")
        version = block.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(f"the replayssm block has no integer schema_version; got {version!r}")
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"config.json's replayssm block has schema version {version}; this replayssm "
                f"understands up to {SCHEMA_VERSION}",
                hint="upgrade replayssm (pip install -U replayssm) to load this checkpoint",
            )
        names = block_layer_names(block)
        return cls(
            buffer_len=block.get("buffer_len", DEFAULT_BUFFER_LEN),
            state_dtype=block.get("state_dtype"),
            state_rounding=block.get("state_rounding", StateRounding.NEAREST.value),
            state_seed=block.get("state_seed", 0),
            layers=tuple(re.escape(n) for n in names) or None,
            backend=block.get("backend", Backend.AUTO.value),
            cuda_graphs=block.get("cuda_graphs", False),
            graph_max_len=block.get("graph_max_len"),
            strict=True,
            schema_version=version,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
