"""``replayssm env``: versions, GPUs, and whether the Triton kernels can run here."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

import typer

from .common import out, print_json


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _probe_triton(device) -> tuple[bool, str]:
    """Compile and run a one-block Triton kernel on ``device``."""
    try:
        import torch
        import triton
        import triton.language as tl
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run"
        return False, f"triton does not import ({type(exc).__name__}: {exc})"

    @triton.jit
    def _add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    try:
        x = torch.zeros(8, device=device)
        _add_one[(1,)](x, 8, BLOCK=8)
        ok = bool((x == 1).all())
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return False, f"a test kernel failed on {device} ({type(exc).__name__}: {first})"
    return ok, f"a test kernel compiled and ran on {device}" if ok else "a test kernel gave a wrong result"


def gather(probe: bool = True) -> dict[str, Any]:
    import torch

    from replayssm import __version__
    from replayssm.kernels.backend import triton_available, triton_interpreter_on

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                         "capability": f"{p.major}{p.minor}"})
    if not triton_available():
        triton_kernels = {"can_run": False, "detail": "the triton package does not import", "probed": False}
    elif gpus:
        if probe:
            ok, detail = _probe_triton(torch.device("cuda", 0))
        else:
            ok, detail = True, "CUDA GPU and triton present (not probed)"
        triton_kernels = {"can_run": ok, "detail": detail, "probed": probe}
    elif triton_interpreter_on():
        triton_kernels = {"can_run": True, "detail": "no GPU; TRITON_INTERPRET=1 runs them on CPU (slow, for tests)",
                          "probed": False}
    else:
        triton_kernels = {"can_run": False, "detail": "no CUDA GPU; the PyTorch reference path is used",
                          "probed": False}
    return {
        "replayssm": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "safetensors": _version("safetensors"),
        "huggingface_hub": _version("huggingface_hub"),
        "accelerate": _version("accelerate"),
        "typer": _version("typer"),
        "rich": _version("rich"),
        "gpus": gpus,
        "triton_kernels": triton_kernels,
        "backend_auto": "triton" if gpus and triton_kernels["can_run"] else "torch",
    }


def env_command(
    probe: bool = typer.Option(True, "--probe/--no-probe", help="Compile and run a test Triton kernel on the GPU."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> int:
    """Show versions (python, torch, triton, transformers, ...), GPUs, and whether the Triton kernels can run.

    [bold]Examples[/bold]

      replayssm env

      replayssm env --json > env.json
    """
    from .render import env_table

    info = gather(probe=probe)
    if json_output:
        print_json({"ok": True, **info})
    else:
        out.print(env_table(info))
    return 0
