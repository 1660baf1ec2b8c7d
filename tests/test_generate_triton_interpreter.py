"""generate() with backend="triton" on CPU tensors, through the Triton interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 when there is no GPU, so the same Triton
kernels that run on CUDA run here (tiny fp32 shapes; slow, hence few tokens).
"""

import os

import pytest
import torch

import replayssm.kernels.delta as delta_kernels
import replayssm.kernels.mamba2 as mamba2_kernels

from helpers import generate, generate_patched, left_padded_batch, max_logit_diff, tiny

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU interpreter run (on a GPU the CUDA tests cover this)",
)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_triton_backend_matches_stock(family, monkeypatch):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=1, batch=2)
    ref = generate(model, ids, mask, max_new_tokens=10, min_new_tokens=10)

    def no_reference(*args, **kwargs):
        raise AssertionError("the PyTorch reference ran instead of the Triton kernel")

    monkeypatch.setattr(mamba2_kernels, "mamba2_replay_decode_reference", no_reference)
    monkeypatch.setattr(delta_kernels, "delta_replay_decode_reference", no_reference)
    out = generate_patched(model, ids, mask, dict(buffer_len=4, backend="triton"), max_new_tokens=10,
                           min_new_tokens=10)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4
