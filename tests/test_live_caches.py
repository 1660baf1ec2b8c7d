"""Generation caches still in use when the patch changes: re-patch with other options, unpatch,
a copy of the cache, a compiled decode step. The continued generation must equal the stock
model's (greedy tokens and logits), or a clear error must be raised; never a half-read cache."""

import copy

import pytest
import torch
import transformers
from torch._dynamo.utils import counters

import replayssm
from replayssm.errors import CacheStateError
from replayssm.patches.cache_state import get_buffers

from helpers import generate, left_padded_batch, max_logit_diff, tiny

FIRST, MORE, L = 7, 17, 4  # 7 decode steps with L=4 leave every row with pending entries
# one family per layer kind: Mamba-2, Gated DeltaNet, Kimi Delta Attention
KIND_FAMILIES = ["nemotron_h", "qwen3_5", "kimi_linear"]
SWITCHES = {
    "repatch_buffer_len": lambda m: replayssm.patch(m, buffer_len=7),
    "repatch_buffer_len_1": lambda m: replayssm.patch(m, buffer_len=1),
    "unpatch": replayssm.unpatch,
}
# the same on CUDA, patched with the Triton backend first; the switch to the other backend takes the
# Triton interpreter a minute per family on CPU, so it runs on the GPU only
CUDA_SWITCHES = dict(SWITCHES, repatch_backend=lambda m: replayssm.patch(m, buffer_len=L, backend="torch"))


def _continue(model, out, mask, device="cpu", **kw):
    """Greedy continuation of ``out`` (a ``generate`` result) from its own cache."""
    mask = torch.cat([mask, torch.ones(mask.shape[0], out.sequences.shape[1] - mask.shape[1], dtype=mask.dtype,
                                       device=device)], dim=1)
    return generate(model, out.sequences, mask, past_key_values=out.past_key_values, max_new_tokens=MORE,
                    min_new_tokens=MORE, **kw)


def _two_stage(model, ids, mask, switch, device="cpu", **kw):
    first = generate(model, ids, mask, max_new_tokens=FIRST, min_new_tokens=FIRST, **kw)
    switch(model)
    return first, _continue(model, first, mask, device, **kw)


@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("family", KIND_FAMILIES)
def test_generation_continues_exactly_across_repatch_and_unpatch(family, switch):
    """A left-padded batch decoded with L=4 (every row holds pending ring entries), then the patch
    changes and generation continues from the same cache: tokens and logits equal stock's."""
    model = tiny(family)
    ids, mask = left_padded_batch(seed=5, batch=3)
    ref_first, ref = _two_stage(model, ids, mask, lambda m: None)
    replayssm.patch(model, buffer_len=L)
    try:
        first, out = _two_stage(model, ids, mask, SWITCHES[switch])
        assert not replayssm.is_patched(model) if switch == "unpatch" else replayssm.is_patched(model)
        if switch == "unpatch":  # a plain stock cache again: no buffers, no wrapped methods
            assert all(get_buffers(layer) is None and "reorder_cache" not in layer.__dict__
                       for layer in first.past_key_values.layers)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(first.sequences, ref_first.sequences)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4


@pytest.mark.parametrize("family", KIND_FAMILIES)
def test_the_cache_counts_its_tokens_as_stocks_does(family):
    """``get_seq_length`` of every layer after a patched generate equals the stock model's (5.25 keeps a
    token count in each linear-attention layer, which a continued generate starts its positions from)."""
    model = tiny(family)
    ids, mask = left_padded_batch(seed=5, batch=3)

    def lengths():
        cache = generate(model, ids, mask, max_new_tokens=FIRST, min_new_tokens=FIRST).past_key_values
        return [int(layer.get_seq_length()) for layer in cache.layers if hasattr(layer, "get_seq_length")]

    stock = lengths()
    replayssm.patch(model, buffer_len=L)
    try:
        assert lengths() == stock
    finally:
        replayssm.unpatch(model)
    assert max(stock) == ids.shape[1] + FIRST - 1  # the last token is sampled, not yet cached


