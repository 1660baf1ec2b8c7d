"""CUDA-graph decoding on the GPU: the graphs replay exactly what the eager patched path computes."""

import pytest
import torch

import replayssm

from helpers import REWRITABLE_FAMILIES, generate, left_padded_batch, max_logit_diff, tiny

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _unsafe(model):
    from transformers import StaticCache

    from replayssm.patches.graph_decode import GraphDecoder

    return GraphDecoder._unsafe_layers(StaticCache(config=model.config, max_cache_len=8))


def _both(model, ids, mask, patch_kw, **kw):
    replayssm.patch(model, **patch_kw)
    eager = generate(model, ids, mask, **kw)
    replayssm.patch(model, **patch_kw, cuda_graphs=True)
    graphs = [generate(model, ids, mask, **kw) for _ in range(2)]  # the second call replays from its first step
    return eager, graphs


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_graphs_equal_eager_fp32(family):
    model = tiny(family).cuda()
    try:
        for batch in (1, 3):
            ids, mask = left_padded_batch(seed=batch, batch=batch, device="cuda")
            eager, graphs = _both(model, ids, mask, dict(buffer_len=4), max_new_tokens=20, min_new_tokens=20)
            for out in graphs:
                assert torch.equal(out.sequences, eager.sequences), f"batch {batch}"
                assert max_logit_diff(out, eager) < 1e-5, f"batch {batch}"
            # the slot was handed back with the returned cache; a call that does not return it keeps the graph
            seq = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=20,
                                 min_new_tokens=20)
            assert torch.equal(seq, eager.sequences)
            report = [r for r in replayssm.graph_report(model) if r["batch_size"] == batch]
            if _unsafe(model):  # e.g. sparse-attention (indexed) cache layers: eager, same tokens
                assert report == []
            else:
                assert report and report[0]["captured"] and report[0]["fallback"] is None, report
    finally:
        replayssm.unpatch(model)
        model.cpu()


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_assisted_windows_in_graphs_equal_plain_greedy_fp32(family):
    """Scripted drafts of 0..4 tokens through captured verify windows, twice (the second call replays
    from its first window): the plain greedy tokens of the same patched model."""
    from replayssm.patches import compat

    from speculative_helpers import ScriptedDrafter, drafting

    model = tiny(family).cuda()
    if compat.assisted_generation_gap(model):
        pytest.skip(compat.assisted_generation_gap(model))
    ids = torch.randint(3, 512, (1, 9), generator=torch.Generator().manual_seed(8)).cuda()
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, max_new_tokens=48,
              min_new_tokens=48)
    try:
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        ref = model.generate(ids, **kw)
        for _ in range(2):
            drafter = ScriptedDrafter(model, ref, 4, seed=3, min_draft=0)
            with drafting(model, drafter):
                out = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
            assert torch.equal(out, ref), drafter.log
        windows = [r for r in replayssm.graph_report(model) if r["assisted"]]
        if _unsafe(model):
            assert windows == []
        else:
            assert windows and windows[0]["window_graphs"] >= 2 and windows[0]["fallback"] is None, windows
    finally:
        replayssm.unpatch(model)
        model.cpu()


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_graphs_bf16_sampling_and_per_step(family):
    model = tiny(family, torch.bfloat16).cuda()
    ids, mask = left_padded_batch(seed=7, batch=4, device="cuda")
    try:
        for L in (1, 16):
            eager, graphs = _both(model, ids, mask, dict(buffer_len=L), max_new_tokens=24, min_new_tokens=24)
            assert max_logit_diff(graphs[0], eager) < 1e-2 or torch.equal(graphs[0].sequences, eager.sequences)
            kw = dict(attention_mask=mask, do_sample=True, top_p=0.9, temperature=0.7, num_return_sequences=2,
                      max_new_tokens=16, min_new_tokens=16, pad_token_id=0)
            torch.manual_seed(1)
            with_graphs = model.generate(ids, **kw)
            replayssm.patch(model, buffer_len=L)
            torch.manual_seed(1)
            without = model.generate(ids, **kw)
            assert torch.equal(with_graphs, without), f"L={L}"
    finally:
        replayssm.unpatch(model)
        model.cpu()


def test_release_frees_graph_memory():
    model = tiny("qwen3_5").cuda()
    ids, mask = left_padded_batch(seed=2, batch=8, device="cuda")
    try:
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=8, min_new_tokens=8)
        # a first call and release: what stays for the process (cuBLAS workspaces of the warm-up stream, Triton)
        model.generate(ids, **kw)
        replayssm.release_graphs(model)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        model.generate(ids, **kw)
        (report,) = replayssm.graph_report(model)
        assert report["captured"] and report["capture_s"] > 0 and report["memory_bytes"] > 0
        assert torch.cuda.memory_allocated() > before
        replayssm.release_graphs(model)
        assert replayssm.graph_report(model) == []
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() <= before + (1 << 20)
    finally:
        replayssm.unpatch(model)
        model.cpu()


@pytest.mark.parametrize("name", ["nemotron3-nano-like", "qwen3.5-4b-like", "kimi-linear-like"])
def test_graphs_equal_eager_on_real_size_presets(name):
    """Greedy batches of the benchmark presets (random fp32 weights, real layer sizes): the graphs
    give the eager patched path's tokens, and logits within fp32 rounding."""
    from replayssm.presets import build_preset

    model = build_preset(name, torch.float32, "cuda")
    try:
        ids, mask = left_padded_batch(seed=3, batch=4, device="cuda")
        eager, graphs = _both(model, ids, mask, dict(buffer_len=16), max_new_tokens=24, min_new_tokens=24)
        for out in graphs:
            assert torch.equal(out.sequences, eager.sequences)
            assert max_logit_diff(out, eager) < 1e-3
        # a call that does not take the cache back keeps its captured slot
        seq = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=24,
                             min_new_tokens=24)
        assert torch.equal(seq, eager.sequences) and replayssm.graph_report(model)[0]["captured"]
    finally:
        replayssm.unpatch(model)
        del model
        torch.cuda.empty_cache()
