"""Helpers of the CLI tests (plain functions; the fixtures are in conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path


def cli_command() -> list[str]:
    """The installed console script of this Python (else ``python -m replayssm.cli``)."""
    beside = Path(sys.executable).parent / ("replayssm.exe" if os.name == "nt" else "replayssm")
    if beside.is_file():
        return [str(beside)]
    exe = shutil.which("replayssm")
    if exe and Path(exe).resolve().parent == Path(sys.executable).resolve().parent:
        return [exe]
    return [sys.executable, "-m", "replayssm.cli"]


def cli_env(tiny_cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REPLAYSSM_CACHE=str(tiny_cache),
        OMP_NUM_THREADS="1",
        COLUMNS="200",
        HF_HUB_OFFLINE="1",
        PYTHONIOENCODING="utf-8",
        NO_COLOR="1",
    )
    for key in ("REPLAYSSM_DEBUG", "FORCE_COLOR"):
        env.pop(key, None)
    env.update(extra)
    return env


def tree_digest(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``root`` (plus mode bits), for before/after checks."""
    digest = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            h = hashlib.sha256(path.read_bytes()).hexdigest()
            digest[str(path.relative_to(root))] = f"{h}:{oct(path.stat().st_mode)}"
    return digest


def file_sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def leftovers(parent: Path) -> list[str]:
    """Entries under ``parent`` that a failed convert might have left (temporary dirs included)."""
    return sorted(p.name for p in Path(parent).iterdir()) if Path(parent).exists() else []


def parse_json(stdout: str) -> dict:
    """stdout must be exactly one JSON object."""
    return json.loads(stdout)


def one_error(stderr: str) -> tuple[str, str | None]:
    """The ``error:`` line and the ``hint:`` line of stderr, asserting there is no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    hints = [ln for ln in lines if ln.startswith("hint: ")]
    assert len(errors) == 1, stderr
    return errors[0], hints[0] if hints else None


# --------------------------------------------------------------------------- failure injection
HOOKED_CLI = Path(__file__).with_name("hooked_cli.py")


def hooked_cli_command(mode: str) -> list[str]:
    """The CLI run by ``hooked_cli.py``: ``mode`` "fail" or "pause" after the first weight file is copied."""
    return [sys.executable, str(HOOKED_CLI), mode]


def fail_after_first_shard(monkeypatch) -> None:
    """In-process: convert raises RuntimeError once the first weight file is copied."""
    import replayssm.conversion as conversion

    real = conversion.copy_file

    def copy_then_fail(src, dst, *, expected_size=None, **kwargs):
        copied = real(src, dst, expected_size=expected_size, **kwargs)
        if expected_size is not None:  # a weight file
            raise RuntimeError("injected failure after the first weight file")
        return copied

    monkeypatch.setattr(conversion, "copy_file", copy_then_fail)


def perturb_logits(monkeypatch, which: str) -> None:
    """Validation sees the last step's logits of the ReplaySSM decode (``which="replay"``) or of the
    stock reference decode (``"stock"``, a stock path noisier than ReplaySSM) pushed off."""
    import replayssm
    import replayssm.validate as validate
    import torch

    real = validate._generate

    def generate(model, input_ids, new_tokens, pad_id, force=None):
        tokens, logits = real(model, input_ids, new_tokens, pad_id, force=force)
        if which == "replay" and force is not None and replayssm.is_patched(model):
            logits[:, -1, :] += 1.0 + logits.abs().max()
        elif which == "stock" and force is None:
            logits = logits.clone()
            logits[:, -1, :] += torch.linspace(0, 1.0 + float(logits.abs().max()), logits.shape[-1],
                                               device=logits.device)
        return tokens, logits

    monkeypatch.setattr(validate, "_generate", generate)