def test_a_token_count_on_another_device_moves_to_the_step():
    """A hybrid layer whose attention half set its device first keeps transformers' token count on the
    CPU beside CUDA states (Zamba2 on 5.25): the step's device is where a ReplaySSM conv launch advances
    it, so ``token_count`` moves it there, once, and the layer (hence ``get_seq_length``) holds the moved
    tensor. The meta device stands in for CUDA here."""
    from types import SimpleNamespace

    from replayssm.patches import compat

    layer = SimpleNamespace(cumulative_length_linear=torch.tensor(9))
    here = layer.cumulative_length_linear
    assert compat.token_count(layer) is here and compat.token_count(layer, here.device) is here
    moved = compat.token_count(layer, torch.device("meta"))
    assert moved.device.type == "meta" and moved.dtype == torch.int64 and moved.dim() == 0
    assert layer.cumulative_length_linear is moved and compat.token_count(layer, torch.device("meta")) is moved
    assert compat.token_count(SimpleNamespace(), torch.device("meta")) is None


def test_state_dtype_change_carries_over():
    """bf16 checkpoint -> re-patch with the stock (fp32) checkpoint: the state comes back in fp32
    with the pending entries folded in; the continuation stays as close to stock as the bf16 part
    allowed (dropping the pending entries costs whole logits)."""
    model = tiny("qwen3_5")
    ids, mask = left_padded_batch(seed=5, batch=3)
    _, ref = _two_stage(model, ids, mask, lambda m: None)
    replayssm.patch(model, buffer_len=L, state_dtype="bf16")
    try:
        first, out = _two_stage(model, ids, mask, lambda m: replayssm.patch(m, buffer_len=L, state_dtype=None))
        states = [layer.recurrent_states[0] for layer in first.past_key_values.layers
                  if getattr(layer, "recurrent_states", None) and layer.recurrent_states[0] is not None]
        assert states and all(s.dtype == torch.float32 for s in states)
    finally:
        replayssm.unpatch(model)
    assert max_logit_diff(out, ref) < 0.05


@pytest.mark.parametrize("switch", ["repatch_buffer_len", "unpatch"])
def test_a_cache_made_in_inference_mode_carries_over_outside_it(switch):
    """Generation under torch.inference_mode(), the switch outside it (as a validation does)."""
    model = tiny("kimi_linear")
    ids, mask = left_padded_batch(seed=5, batch=3)

    def run(switch_fn):
        with torch.inference_mode():
            first = generate(model, ids, mask, max_new_tokens=FIRST, min_new_tokens=FIRST)
        switch_fn(model)
        with torch.inference_mode():
            return _continue(model, first, mask)

    ref = run(lambda m: None)
    replayssm.patch(model, buffer_len=L)
    try:
        out = run(SWITCHES[switch])
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4


def _cache_at(model, prompt, steps):
    """A batch-1 cache after prefilling ``prompt`` and decoding the (teacher-forced) ``steps``."""
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
        for t in range(steps.shape[1]):
            model(steps[:, t:t + 1], past_key_values=cache, use_cache=True)
    return cache


def _merge(a, b):
    """Cache ``a`` extended by the rows of ``b`` (same length): KV, conv and recurrent states, and
    the ReplaySSM buffers with their per-row cursors."""
    for la, lb in zip(a.layers, b.layers):
        for name in ("keys", "values"):
            if isinstance(getattr(la, name, None), torch.Tensor):
                setattr(la, name, torch.cat([getattr(la, name), getattr(lb, name)]))
        for name in ("conv_states", "recurrent_states"):
            states_a, states_b = getattr(la, name, None), getattr(lb, name, None)
            if states_a is not None and states_a[0] is not None:
                states_a[0] = torch.cat([states_a[0], states_b[0]])
        ba, bb = get_buffers(la), get_buffers(lb)
        if ba is not None:
            ba.tensors = {k: torch.cat([v, bb.tensors[k]]) for k, v in ba.tensors.items()}
            ba.cursor = torch.cat([ba.cursor, bb.cursor])
    return a


