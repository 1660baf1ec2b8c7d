"""Programmatic dependent launches for the decode step's short kernels (sm_90 and newer).

A batch-1 decode step in a CUDA graph is some 300-600 launches of a few microseconds each; between two
of them the GPU drains one grid and ramps up the next. A launch made with ``launch_options(device)``
may be scheduled while the launch before it is still running, once every program of that one has
started or finished; its programs begin with ``start_dependent(PDL)``: let the next launch do the same,
then wait until the launch before has completed and its writes are visible. The small-batch GEMV instead
reads its first weight tile before the wait (weights are written by nothing in the step), so that the
weight stream starts under the previous launch's tail. Nothing else is read, and nothing written,
before the wait; a launch made without these options waits for the one before as usual.
Why: ``examples/benchmarks/TUNING.md`` (programmatic dependent launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import dependent_launch_supported

try:  # grid dependency control, Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except Exception:  # pragma: no cover - older Triton: dependent_launch_supported() is False
    gdc_launch_dependents = gdc_wait = None

__all__ = ["dependent", "gdc_launch_dependents", "gdc_wait", "launch_options", "start_dependent"]


def dependent(device: torch.device) -> bool:
    """Whether launches on ``device`` are made as programmatic dependents (the kernels' ``PDL``)."""
    return device.type == "cuda" and dependent_launch_supported("cuda", device.index)


def launch_options(pdl: bool) -> dict:
    """The launch keywords of a kernel launched as a programmatic dependent (``pdl``) or not."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def start_dependent(PDL: tl.constexpr):
    """A dependent launch's first step: the next launch may be scheduled now; wait for the one before."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
