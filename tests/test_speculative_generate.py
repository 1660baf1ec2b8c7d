"""Speculative decoding through ``generate()`` on patched models (fp32, CPU, batch 1).

Every rewritable tiny family: assisted decoding with a scripted drafter (random draft lengths and
agreement, full rejection and full acceptance, rejected ring entries NaN-poisoned) gives exactly
the non-speculative greedy tokens of the same patched model, over many flushes. Prompt lookup, a
small draft model (plain and patched hybrid), sampling, and the refusals stay as transformers
defines them for unpatched models.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import replayssm
from replayssm.errors import RollbackError, VerifyWindowError
from replayssm.patches import compat
from replayssm.patches.compat import assisted_generation_gap

from helpers import REWRITABLE_FAMILIES, forced_logits, generate, tiny
from speculative_helpers import ScriptedDrafter, drafting

NEW = 48


def _prompt(seed=0, length=9, device="cpu"):
    ids = torch.randint(3, 512, (1, length), generator=torch.Generator().manual_seed(seed)).to(device)
    return ids, torch.ones_like(ids)


def _scripted(model, ids, mask, ref, max_draft, seed=0, min_draft=1, follow=True, **kw):
    drafter = ScriptedDrafter(model, ref.sequences, max_draft, seed=seed, min_draft=min_draft, follow=follow)
    with drafting(model, drafter):
        # prompt_lookup_num_tokens only selects the assisted mode; the drafter proposes the tokens
        out = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW, prompt_lookup_num_tokens=max_draft,
                       **kw)
    return out, drafter


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_assisted_greedy_equals_plain_greedy(family):
    """Scripted drafts of 1..4 tokens with L=4 (a flush every round or two) and 1..8 with L=8."""
    model = tiny(family)
    if assisted_generation_gap(model):
        pytest.skip(assisted_generation_gap(model))
    ids, mask = _prompt()
    try:
        for L, max_draft in ((4, 3), (8, 7)):
            replayssm.patch(model, buffer_len=L)
            ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
            out, drafter = _scripted(model, ids, mask, ref, max_draft, seed=L)
            assert torch.equal(out.sequences, ref.sequences), f"L={L}: {drafter.log}"
            assert any(a == 0 for _, a in drafter.log) and any(a == k > 1 for k, a in drafter.log)
            assert max(k for k, _ in drafter.log) == max_draft
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_assisted_greedy_on_a_static_cache_equals_plain_greedy(family):
    """A ``StaticCache`` passed in: its attention positions past the sequence (never written, or
    holding cropped drafts) must stay masked in every step, the one-token steps of rounds without
    drafts included."""
    model = tiny(family)
    if assisted_generation_gap(model):
        pytest.skip(assisted_generation_gap(model))
    ids, mask = _prompt(seed=6)
    key = compat.generate_cache_kwarg(model)
    replayssm.patch(model, buffer_len=8)
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        cache = transformers.StaticCache(config=model.config, max_cache_len=96)
        if compat.refuses_assisted_on_static_caches():  # transformers' own clear error
            with pytest.raises(ValueError, match="Static cache"):
                _scripted(model, ids, mask, ref, 4, seed=11, min_draft=0, **{key: cache})
            return
        # static sliding-window layers longer than their window (a fresh cache's own is_croppable is no guide:
        # 5.24's linear-attention layers answer False until their states exist; it asks after the prefill)
        sliding = getattr(transformers.cache_utils, "StaticSlidingWindowLayer", None)
        if sliding is not None and any(isinstance(layer, sliding) and not layer.is_croppable for layer in cache.layers):
            with pytest.raises(ValueError, match="can be cropped"):  # transformers' own clear error too
                _scripted(model, ids, mask, ref, 4, seed=11, min_draft=0, **{key: cache})
            return
        out, drafter = _scripted(model, ids, mask, ref, 4, seed=11, min_draft=0, **{key: cache})
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert any(a < k for k, a in drafter.log) and any(a == k > 1 for k, a in drafter.log)
    assert sum(k == 0 for k, _ in drafter.log) >= 3


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_prompt_lookup_on_a_repeating_prompt(family):
    model = tiny(family)
    base = torch.randint(3, 512, (1, 6), generator=torch.Generator().manual_seed(3))
    ids = base.repeat(1, 4)
    mask = torch.ones_like(ids)
    replayssm.patch(model, buffer_len=8)
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        out = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW, prompt_lookup_num_tokens=4)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences)


def _tiny_llama():
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("draft", ["llama", "patched_hybrid", "patched_hybrid_int8"])
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_a_draft_model(family, draft):
    """A small draft model sharing the vocabulary: a plain transformer, or a patched hybrid (whose
    own cache then rolls back too: a 2-token forward and single steps per round, cropped after; an
    int8 checkpoint folds what a full ring of single steps cannot hold through its scales)."""
    model = tiny(family)
    ids, mask = _prompt(seed=4)
    assistant = _tiny_llama() if draft == "llama" else tiny("qwen3_5" if family != "qwen3_5" else "nemotron_h")
    assistant.generation_config.num_assistant_tokens = 5
    assistant.generation_config.assistant_confidence_threshold = 0.0
    replayssm.patch(model, buffer_len=8)
    if draft.startswith("patched_hybrid"):
        replayssm.patch(assistant, buffer_len=8, state_dtype="int8" if draft.endswith("int8") else None)
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        out = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW, assistant_model=assistant)
        if draft == "patched_hybrid":  # the draft itself decodes as it would alone
            own = generate(assistant, ids, mask, max_new_tokens=12, min_new_tokens=12)
            replayssm.unpatch(assistant)
            stock = generate(assistant, ids, mask, max_new_tokens=12, min_new_tokens=12)
            assert torch.equal(own.sequences, stock.sequences)
    finally:
        replayssm.unpatch(model)
        replayssm.unpatch(assistant)
    assert torch.equal(out.sequences, ref.sequences)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_sampling_with_a_draft_model_runs_and_is_reproducible(family):
    """Speculative sampling (the draft's logits, transformers' acceptance rule): valid tokens, and
    the same tokens for the same seed."""
    model = tiny(family)
    ids, mask = _prompt(seed=5)
    assistant = _tiny_llama()
    assistant.generation_config.num_assistant_tokens = 4
    replayssm.patch(model, buffer_len=4)
    try:
        runs = []
        for _ in range(2):
            torch.manual_seed(7)
            runs.append(generate(model, ids, mask, max_new_tokens=24, min_new_tokens=24, do_sample=True,
                                 assistant_model=assistant).sequences)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape == (1, ids.shape[1] + 24) and int(runs[0].max()) < 512


def test_unpatch_restores_the_stock_answer():
    """transformers up to 5.24 refuses assisted generation on a stateful model (the class's
    ``_is_stateful``), which the patch lifts per instance and unpatch restores; 5.25 serves it itself
    (every layer records a recurrent state per drafted token), which unpatch leaves to it."""
    model = tiny("qwen3_5")
    ids, mask = _prompt()
    refuses = getattr(type(model), "_is_stateful", False)
    replayssm.patch(model, buffer_len=4)
    if refuses:
        assert model._is_stateful is False
    replayssm.unpatch(model)
    assert "_is_stateful" not in model.__dict__
    if refuses:
        assert model._is_stateful is True
        with pytest.raises(ValueError, match="stateful"):
            generate(model, ids, mask, max_new_tokens=4, prompt_lookup_num_tokens=2)
    else:
        plain = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8)
        assisted = generate(model, ids, mask, max_new_tokens=8, min_new_tokens=8, prompt_lookup_num_tokens=2)
        assert torch.equal(assisted.sequences, plain.sequences)


def test_a_window_longer_than_the_ring_raises():
    model = tiny("nemotron_h")
    ids, mask = _prompt()
    replayssm.patch(model, buffer_len=4)
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        with pytest.raises(VerifyWindowError, match=r"expected T <= buffer_len = 4, found T = [56]"):
            _scripted(model, ids, mask, ref, max_draft=5)
    finally:
        replayssm.unpatch(model)


def test_a_rollback_past_the_ring_raises():
    """Three single-token forwards on a recording cache with L=2: the first was folded, so removing
    all three cannot be served."""
    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=2)
    try:
        cache = transformers.DynamicCache(config=model.config)
        cache.activate_past_recording()
        with torch.no_grad():
            model(torch.randint(3, 512, (1, 5)), past_key_values=cache, use_cache=True)
            assert cache.is_croppable
            for t in range(3):
                model(torch.randint(3, 512, (1, 1)), past_key_values=cache, use_cache=True)
        with pytest.raises(RollbackError, match="expected at most the 2 still in its ReplaySSM ring"):
            cache.crop(-3)
        cache.crop(-2)
        with pytest.raises(RollbackError, match="expected crop"):
            cache.crop(3)
    finally:
        replayssm.unpatch(model)


LOW_PRECISION = [dict(state_dtype="int8"), dict(state_dtype="fp8"), dict(state_dtype="bf16", state_rounding="stochastic")]
LOW_IDS = ["int8", "fp8", "bf16-stochastic"]


# int8 on every family, the other roundings on one family of each layer kind
ON_GRID = [(f, 0) for f in REWRITABLE_FAMILIES] + [(f, i) for f in ("nemotron_h", "qwen3_5", "kimi_linear")
                                                   for i in (1, 2)]


@pytest.mark.parametrize("family,which", ON_GRID, ids=[f"{f}-{LOW_IDS[i]}" for f, i in ON_GRID])
def test_low_precision_checkpoints_with_windows_on_the_flush_grid(family, which):
    """A one-token prompt prefilled alone (its checkpoint rounded as plain decoding's), then every
    draft of 3 accepted with L = 8: each verify window holds 4 tokens, so its folds take the same 8
    tokens as a plain decode step's flush, rounded by the same function and random stream: the
    assisted tokens are exactly plain greedy decoding's. (A longer prompt's first forward keeps its
    last tokens roll-back-able in the ring, which moves the folds off this grid.)"""
    model = tiny(family)
    if assisted_generation_gap(model):
        pytest.skip(assisted_generation_gap(model))
    ids, mask = _prompt(seed=8, length=1)
    replayssm.patch(model, buffer_len=8, **LOW_PRECISION[which])
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        drafter = ScriptedDrafter(model, ref.sequences, 3, min_draft=3, agree_all=True, plain_first=True)
        with drafting(model, drafter):
            out = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW, prompt_lookup_num_tokens=3)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences), drafter.log
    assert sum(k == 3 for k, _ in drafter.log) >= NEW // 4 - 1


@pytest.mark.parametrize("patch_kw", LOW_PRECISION, ids=LOW_IDS)
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5", "kimi_linear"])
def test_low_precision_checkpoints_with_rejected_drafts_stay_faithful(family, patch_kw):
    """Drafts rejected in part, in full and accepted in full (folds off the plain decode's grid, so
    other roundings than plain decoding's): the assisted run's logits meet the fidelity criterion
    of ``convert`` against the fp32 stock model fed the same tokens."""
    from replayssm.validate import FIDELITY_ARGMAX, FIDELITY_MEAN_STD

    model = tiny(family)
    ids, mask = _prompt(seed=9)
    replayssm.patch(model, buffer_len=4, **patch_kw)
    try:
        ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
        out, drafter = _scripted(model, ids, mask, ref, 3, seed=12, follow=False)
    finally:
        replayssm.unpatch(model)
    forced = forced_logits(model, ids, mask, out.sequences)[:, 0]  # (NEW, vocab): the fp32 stock model
    got = torch.stack(out.logits)[:, 0].float()
    assert got.shape == forced.shape
    mean = ((got - forced).abs().mean() / forced.std()).item()
    agree = (got.argmax(-1) == forced.argmax(-1)).float().mean().item()
    assert mean <= FIDELITY_MEAN_STD and agree >= FIDELITY_ARGMAX, f"mean |logit diff| {mean:.3g} std, agree {agree}"
    assert any(0 < a < k for k, a in drafter.log) and any(a == 0 for _, a in drafter.log)


def test_static_layer_crop_moves_the_length_counter_back_in_place():
    """The crop a static attention layer gets where its class has none (transformers before 5.24): the
    counter moves back in place (a captured graph reads that tensor) as 5.24+'s own crop does; the
    assisted slot's cache class applies it there only; a positive count raises."""
    import types

    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    def filled():
        layer = StaticLayer(max_cache_len=8)
        layer.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
        return layer

    layer = filled()
    counter = layer.cumulative_length
    compat.static_layer_crop(layer, -3)
    assert layer.cumulative_length is counter and int(counter) == 2
    if callable(getattr(StaticLayer, "crop", None)):  # transformers 5.24+: the same as its own crop
        own = filled()
        own.crop(-3)
        assert int(own.cumulative_length) == 2 and not compat.lacks_static_crop(own)
        assert compat.static_cache_class(assisted=True) is StaticCache
    else:
        assert compat.lacks_static_crop(layer)
        cache_class = compat.static_cache_class(assisted=True)
        assert cache_class is not StaticCache and issubclass(cache_class, StaticCache)
        holder = types.SimpleNamespace(layers=[layer])  # (crop and is_croppable read the layers only)
        assert cache_class.is_croppable.fget(holder)
        cache_class.crop(holder, -1)
        assert int(counter) == 1
    assert compat.attention_crop(StaticLayer) is not None
    with pytest.raises(ValueError, match="crop\\(-n\\)"):
        compat.static_layer_crop(layer, 1)


def test_only_full_attention_static_layers_get_the_counter_crop():
    """Sliding-window and indexed static layers keep more than a length counter: never given it."""
    from transformers import cache_utils

    for name in ("StaticSlidingWindowLayer", "StaticIndexedLayer"):
        cls = getattr(cache_utils, name, None)
        if cls is not None:
            layer = cls.__new__(cls)  # (the check reads the class only)
            assert not compat.lacks_static_crop(layer)
    assert not compat.lacks_static_crop(object())
