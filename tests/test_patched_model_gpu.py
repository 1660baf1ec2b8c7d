"""Patched tiny models on CUDA: Triton backend parity, CUDA-graph capture, torch.compile."""

import importlib.util

import pytest
import torch
import transformers

import replayssm

from helpers import (REWRITABLE_FAMILIES, generate, left_padded_batch, low_precision_errors,
                     max_logit_diff, tiny)

pytestmark = pytest.mark.gpu


def cuda_model(family, dtype=torch.float32):
    return tiny(family, dtype).to("cuda")


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_greedy_parity_on_cuda_fp32(family):
    model = cuda_model(family)
    ids, mask = left_padded_batch(seed=1, device="cuda")
    ref = generate(model, ids, mask, max_new_tokens=48, min_new_tokens=48)
    try:
        for L in (1, 16):
            replayssm.patch(model, buffer_len=L, backend="triton")
            out = generate(model, ids, mask, max_new_tokens=48, min_new_tokens=48)
            assert torch.equal(out.sequences, ref.sequences), f"L={L}"
            assert max_logit_diff(out, ref) < 1e-3, f"L={L}"
            replayssm.unpatch(model)
    finally:
        replayssm.unpatch(model)
        model.to("cpu")


_KDA_BF16_CHECKPOINT = pytest.mark.xfail(
    condition=importlib.util.find_spec("fla") is None,
    reason="known limitation (README): a bf16 checkpoint of the tiny KDA model, whose state cancels strongly, "
           "is 0.42 logits from the fp32 model within 24 teacher-forced steps on the H200, against 0.05 for stock "
           "bf16 then (stock bf16 itself drifts to 0.43 by step 48). With flash-linear-attention installed the "
           "stock model runs fla's kernels, is further off, and the check passes. On 2026-12-03 (after the "
           "one-launch decoder norms) it passed without fla too (an unexpected pass); not strict until a "
           "second run settles which",
    strict=False)


@pytest.mark.parametrize("family", ["nemotron_h", "bamba", "qwen3_5", "kimi_linear"])
@pytest.mark.parametrize("state_dtype", [None, "bf16"])
def test_bf16_on_cuda_no_less_accurate_than_stock(family, state_dtype, request):
    """bf16 model on CUDA, Triton kernels: teacher-forced logits against the fp32 model are no
    further off than the stock bf16 model's (plus a small margin). The fp32 model is the oracle:
    comparing with the stock bf16 model directly compares two roundings (e.g. with
    flash-linear-attention installed, stock Kimi-Linear runs fla's kernels and the two bf16
    models differ by ~0.4 logits)."""
    if (family, state_dtype) == ("kimi_linear", "bf16"):
        request.applymarker(_KDA_BF16_CHECKPOINT)
    stock, patched = low_precision_errors(family, torch.bfloat16, "cuda", "triton", state_dtype)
    assert patched <= 1.25 * stock + 0.02, f"patched {patched:.4f} vs stock {stock:.4f} (from the fp32 model)"


# tiny:mamba2 is a Mamba2ForCausalLM, which takes its cache as `cache_params` (it ignores
# `past_key_values`) in every supported transformers version


def _decode_inputs(batch, steps, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (steps, batch, 1), generator=g).cuda()


def test_cuda_graph_replay_equals_eager_across_flushes():
    """Capture one decode step of a patched model; replaying it L+3 times matches eager.

    tiny:mamba2 has SSM layers only, so its whole cache has static addresses (hybrids'
    attention layers grow their KV cache by concatenation, which no graph can capture).
    """
    L = 4
    model = cuda_model("mamba2")
    replayssm.patch(model, buffer_len=L, backend="triton")
    try:
        batch, steps = 3, L + 3
        prompt = torch.randint(3, 512, (batch, 5), generator=torch.Generator().manual_seed(0)).cuda()
        tokens = _decode_inputs(batch, steps + 2, seed=1)

        def fresh_cache():
            cache = transformers.DynamicCache(config=model.config)
            with torch.no_grad():
                model(prompt, cache_params=cache, use_cache=True)
            return cache

        # eager reference
        cache = fresh_cache()
        eager = []
        with torch.no_grad():
            for t in range(steps + 2):
                eager.append(model(tokens[t], cache_params=cache, use_cache=True).logits.clone())
        assert cache.layers[0]._replayssm.cursor.tolist() == [(steps + 2) % L] * batch
        # graph: two eager warm-up steps allocate buffers, then capture one step and replay
        cache = fresh_cache()
        static_in = tokens[0].clone()
        with torch.no_grad():
            for t in range(2):
                static_in.copy_(tokens[t])
                model(static_in, cache_params=cache, use_cache=True)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            # snapshot the cache so that capture (which runs the step once) can be undone
            layers = cache.layers
            snap = [(l.conv_states[0].clone(), l.recurrent_states[0].clone(),
                     {k: v.clone() for k, v in l._replayssm.tensors.items()}, l._replayssm.cursor.clone())
                    for l in layers]
            with torch.cuda.stream(stream):
                with torch.cuda.graph(graph, stream=stream):
                    static_out = model(static_in, cache_params=cache, use_cache=True).logits
            torch.cuda.current_stream().wait_stream(stream)
            for l, (conv, rec, bufs, cur) in zip(layers, snap):
                l.conv_states[0].copy_(conv)
                l.recurrent_states[0].copy_(rec)
                for k, v in bufs.items():
                    l._replayssm.tensors[k].copy_(v)
                l._replayssm.cursor.copy_(cur)
            replayed = []
            for t in range(2, steps + 2):
                static_in.copy_(tokens[t])
                graph.replay()
                replayed.append(static_out.clone())
        torch.cuda.synchronize()
        for t, out in enumerate(replayed, start=2):
            torch.testing.assert_close(out, eager[t], rtol=1e-4, atol=1e-4)
    finally:
        replayssm.unpatch(model)
        model.to("cpu")


def test_torch_compile_patched_decode_step():
    """torch.compile traces the patched mixers' decode step (kernels are custom ops)."""
    model = cuda_model("mamba2")
    replayssm.patch(model, buffer_len=4, backend="triton")
    try:
        prompt = torch.randint(3, 512, (2, 5), generator=torch.Generator().manual_seed(0)).cuda()
        tokens = _decode_inputs(2, 6, seed=2)

        def run(step_fn):
            cache = transformers.DynamicCache(config=model.config)
            outs = []
            with torch.no_grad():
                model(prompt, cache_params=cache, use_cache=True)
                for t in range(6):
                    outs.append(step_fn(tokens[t], cache))
            # the replay decode path really ran: every row's cursor advanced 6 times (L = 4)
            assert cache.layers[0]._replayssm.cursor.tolist() == [6 % 4] * 2
            return torch.stack(outs)

        eager = run(lambda ids, cache: model(ids, cache_params=cache, use_cache=True).logits)
        torch._dynamo.reset()
        compiled_forward = torch.compile(model.forward, dynamic=False)
        compiled = run(lambda ids, cache: compiled_forward(ids, cache_params=cache, use_cache=True).logits)
        torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3)
    finally:
        replayssm.unpatch(model)
        model.to("cpu")
