"""What every command shares: the two consoles, option parsing, JSON output, quiet transformers."""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from typing import Any, Callable

import typer
from rich.console import Console

#: results (tables, check lines, JSON) go to stdout; progress bars and errors to stderr
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def option_parser(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A typer callback that checks an option with the library's own parser (``replayssm.config``),
    so that the CLI and ``replayssm.patch`` / ``convert`` accept exactly the same spellings."""
    from replayssm.errors import ConfigError

    def callback(value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None

    return callback


def choices(enum: type[Enum], skip: Enum | None = None) -> str:
    """"[fp32|bf16|fp16]": the metavar of an option that takes an enum's values (but ``skip``)."""
    return "[" + "|".join(m.value for m in enum if m is not skip) + "]"


def print_json(obj: Any) -> None:
    """Exactly one JSON document on stdout (plain text: no colour, no wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def quiet_environment() -> None:
    """Environment for tidy CLI output; set before transformers / huggingface_hub are imported.

    Works offline unless the user set HF_HUB_OFFLINE themselves; silences transformers'
    warnings and progress bars unless TRANSFORMERS_VERBOSITY is set.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quiet_transformers() -> None:
    """Errors only, no progress bars (unless asked for), for a transformers imported before
    ``quiet_environment`` ran. Never imports transformers itself: an import costs seconds, and a
    later one reads the environment ``quiet_environment`` set."""
    if "transformers" not in sys.modules:
        return
    import transformers
    from transformers.utils import logging as hf_logging

    if os.environ.get("TRANSFORMERS_VERBOSITY", "error") == "error":
        transformers.logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
