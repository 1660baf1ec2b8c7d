"""What ``replayssm bench`` times: its settings (``BenchSettings``), the variants, and the parsing and
checks of the command-line options, each failure a ``BenchError`` (one line, no torch import).
The timing itself: ``bench.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .config import ModelDtype, StateDtype
from .errors import ConfigError

VARIANTS = ("stock", "eager", "graphs", "graphs-per-step")
GRAPH_VARIANTS = ("graphs", "graphs-per-step")
DTYPES = tuple(m.value for m in ModelDtype if m is not ModelDtype.AUTO)
STATE_DTYPES = tuple(m.value for m in StateDtype)
DEFAULT_BATCH_SIZES = (1, 8, 64, 256)
#: what ``--smoke`` changes (each unless given): a tiny CPU run of every code path
SMOKE = dict(batch_sizes=(1, 2), new_tokens=24, prompt_len=8, dtype="fp32", buffer_len=4, repeats=3,
             device="cpu")


class BenchError(ConfigError):
    """An option of the benchmark has an invalid value."""


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,8,64"`` -> (1, 8, 64): positive integers, no repeats, in the order given."""
    parts = [p.strip() for p in str(text).split(",")]
    if not text or not all(parts):
        raise BenchError(f"--batch-sizes must be a comma-separated list of positive integers; got {text!r}")
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        raise BenchError(f"--batch-sizes must be a comma-separated list of positive integers; got {text!r}") from None
    if min(sizes) < 1:
        raise BenchError(f"--batch-sizes must be positive; got {text!r}")
    if len(set(sizes)) != len(sizes):
        raise BenchError(f"--batch-sizes lists a size twice: {text!r}")
    return sizes


def parse_variants(text: str) -> tuple[str, ...]:
    """``"stock,graphs"`` -> ("stock", "graphs"), checked against VARIANTS, in VARIANTS' order."""
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise BenchError(f"--variants: unknown {', '.join(map(repr, unknown)) or '(empty list)'}; "
                         f"expected some of: {', '.join(VARIANTS)}")
    return tuple(v for v in VARIANTS if v in names)


@dataclass(frozen=True)
class BenchSettings:
    """What to time. ``first_tokens`` (n0) is the shorter of the two timed lengths."""

    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    new_tokens: int = 40
    prompt_len: int = 16
    dtype: str = "bf16"
    state_dtype: str = "fp32"
    buffer_len: int = 16
    variants: tuple[str, ...] = VARIANTS
    repeats: int = 3
    device: str = "auto"

    def __post_init__(self):
        for name, low in (("new_tokens", 2), ("prompt_len", 1), ("repeats", 1), ("buffer_len", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BenchError(f"--{name.replace('_', '-')} must be an integer of at least {low}; got {value!r}")
        if self.buffer_len > 256:
            raise BenchError(f"--buffer-len must be in [1, 256]; got {self.buffer_len}")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                       for b in self.batch_sizes):
            raise BenchError(f"batch sizes must be positive integers; got {self.batch_sizes!r}")
        if self.dtype not in DTYPES:
            raise BenchError(f"--dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.state_dtype not in STATE_DTYPES:
            raise BenchError(f"--state-dtype must be one of {', '.join(STATE_DTYPES)}; got {self.state_dtype!r}")
        if not self.variants or any(v not in VARIANTS for v in self.variants):
            raise BenchError(f"variants must be some of {', '.join(VARIANTS)}; got {self.variants!r}")
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "variants", tuple(v for v in VARIANTS if v in self.variants))

    @property
    def first_tokens(self) -> int:
        """n0: the new tokens of the shorter timed ``generate`` (a fifth of N, at least 1)."""
        return max(1, self.new_tokens // 5)

    @property
    def timed_steps(self) -> int:
        return self.new_tokens - self.first_tokens

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(batch_sizes=list(self.batch_sizes), variants=list(self.variants), first_tokens=self.first_tokens)
        return d

    def command_line(self, model: str | None, preset: str | None) -> str:
        """The ``replayssm bench`` command that repeats this run, every setting spelled out."""
        import shlex

        head = ["replayssm", "bench"] + ([model] if model else ["--preset", preset or "?"])
        opts = ["--batch-sizes", ",".join(map(str, self.batch_sizes)), "--new-tokens", str(self.new_tokens),
                "--prompt-len", str(self.prompt_len), "--dtype", self.dtype, "--state-dtype", self.state_dtype,
                "--buffer-len", str(self.buffer_len), "--variants", ",".join(self.variants),
                "--repeats", str(self.repeats), "--device", self.device]
        return shlex.join(head + opts)
