"""Patched models on CUDA with the decode linears on the small-batch GEMV."""

import pytest
import torch

import replayssm
from replayssm.kernels.linear import M_MAX
from replayssm.patches import fused_linear
from replayssm.patches.fused_linear import unfuse_decode_linears

from helpers import assert_close_until_near_tie, generate, left_padded_batch, max_logit_diff, tiny

pytestmark = pytest.mark.gpu


def _count_kernel_calls(monkeypatch):
    calls = []
    kernel = fused_linear.linear_small_batch_triton

    def counted(x, weight, bias=None):
        calls.append(x.shape)
        return kernel(x, weight, bias)

    monkeypatch.setattr(fused_linear, "linear_small_batch_triton", counted)
    return calls


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "kimi_linear"])
def test_bf16_generate_in_graphs_equals_eager_without_the_gemv(family, monkeypatch):
    """bf16 greedy decoding, patched: CUDA graphs with the GEMV give the eager patched path's logits, and
    the tokens of the eager patched path with the GEMV off (up to a near-tie that a rounding may flip)."""
    model = tiny(family, torch.bfloat16).cuda()
    ids, mask = left_padded_batch(seed=4, batch=3, device="cuda")
    kw = dict(max_new_tokens=24, min_new_tokens=24)
    calls = _count_kernel_calls(monkeypatch)
    try:
        replayssm.patch(model, buffer_len=4)
        eager = generate(model, ids, mask, **kw)
        assert calls and all(shape.numel() // shape[-1] <= 3 for shape in calls)  # decode steps: 3 rows
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        graphs = generate(model, ids, mask, **kw)
        assert replayssm.graph_report(model)[0]["captured"]
        # (the graphs attend over a pooled cache's masked tail: bf16 logits may move in the last place)
        assert max_logit_diff(graphs, eager) < 1e-2 or torch.equal(graphs.sequences, eager.sequences)
        replayssm.patch(model, buffer_len=4)  # eager again, and the speedup off: cuBLAS
        unfuse_decode_linears(model)
        calls.clear()
        without = generate(model, ids, mask, **kw)
        assert calls == []
        assert_close_until_near_tie(graphs, without, ids.shape[1], tol=0.15)
    finally:
        replayssm.unpatch(model)
        model.cpu()


def test_fp32_model_and_large_batches_keep_cublas(monkeypatch):
    """fp32 weights never take the kernel (an fp32 model's tokens stay the stock ones); neither do
    more than M_MAX rows; 16-bit weights up to M_MAX rows do."""
    calls = _count_kernel_calls(monkeypatch)
    model = tiny("qwen3_5").cuda()
    ids, mask = left_padded_batch(seed=1, batch=2, device="cuda")
    try:
        stock = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
        replayssm.patch(model, buffer_len=4)
        out = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
        assert calls == [] and torch.equal(out.sequences, stock.sequences)
    finally:
        replayssm.unpatch(model)
        model.cpu()
    lin = torch.nn.Linear(64, 48).to("cuda", torch.bfloat16)
    fused_linear.fuse_decode_linears(lin)
    with torch.no_grad():
        for rows, used in ((1, True), (M_MAX, True), (M_MAX + 1, False)):
            calls.clear()
            x = torch.randn(rows, 64, device="cuda", dtype=torch.bfloat16)
            y = lin(x)
            assert bool(calls) == used and y.shape == (rows, 48)
            torch.testing.assert_close(y, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=2 ** -7,
                                       atol=1e-3)
