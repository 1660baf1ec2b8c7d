"""Low-precision checkpoints in the Triton kernels on a GPU, real layer shapes (a few steps each):
outputs within 1e-3 of the reference, every stored value within one quantum of the reference's
(the fp32 states differ in summation order, tf32x3 and fused multiply-adds, so a value on a
rounding boundary may land on either side), identical random-number counters. Also a captured
CUDA graph of a stochastic step replays with fresh draws at every flush."""

import pytest
import torch

from quant_helpers import compare

pytestmark = pytest.mark.gpu

SHAPES = {"mamba2": (128, 64, 128, 8), "gdn": (32, 16, 128, 128), "kda": (32, 32, 128, 128)}
CASES = [(torch.int8, False), (torch.int8, True), (torch.float8_e4m3fn, False), (torch.float8_e4m3fn, True),
         (torch.bfloat16, True), (torch.float16, True)]


@pytest.mark.parametrize("family", list(SHAPES))
@pytest.mark.parametrize("dtype,sr", CASES)
@pytest.mark.parametrize("batch", [2, 64])
def test_replay_kernel_matches_reference_on_real_shapes(family, dtype, sr, batch):
    y_err, off, same_rng = compare(family, dtype, sr, batch, steps=4, device="cuda", L=16 if batch == 64 else 4,
                                   shape=SHAPES[family])
    assert y_err < 1e-3, y_err
    assert off < 1e-4, f"{off:.2e} of the stored values are more than one quantum from the reference's"
    assert same_rng


@pytest.mark.parametrize("family", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_8bit_checkpoint_beside_bf16_rings(family, dtype):
    """The serving layout: bf16 rings beside an 8-bit checkpoint, batch 256 (the default launch at a
    serving batch size; Mamba-2's flush product then runs on bf16 operands, whose rounding is finer
    than the 8-bit grid's, so a few values near a rounding boundary may land one quantum apart)."""
    y_err, off, _ = compare(family, dtype, False, 256, steps=4, device="cuda", L=16, shape=SHAPES[family],
                            ring_dtype=torch.bfloat16)
    assert y_err < 1e-2, y_err
    assert off < 1e-3, f"{off:.2e} of the stored values are more than one quantum from the reference's"


@pytest.mark.parametrize("dtype,sr,dots", [(torch.int8, True, False), (torch.int8, False, True),
                                           (torch.float8_e4m3fn, False, False), (torch.bfloat16, True, False)])
def test_mamba2_split_routes_match_reference(dtype, sr, dots, monkeypatch):
    """Mamba-2's two-launch replay step (``LaunchConfig.split_routes``, the 8-bit default from batch
    256 for e4m3, 128 for int8, whose codes the output-only launch reads as int32 words; the flush
    launch on 2 warps; int8 words also as ``dp4a`` products, ``word_dots``) with rows at staggered
    cursors, every checkpoint format: the reference's outputs and stored values, and its counters."""
    import dataclasses

    from replayssm.kernels.mamba2 import launch

    default = launch.default_config
    monkeypatch.setattr(launch, "default_config", lambda *a: dataclasses.replace(
        default(*a), split_routes=True, flush_warps=2, word_dots=dots))
    y_err, off, same_rng = compare("mamba2", dtype, sr, 64, steps=20, device="cuda", L=16, shape=SHAPES["mamba2"])
    assert y_err < 1e-3, y_err
    assert off < 1e-4, f"{off:.2e} of the stored values are more than one quantum from the reference's"
    assert same_rng


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_stochastic_flush_in_a_cuda_graph_draws_anew(family):
    from replayssm.kernels import quant as Q
    from replayssm.kernels.delta.launch import delta_replay_decode_triton
    from replayssm.kernels.mamba2.ops import mamba2_replay_decode_triton

    dev, Bsz, L = "cuda", 4, 1  # L = 1: every step flushes
    g = torch.Generator(device=dev).manual_seed(0)
    if family == "mamba2":
        H, P, N, G = 8, 64, 128, 1
        state = torch.zeros(Bsz, H, P, N, dtype=torch.int8, device=dev)
        scale = torch.zeros(Bsz, H, P, device=dev)
        bufs = (torch.zeros(Bsz, H, L, P, device=dev), torch.zeros(Bsz, H, L, device=dev),
                torch.zeros(Bsz, G, L, N, device=dev))
        inp = (torch.randn(Bsz, H, P, device=dev, generator=g), torch.randn(Bsz, H, device=dev, generator=g),
               torch.randn(Bsz, G, N, device=dev, generator=g), torch.randn(Bsz, G, N, device=dev, generator=g))
        A = -torch.ones(H, device=dev) * 0.01
        step = lambda: mamba2_replay_decode_triton(*inp, state, *bufs, cursor, A, None, None, None, True, out,  # noqa: E731
                                                   None, scale, rng)
        out = torch.empty(Bsz, H, P, device=dev)
    else:
        HV, Hk, K, V = 8, 4, 128, 128
        state = torch.zeros(Bsz, HV, K, V, dtype=torch.int8, device=dev)
        scale = torch.zeros(Bsz, HV, V, device=dev)
        bufs = (torch.zeros(Bsz, HV, L, V, device=dev), torch.zeros(Bsz, Hk, L, K, device=dev),
                torch.zeros(Bsz, HV, L, device=dev))
        k = torch.nn.functional.normalize(torch.randn(Bsz, Hk, K, device=dev, generator=g), dim=-1)
        inp = (k * K ** -0.5, k, torch.randn(Bsz, HV, V, device=dev, generator=g),
               -torch.full((Bsz, HV), 0.01, device=dev), torch.full((Bsz, HV), 0.5, device=dev))
        out = torch.empty(Bsz, HV, V, device=dev)
        step = lambda: delta_replay_decode_triton(*inp, state, *bufs, cursor, out, state_scale=scale,  # noqa: E731
                                                  state_rng=rng)
    cursor = torch.zeros(Bsz, dtype=torch.int32, device=dev)
    rng = Q.init_state_rng(Bsz, 3, 0, dev)
    step()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    seen = []
    for _ in range(3):
        state.zero_()
        scale.zero_()
        graph.replay()
        seen.append(state.clone())
    torch.cuda.synchronize()
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2]), "the graph replays one draw"
    assert int(rng[:, 1].min()) == 4  # the warm-up and three replays each advanced every row once (a capture runs nothing)


def test_planes_dot_in_ptx_matches_float64():
    """The int8 words' ``S0 . C`` through the GPU's ``dp4a`` (the interpreter emulates it): the
    float64 oracle's bound, every code, NaN from a non-finite element."""
    from test_quant_kernels import check_planes_dot

    check_planes_dot("cuda")


def test_vectors_at_the_edges_on_the_gpu():
    """NaN / inf vectors keep non-finite scales where the GPU's max would drop a NaN; tiny vectors
    stored as zero codes; finite ones as the reference."""
    from test_quant_kernels import check_vectors_at_the_edges

    check_vectors_at_the_edges("cuda")
