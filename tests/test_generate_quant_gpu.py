"""Low-precision checkpoints in patched models on CUDA: the Triton replay kernels against the
PyTorch replay step, teacher-forced, on every rewritable tiny family (fp32 weights, so the only
differences are the two kernels' summation orders and the values that land on a rounding boundary)."""

import pytest
import torch

import replayssm

from helpers import REWRITABLE_FAMILIES, forced_logits, generate, left_padded_batch, tiny

pytestmark = pytest.mark.gpu

STEPS = 24  # with L = 4: five flushes
OPTIONS = [dict(state_dtype="int8"), dict(state_dtype="int8", state_rounding="stochastic"),
           dict(state_dtype="fp8"), dict(state_dtype="fp8", state_rounding="stochastic"),
           dict(state_dtype="bf16", state_rounding="stochastic")]


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_triton_quantized_checkpoints_match_the_pytorch_step(family):
    model = tiny(family).to("cuda")
    try:
        ids, mask = left_padded_batch(seed=4, device="cuda")
        seq = generate(model, ids, mask, max_new_tokens=STEPS, min_new_tokens=STEPS).sequences
        ref = forced_logits(model, ids, mask, seq)
        std = float(ref.std())
        for opts in OPTIONS:
            got = {}
            for backend in ("torch", "triton"):
                replayssm.patch(model, buffer_len=4, backend=backend, **opts)
                try:
                    got[backend] = forced_logits(model, ids, mask, seq)
                finally:
                    replayssm.unpatch(model)
            assert torch.isfinite(got["triton"]).all(), opts
            diff = (got["triton"] - got["torch"]).abs() / std
            # a stored value one quantum apart moves a logit by far less than a broken scale or read would
            assert float(diff.mean()) < 2e-3 and float(diff.max()) < 0.05, (opts, float(diff.mean()), float(diff.max()))
    finally:
        model.to("cpu")
