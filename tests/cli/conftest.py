"""Fixtures of the CLI tests: a session cache of tiny checkpoints and a console-script runner.

Every subprocess gets ``REPLAYSSM_CACHE`` pointing at the session's cache (the tiny
checkpoints are written once, in-process, before any subprocess needs them), one CPU
thread (tiny models gain nothing from more, and threads fight on a busy CI box), a wide
terminal for readable tables, and offline Hugging Face settings.

Each console-script start imports torch and transformers' modelling code (several
seconds), so modules start their independent subprocesses together through
``cli_batch`` (as many at a time as there are CPU cores) and their tests then read the
results; the tests themselves stay one check each.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cli_helpers import cli_command, cli_env


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replayssm-cache")
    previous = os.environ.get("REPLAYSSM_CACHE")
    os.environ["REPLAYSSM_CACHE"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("REPLAYSSM_CACHE", None)
    else:
        os.environ["REPLAYSSM_CACHE"] = previous


@pytest.fixture(scope="session")
def tiny_dir(tiny_cache):
    """tiny_dir("bamba") -> the materialised checkpoint directory of tiny:bamba."""
    from replayssm.tiny import materialize_tiny

    def make(family: str) -> Path:
        return materialize_tiny(f"tiny:{family}")

    return make


@pytest.fixture(scope="session")
def run_cli(tiny_cache):
    """run_cli("convert", "tiny:bamba", out, env={...}) -> CompletedProcess (text, not checked).

    ``command`` replaces the console script (e.g. ``hooked_cli_command("fail")``)."""

    def run(*args: str | os.PathLike, env: dict[str, str] | None = None, timeout: float = 300,
            command: list[str] | None = None):
        return subprocess.run(
            (command or cli_command()) + [str(a) for a in args],
            capture_output=True, text=True, encoding="utf-8", timeout=timeout,
            env=cli_env(tiny_cache, **(env or {})),
        )

    return run


@pytest.fixture(scope="session")
def cli_batch(run_cli):
    """cli_batch(*args, env=...) -> Future[CompletedProcess]: start the console script in the background."""
    workers = max(2, min(4, os.cpu_count() or 2))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replayssm-cli")

    def submit(*args, env: dict[str, str] | None = None, command: list[str] | None = None) -> Future:
        return pool.submit(run_cli, *args, env=env, command=command)

    yield submit
    pool.shutdown(wait=True, cancel_futures=True)
