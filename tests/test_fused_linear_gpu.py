"""Patched models on CUDA with the decode linears on the small-batch GEMV."""

import pytest
import torch

import replayssm
from replayssm.patches import fused_linear

from helpers import assert_close_until_near_tie, generate, left_padded_batch, tiny

pytestmark = pytest.mark.gpu


def _count_kernel_calls(monkeypatch):
    """x's shape and the weights read, per launch: one weight, a group sharing x, or a gated pair."""
    calls = []
    single, group, gated = (fused_linear.linear_small_batch_triton, fused_linear.linear_small_batch_group_triton,
                            fused_linear.linear_small_batch_gated_triton)

    def counted(x, weight, bias=None):
        calls.append((x.shape, (weight,)))
        return single(x, weight, bias)

    def counted_group(x, weights, biases=None):
        calls.append((x.shape, tuple(weights)))
        return group(x, weights, biases)

    def counted_gated(x, gate_weight, up_weight, activation):
        calls.append((x.shape, (gate_weight, up_weight)))
        return gated(x, gate_weight, up_weight, activation=activation)

    monkeypatch.setattr(fused_linear, "linear_small_batch_triton", counted)
    monkeypatch.setattr(fused_linear, "linear_small_batch_group_triton", counted_group)
    monkeypatch.setattr(fused_linear, "linear_small_batch_gated_triton", counted_gated)
    return calls


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "kimi_linear"])
def test_bf16_batch1_graphs_run_the_gemv_and_match_eager(family, monkeypatch):
    """bf16 greedy decoding of one row, patched: the captured step runs the GEMV on every linear (the
    projections that share an input, and a gated MLP's gate and up, in one launch), eager steps keep
    cuBLAS, and the two agree (tokens up to a near-tie that a rounding may flip)."""
    model = tiny(family, torch.bfloat16).cuda()
    ids, mask = left_padded_batch(seed=4, batch=1, device="cuda")
    kw = dict(max_new_tokens=24, min_new_tokens=24)
    calls = _count_kernel_calls(monkeypatch)
    try:
        replayssm.patch(model, buffer_len=4)
        eager = generate(model, ids, mask, **kw)
        assert calls == []  # eager calls: cuBLAS (the Triton launch costs more host time)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        graphs = generate(model, ids, mask, **kw)  # (its cache is handed back: the pool keeps no slot)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        read = [w for _, weights in calls for w in weights]
        assert len({id(w) for w in read}) >= len(linears) - 1
        assert all(shape.numel() // shape[-1] == 1 for shape, _ in calls)
        assert (len(calls) < len(read)) == (family != "nemotron_h")  # grouped launches where inputs are shared
        assert_close_until_near_tie(graphs, eager, ids.shape[1], tol=0.15)
    finally:
        replayssm.unpatch(model)
        model.cpu()


def test_fp32_model_and_larger_batches_keep_cublas(monkeypatch):
    """fp32 weights never take the kernel (an fp32 model's tokens stay the stock ones); inside a capture
    a one-row bf16 call does, two rows or an eager call do not."""
    calls = _count_kernel_calls(monkeypatch)
    model = tiny("qwen3_5").cuda()
    ids, mask = left_padded_batch(seed=1, batch=1, device="cuda")
    try:
        stock = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        out = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
        assert calls == [] and torch.equal(out.sequences, stock.sequences)
    finally:
        replayssm.unpatch(model)
        model.cpu()
    g = torch.Generator(device="cuda").manual_seed(0)  # the same problem whatever ran before on this worker
    lin = torch.nn.Linear(64, 48).to("cuda", torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, device="cuda", generator=g) / 8)
        lin.bias.copy_(torch.randn(48, device="cuda", generator=g))
    fused_linear.fuse_decode_linears(lin)
    with torch.no_grad():
        for rows in (1, 2):
            x = torch.randn(rows, 64, device="cuda", dtype=torch.bfloat16, generator=g)
            calls.clear()
            assert lin(x).shape == (rows, 48) and calls == []  # eager
            lin(x)  # warm-up (compile) outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = lin(x)
            graph.replay()
            torch.cuda.synchronize()
            assert len(calls) == (rows == 1)
            torch.testing.assert_close(y, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=2 ** -7,
                                       atol=1e-3)
