"""What every kernel benchmark writes: the run's metadata (date, GPU, versions, command) and its rows as
``NAME.json`` and ``NAME.md`` in the output folder, the table also printed."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch


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
