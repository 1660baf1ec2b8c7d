"""What every kernel benchmark shares: its command-line errors (``UsageError``) and device check
(``cuda_or_smoke``), and what it writes: the run's metadata (date, GPU, versions, command) and its rows
as ``NAME.json`` and ``NAME.md`` in the output folder, the table also printed."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch


class UsageError(Exception):
    """Bad command-line input (one line, exit status 2)."""


def cuda_or_smoke(smoke: bool) -> None:
    """A CUDA device, or else ``--smoke``: the Triton kernels then run under the interpreter
    (``TRITON_INTERPRET=1``, set here: call it before anything imports triton). UsageError otherwise."""
    if not torch.cuda.is_available():
        if not smoke:
            raise UsageError("needs a CUDA device (--smoke runs tiny shapes anywhere)")
        os.environ.setdefault("TRITON_INTERPRET", "1")


def run_meta(script: str, argv: list[str], device: torch.device, **extra) -> dict:
    """Date, GPU, torch / Triton versions and the command line, then ``extra``."""
    import triton  # (after a smoke run has set TRITON_INTERPRET)

    return dict(date=datetime.date.today().isoformat(),
                gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke run)",
                torch=torch.__version__, triton=triton.__version__, **extra,
                command=f"python examples/benchmarks/{script} " + " ".join(argv))


def write_run(out_dir: str, name: str, meta: dict, rows: list, markdown) -> None:
    """``out_dir/name.json`` (meta and rows) and ``out_dir/name.md`` (``markdown(meta, rows)``), printed too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    table = markdown(meta, rows)
    (out / f"{name}.md").write_text(table)
    print(table)
