"""The small-batch linear kernel on the GPU: 16-bit real shapes within one rounding of the fp32 result
(the bound an fp32-accumulating GEMM meets), every launch form, determinism, and CUDA-graph capture."""

import pytest
import torch

from replayssm.kernels.linear import (ACTIVATIONS, LaunchConfig, default_config, linear_small_batch,
                                      linear_small_batch_gated, linear_small_batch_group)

from test_linear import HALF_ULP, PRESET_SHAPES, _gated_bound, assert_within_rounding

pytestmark = pytest.mark.gpu


def _data(N, K, M, dtype, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, 1, K, generator=g, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
    b = torch.randn(N, generator=g, device="cuda").to(dtype) if bias else None
    return x, w, b


def _captured(fn):
    """(graph, fn's outputs in it): fn run once on a side stream (Triton compiles there), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    return graph, outs


@pytest.mark.parametrize("dtype,batches", [(torch.bfloat16, (1, 2)), (torch.float16, (1, 2))])
def test_preset_shapes_within_rounding(dtype, batches):
    for i, (N, K) in enumerate(PRESET_SHAPES):
        for M in batches:
            x, w, b = _data(N, K, M, dtype, bias=i % 2 == 1, seed=i)
            y = linear_small_batch(x, w, b, backend="triton")
            assert_within_rounding(y, x, w, b)
            assert torch.equal(y, linear_small_batch(x, w, b, backend="triton")), "not deterministic"


VARIANTS = [  # (N, K, M, config): every form of launch on real sizes, masked K tails included
    (2560, 9216, 1, LaunchConfig(block_n=4, block_k=512, num_warps=4, num_stages=3, split_k=4)),
    (2560, 9216, 2, LaunchConfig(block_n=16, block_k=256, num_warps=8, num_stages=4, split_k=4)),
    (2304, 9216, 2, LaunchConfig(block_n=8, block_k=128, num_warps=4, num_stages=2)),
    (576, 2304, 2, LaunchConfig(block_n=2, block_k=512, num_warps=4, num_stages=1)),  # K tail of 256
    (4096, 2304, 1, LaunchConfig(block_n=4, block_k=512, num_warps=2, num_stages=3, split_k=3)),  # split, K tail
    (1000, 1000, 2, LaunchConfig(block_n=1, block_k=256, num_warps=1, num_stages=2, split_k=2)),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("N,K,M,cfg", VARIANTS)
def test_launch_variants(N, K, M, cfg, bias):
    x, w, b = _data(N, K, M, torch.bfloat16, bias)
    y = linear_small_batch(x, w, b, backend="triton", config=cfg)
    assert_within_rounding(y, x, w, b)
    assert torch.equal(y, linear_small_batch(x, w, b, backend="triton", config=cfg))


@pytest.mark.parametrize("N,K,M", [(9216, 2560, 1), (256, 16384, 1), (32, 2560, 2), (248320, 2560, 2)])
def test_cuda_graph_capture_replays_the_eager_result(N, K, M):
    """Three calls captured (split launches included: (256, 16384) at M = 1 splits K); after new inputs
    are copied in, a replay gives the eager call's result bit for bit."""
    x, w, b = _data(N, K, M, torch.bfloat16, bias=True)
    graph, outs = _captured(lambda: [linear_small_batch(x, w, b, backend="triton") for _ in range(3)])
    if N == 256:
        assert default_config(N, K, M, 2, torch.cuda.get_device_properties(0).multi_processor_count).split_k > 1
    for seed in (1, 2):
        x.copy_(_data(N, K, M, torch.bfloat16, bias=False, seed=seed)[0])
        graph.replay()
        want = linear_small_batch(x, w, b, backend="triton")
        assert all(torch.equal(o, want) for o in outs)


#: one Qwen3.5-4B-like layer's projections sharing x (K = 2560): q with its gate, k, v and two 32-wide ones
GROUP_WIDTHS = (8192, 4096, 32, 32)


def _group_data(M, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, 1, 2560, generator=g, device="cuda").bfloat16()
    ws = [(torch.randn(n, 2560, generator=g, device="cuda") / 2560 ** 0.5).bfloat16() for n in GROUP_WIDTHS]
    bs = [torch.randn(n, generator=g, device="cuda").bfloat16() for n in GROUP_WIDTHS] if bias else None
    return x, ws, bs


@pytest.mark.parametrize("cfg", [None, LaunchConfig(block_n=4, block_k=512, num_warps=4, split_k=3)])
@pytest.mark.parametrize("M,bias", [(1, False), (1, True), (2, True)])
def test_group_within_rounding(M, bias, cfg):
    """One launch over four weights (two of 32 columns) within one rounding of the fp32 result on the
    concatenation, split (5 tiles of 512 over 3 programs) or not; deterministic."""
    x, ws, bs = _group_data(M, bias)
    y = linear_small_batch_group(x, ws, bs, backend="triton", config=cfg)
    assert y.shape == (M, 1, sum(GROUP_WIDTHS))
    assert_within_rounding(y, x, torch.cat(ws), None if bs is None else torch.cat(bs))
    assert torch.equal(y, linear_small_batch_group(x, ws, bs, backend="triton", config=cfg))


def _gated_data(M, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, 1, 2560, generator=g, device="cuda").bfloat16()
    gate, up = ((torch.randn(9216, 2560, generator=g, device="cuda") / 2560 ** 0.5).bfloat16() for _ in range(2))
    return x, gate, up


@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_gated_within_rounding(activation, M):
    """act(x gate^T) * (x up^T) at (9216, 2560) within one rounding of the fp32 result (plus fp32 error);
    deterministic."""
    x, gate, up = _gated_data(M)
    y = linear_small_batch_gated(x, gate, up, activation=activation, backend="triton")
    want, bound = _gated_bound(x, gate, up, activation)
    assert y.shape == (M, 1, 9216) and y.dtype == torch.bfloat16
    excess = ((y.double() - want).abs() - HALF_ULP[torch.bfloat16] * want.abs() - bound).max().item()
    assert excess <= 0, f"largest error minus bound: {excess}"
    assert torch.equal(y, linear_small_batch_gated(x, gate, up, activation=activation, backend="triton"))


def test_group_and_gated_cuda_graph_capture_replays_the_eager_result():
    """A grouped call (split and not) and a gated one captured; after new inputs are copied in, a replay gives
    the eager calls' results bit for bit."""
    x, ws, bs = _group_data(1, bias=True)
    _, gate, up = _gated_data(1)
    split = LaunchConfig(block_n=4, block_k=512, num_warps=4, split_k=3)

    def calls():
        return (linear_small_batch_group(x, ws, bs, backend="triton"),
                linear_small_batch_group(x, ws[2:], None, backend="triton", config=split),
                linear_small_batch_gated(x, gate, up, backend="triton"))

    graph, outs = _captured(calls)
    for seed in (1, 2):
        x.copy_(_group_data(1, bias=False, seed=seed)[0])
        graph.replay()
        assert all(torch.equal(o, w) for o, w in zip(outs, calls(), strict=True))


def test_chained_launches_read_their_inputs_after_the_launch_before():
    """Each launch may start under the one before (programmatic dependent launch, sm_90: the GEMV reads its first
    weight tile early, its input only after that launch completes). A chain whose every input is the output
    just written (norm, gated, down, single, split K) replays in a CUDA graph to the results of the same calls
    made one at a time with the device synchronised between them, for new inputs copied in before each replay."""
    from replayssm.kernels.norm import rmsnorm

    x, gate, up = _gated_data(1)
    g = torch.Generator(device="cuda").manual_seed(7)
    down = (torch.randn(2560, 9216, generator=g, device="cuda") / 96).bfloat16()
    proj = (torch.randn(8192, 2560, generator=g, device="cuda") / 50).bfloat16()
    narrow = (torch.randn(256, 8192, generator=g, device="cuda") / 90).bfloat16()
    norm_w = torch.rand(2560, generator=g, device="cuda").bfloat16() + 0.5
    split = LaunchConfig(block_n=4, block_k=512, num_warps=4, split_k=4)
    steps = (lambda h: rmsnorm(h, norm_w, 1e-6, "round_then_weight", backend="triton"),
             lambda h: linear_small_batch_gated(h, gate, up, backend="triton"),
             lambda h: linear_small_batch(h, down, backend="triton"),
             lambda h: linear_small_batch(h, proj, backend="triton"),
             lambda h: linear_small_batch(h, narrow, backend="triton", config=split))

    def chain(sync=False):
        h = x
        for step in steps:
            h = step(h)
            if sync:
                torch.cuda.synchronize()
        return h

    graph, out = _captured(chain)
    for seed in range(1, 6):
        x.copy_(torch.randn(x.shape, generator=g, device="cuda"))
        want = chain(sync=True)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {seed}"
