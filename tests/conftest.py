"""Shared test set-up.

* Without CUDA, ``TRITON_INTERPRET=1`` is set before anything imports Triton, so the
  Triton kernels run on CPU tensors through the interpreter (tiny fp32 shapes only).
* Tests marked ``gpu`` are skipped (and reported as skipped) when CUDA is absent; run
  them with ``bash scripts/gpu_check.sh`` on a GPU machine.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the tiny models are faster on one thread, and CI has two cores shared with the interpreter
torch.set_num_threads(1)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def fp32_matmuls():
    """TF32 matmuls off for the test (fp32 references), the process-wide flag restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before
