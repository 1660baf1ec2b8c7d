"""The small-batch linear kernel on the GPU: 16-bit real shapes within one rounding of the fp32 result
(the bound an fp32-accumulating GEMM meets), every launch form, determinism, and CUDA-graph capture."""

import pytest
import torch

from replayssm.kernels.linear import LaunchConfig, default_config, linear_small_batch

from test_linear import PRESET_SHAPES, assert_within_rounding

pytestmark = pytest.mark.gpu


def _data(N, K, M, dtype, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, 1, K, generator=g, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).to(dtype)
    b = torch.randn(N, generator=g, device="cuda").to(dtype) if bias else None
    return x, w, b


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
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) off the capture
        linear_small_batch(x, w, b, backend="triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [linear_small_batch(x, w, b, backend="triton") for _ in range(3)]
    if N == 256:
        assert default_config(N, K, M, 2, torch.cuda.get_device_properties(0).multi_processor_count).split_k > 1
    for seed in (1, 2):
        x.copy_(_data(N, K, M, torch.bfloat16, bias=False, seed=seed)[0])
        graph.replay()
        want = linear_small_batch(x, w, b, backend="triton")
        assert all(torch.equal(o, want) for o in outs)