@pytest.mark.parametrize("switch", ["repatch_buffer_len", "unpatch"])
@pytest.mark.parametrize("family", KIND_FAMILIES)
def test_rows_at_different_cursors_carry_over(family, switch):
    """Two rows at different ring cursors (3 and 2 with L=4: 12 tokens each, 3 and 6 of them
    decoded) in one cache, then re-patch / unpatch and a greedy continuation: equal to stock."""
    model = tiny(family)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(3, 512, (2, 12), generator=g)

    def run(switch_fn):
        cache = _merge(_cache_at(model, tokens[:1, :9], tokens[:1, 9:]), _cache_at(model, tokens[1:, :6], tokens[1:, 6:]))
        buffers = [get_buffers(layer) for layer in cache.layers if get_buffers(layer) is not None]
        switch_fn(model)
        nxt = torch.randint(3, 512, (2, 1), generator=torch.Generator().manual_seed(12))
        ids = torch.cat([tokens, nxt], dim=1)
        return buffers, generate(model, ids, torch.ones_like(ids), past_key_values=cache, max_new_tokens=MORE,
                                 min_new_tokens=MORE)

    _, ref = run(lambda m: None)
    replayssm.patch(model, buffer_len=L)
    try:
        buffers, out = run(SWITCHES[switch])
    finally:
        replayssm.unpatch(model)
    assert buffers and all(b.cursor.tolist() == [0, 0] for b in buffers)  # [3, 2] before the switch: folded
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4


def test_cursors_differ_before_the_switch():
    """The set-up of the test above does put the rows at different cursors."""
    model = tiny("nemotron_h")
    tokens = torch.randint(3, 512, (2, 12), generator=torch.Generator().manual_seed(11))
    replayssm.patch(model, buffer_len=L)
    try:
        cache = _merge(_cache_at(model, tokens[:1, :9], tokens[:1, 9:]), _cache_at(model, tokens[1:, :6], tokens[1:, 6:]))
        cursors = {tuple(get_buffers(layer).cursor.tolist()) for layer in cache.layers if get_buffers(layer)}
    finally:
        replayssm.unpatch(model)
    assert cursors == {(3, 2)}


def test_a_copy_of_a_live_cache_is_carried_over_and_edits_itself():
    """``copy.deepcopy`` of a cache with pending entries: unpatch folds the copy too, and the copy's
    batch-edit methods edit the copy, not the cache it was copied from."""
    model = tiny("qwen3_5")
    ids, mask = left_padded_batch(seed=5, batch=3)
    ref_first = generate(model, ids, mask, max_new_tokens=FIRST, min_new_tokens=FIRST)
    ref = _continue(model, ref_first, mask)
    replayssm.patch(model, buffer_len=L)
    try:
        first = generate(model, ids, mask, max_new_tokens=FIRST, min_new_tokens=FIRST)
        original = first.past_key_values
        first.past_key_values = copy.deepcopy(original)
        layer = next(l for l in original.layers if get_buffers(l) is not None)
        before = layer.recurrent_states[0].clone()
        first.past_key_values.reorder_cache(torch.tensor([2, 1, 0]))
        assert torch.equal(layer.recurrent_states[0], before)
        first.past_key_values.reorder_cache(torch.tensor([2, 1, 0]))
        replayssm.unpatch(model)
        out = _continue(model, first, mask)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_logit_diff(out, ref) < 1e-4


