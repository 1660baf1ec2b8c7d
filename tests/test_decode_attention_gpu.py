"""The decode attention kernel on the GPU: real shapes in bf16/fp16/fp32, CUDA-graph capture, and a
patched tiny model's greedy generate() with CUDA graphs."""

import pytest
import torch

import replayssm
from replayssm.kernels.attention import DecodeLaunch, decode_attention_reference, decode_attention_triton
from replayssm.patches import decode_attention as dispatch
from replayssm.patches import latent_attention as latent_decode

from helpers import assert_close_until_near_tie, generate, left_padded_batch, tiny
from test_decode_attention import poisoned  # noqa: F401  (NaN-filled torch.empty)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

SHAPES = {  # (Hq, Hkv, Dk, Dv) of the presets' attention layers
    "qwen3.5-4b-like": (16, 4, 256, 256),
    "nemotron3-nano-like": (32, 8, 128, 128),
    "kimi-linear-like": (32, 32, 192, 128),
}


def _inputs(B, shape, C, dtype, seed=0):
    Hq, Hkv, Dk, Dv = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 1, Hq, Dk, device="cuda", generator=g).to(dtype).transpose(1, 2)  # transformers' layout
    k = torch.randn(B, Hkv, C, Dk, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Hkv, C, Dv, device="cuda", generator=g).to(dtype)
    pos = torch.arange(C, device="cuda")
    live = torch.randint(1, C + 1, (B,), device="cuda", generator=g)  # a static cache filled to `live` positions
    pad = (torch.rand(B, device="cuda", generator=g) * live * 0.5).long()  # left padding
    mask = ((pos[None] < live[:, None]) & (pos[None] >= pad[:, None]))[:, None, None]
    return q, k, v, mask


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("B,C", [(1, 64), (1, 1024), (64, 256), (256, 64)])
def test_low_precision_within_rounding_of_sdpa(name, B, C, poisoned):
    """bf16 and fp16: no further from the fp32 reference than sdpa on the same 16-bit inputs (plus a
    small margin); every output written (NaN-poisoned buffers)."""
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v, mask = _inputs(B, SHAPES[name], C, dtype, seed=B + C)
        got = decode_attention_triton(q, k, v, mask, None)
        oracle = decode_attention_reference(q.float(), k.float(), v.float(), mask, None)
        sdpa = decode_attention_reference(q, k, v, mask, None)
        err, err_sdpa = ((x.float() - oracle).abs().max().item() for x in (got, sdpa))
        assert got.dtype == dtype and not got.isnan().any()
        assert err <= 2 * err_sdpa + 2e-3, f"{dtype}: {err} vs sdpa {err_sdpa}"


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_equals_reference_including_splits(name, poisoned):
    q, k, v, mask = _inputs(3, SHAPES[name], 300, torch.float32, seed=5)
    want = decode_attention_reference(q, k, v, mask, 0.07)
    for launch in (None, DecodeLaunch(block_n=32, splits=1), DecodeLaunch(block_n=64, splits=5),
                   DecodeLaunch(block_n=16, splits=19, num_warps=8, num_stages=3)):
        got = decode_attention_triton(q, k, v, mask, 0.07, launch=launch)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5, msg=lambda m: f"{launch}: {m}")


def test_fully_masked_row_gives_zeros():
    q, k, v, mask = _inputs(4, SHAPES["qwen3.5-4b-like"], 128, torch.bfloat16)
    mask[2] = False
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        math_out = decode_attention_reference(q, k, v, mask, None)
    for splits in (1, 4):
        got = decode_attention_triton(q, k, v, mask, None, launch=DecodeLaunch(block_n=32, splits=splits))
        assert torch.equal(got[2], torch.zeros_like(got[2])) and torch.equal(math_out[2], torch.zeros_like(got[2]))


@pytest.mark.parametrize("B,C", [(256, 64), (1, 1024)])
def test_cuda_graph_replay_follows_the_inputs(B, C):
    q, k, v, mask = _inputs(B, SHAPES["qwen3.5-4b-like"], C, torch.bfloat16)
    q, k, v, mask = q.contiguous(), k.clone(), v.clone(), mask.clone()
    decode_attention_triton(q, k, v, mask, None)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention_triton(q, k, v, mask, None)
    for seed in (1, 2):
        q2, k2, v2, mask2 = _inputs(B, SHAPES["qwen3.5-4b-like"], C, torch.bfloat16, seed=seed)
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        mask.copy_(mask2)
        graph.replay()
        torch.testing.assert_close(out, decode_attention_triton(q, k, v, mask, None), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "kimi_linear"])
def test_patched_bf16_graphs_equal_eager_and_run_the_kernel(family, monkeypatch):
    """bf16 greedy generate() of a patched tiny model: the CUDA-graph decode (static cache, the kernel
    captured; Kimi-Linear's latent attention instead) gives the eager patched decode's tokens (dynamic cache, the kernel run eagerly); logits
    within bf16 rounding until a near-tie (the prefills differ: the graphs' runs on a 64-position cache)."""
    calls, latent = [], []
    kernel, attend = dispatch.decode_attention_triton, latent_decode.latent_attention
    monkeypatch.setattr(dispatch, "decode_attention_triton", lambda *a: calls.append(a[1].shape) or kernel(*a))
    monkeypatch.setattr(latent_decode, "latent_attention", lambda *a: latent.append(1) or attend(*a))
    model = tiny(family, torch.bfloat16).cuda()
    ids, mask = left_padded_batch(seed=9, batch=4, device="cuda")
    kw = dict(max_new_tokens=24, min_new_tokens=24)
    try:
        replayssm.patch(model, buffer_len=8)
        eager = generate(model, ids, mask, **kw)
        assert calls, "the eager patched decode did not run the kernel"
        calls.clear()
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        graphs = [generate(model, ids, mask, **kw) for _ in range(2)]
        if family == "kimi_linear":  # multi-head latent attention: one-token queries attend on the latents
            assert latent and not calls, "the captured decode step did not attend on the latent cache"
        else:
            assert calls and all(shape[2] == 64 for shape in calls), "the captured decode step did not run the kernel"
        for out in graphs:
            assert_close_until_near_tie(out, eager, ids.shape[1], tol=3e-2)
    finally:
        replayssm.unpatch(model)
        model.cpu()