def test_pending_entries_without_their_rows_raise():
    """A cache whose recurrent state lost rows behind the buffers' back (pending entries for rows
    that are gone) raises CacheStateError when used, rather than dropping them."""
    model = tiny("nemotron_h")
    replayssm.patch(model, buffer_len=L)
    try:
        cache = _cache_at(model, torch.randint(3, 512, (2, 6)), torch.randint(3, 512, (2, 3)))
        for layer in cache.layers:
            if get_buffers(layer) is not None:
                layer.recurrent_states[0] = layer.recurrent_states[0][:1]
                layer.conv_states[0] = layer.conv_states[0][:1]
        with pytest.raises(CacheStateError, match="expected the cache's recurrent state to have the 2 rows"):
            with torch.no_grad():
                model(torch.randint(3, 512, (1, 1)), past_key_values=cache, use_cache=True)
        with pytest.raises(CacheStateError):
            replayssm.patch(model, buffer_len=L + 1)
        assert model.get_submodule(replayssm.find_ssm_layers(model)[0].name).replay_options.buffer_len == L
    finally:
        replayssm.unpatch(model)  # cannot fold it: the state is poisoned (NaN), never silently wrong
    assert all(torch.isnan(layer.recurrent_states[0]).all() for layer in cache.layers
               if getattr(layer, "recurrent_states", None) and layer.recurrent_states[0] is not None)


def _compiled_generate_matches_eager(family, device="cpu", backend="eager", patch_backend="torch"):
    model = tiny(family).to(device)
    ids, mask = left_padded_batch(seed=0, batch=2, device=device)
    other = left_padded_batch(seed=1, batch=2, device=device)
    kw = dict(max_new_tokens=5, min_new_tokens=5, cache_implementation="static")
    replayssm.patch(model, buffer_len=3, backend=patch_backend)
    try:
        with torch.compiler.set_stance("force_eager"):
            ref = [generate(model, i, m, **kw) for i, m in ((ids, mask), other)]
        config = transformers.CompileConfig(fullgraph=True, dynamic=False, backend=backend)
        config._compile_all_devices = True  # compile on CPU too
        torch.compiler.reset()
        counters.clear()
        out = [generate(model, ids, mask, compile_config=config, **kw)]
        assert hasattr(model, "_compiled_call")
        with torch.compiler.set_stance("fail_on_recompile"):  # a fresh cache: same graph
            out.append(generate(model, *other, compile_config=config, **kw))
        assert counters["stats"]["unique_graphs"] == 1  # no recompilation from one decode step to the next
    finally:
        replayssm.unpatch(model)
        torch.compiler.reset()
        model.to("cpu")
        for attr in ("_compiled_call", "_last_compile_config"):
            model.__dict__.pop(attr, None)
    for o, r in zip(out, ref):
        assert torch.equal(o.sequences, r.sequences)
        assert max_logit_diff(o, r) < 1e-4


@pytest.mark.parametrize("family", KIND_FAMILIES)
def test_generate_with_a_fullgraph_compiled_forward(family):
    """generate() with CompileConfig(fullgraph=True) on a patched model: the decode step compiles as
    one graph (buffers exist before it runs), never recompiles for a new cache, and gives the
    eager tokens. Dynamo's "eager" backend: the graph capture is what is tested (inductor's CPU
    code generation would take a minute per family here)."""
    _compiled_generate_matches_eager(family)


@pytest.mark.gpu
@pytest.mark.parametrize("family", KIND_FAMILIES)
def test_generation_continues_exactly_across_repatch_and_unpatch_on_cuda(family):
    model = tiny(family).to("cuda")
    ids, mask = left_padded_batch(seed=5, batch=3, device="cuda")
    try:
        ref_first, ref = _two_stage(model, ids, mask, lambda m: None, "cuda")
        for switch in CUDA_SWITCHES.values():
            replayssm.patch(model, buffer_len=L, backend="triton")
            try:
                first, out = _two_stage(model, ids, mask, switch, "cuda")
            finally:
                replayssm.unpatch(model)
            assert torch.equal(first.sequences, ref_first.sequences)
            assert torch.equal(out.sequences, ref.sequences)
            assert max_logit_diff(out, ref) < 1e-3
    finally:
        model.to("cpu")


@pytest.mark.gpu
def test_generate_with_a_fullgraph_compiled_forward_on_cuda():
    _compiled_generate_matches_eager("nemotron_h", device="cuda", backend="inductor", patch_backend="triton")
