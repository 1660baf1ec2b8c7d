"""CUDA-graph decoding inside generate(): the logic that runs without CUDA.

A stand-in for ``CudaGraph`` re-runs the captured function on the static input tensors at every
replay and copies its outputs into the first call's output tensors, so the pooling, the static
inputs, the warm-up / capture / replay sequence and the fallbacks are exercised on the CPU; the
real capture is tested on the GPU (tests/test_graph_decode_gpu.py).
"""

import contextlib
import functools
import inspect
import logging

import pytest
import torch
import transformers

import replayssm
from replayssm.errors import RollbackError
from replayssm.patches import compat, graph_decode, speculative
from replayssm.patches.cache_state import get_buffers

from helpers import generate, left_padded_batch, max_logit_diff, tiny
from speculative_helpers import ScriptedDrafter, drafting

FAMILIES = ["nemotron_h", "bamba", "qwen3_5", "kimi_linear"]


HOST_SYNCS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def no_host_sync():
    """Every tensor-to-host read raises inside: on a GPU each is a sync, which a capture refuses
    (and a value read on the host would be frozen into the graph)."""

    def refuse(name):
        def read(self, *args, **kwargs):
            raise RuntimeError(f"Tensor.{name} (a host sync) during a capture")
        return read

    saved = {name: getattr(torch.Tensor, name) for name in HOST_SYNCS}
    for name in HOST_SYNCS:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class ReplayByCall:
    """CPU stand-in for a CUDA graph: replay() calls the captured function again; the capture
    refuses host syncs, as a CUDA capture does."""

    instances: list["ReplayByCall"] = []

    def __init__(self, pool):
        self.fn = self.output = None
        self.replays = 0
        ReplayByCall.instances.append(self)

    new_pool = staticmethod(lambda: None)
    memory_allocated = staticmethod(lambda: 0)

    def capture_and_run(self, fn):
        self.fn = fn
        with no_host_sync():
            self.output = fn()
        return self.output

    def replay(self):
        self.replays += 1
        fresh = self.fn()
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor):
                self.output[key].copy_(value)

    replay_ahead = replay  # one stream: the step runs at once

    def wait_ahead(self):
        pass


@pytest.fixture
def cpu_graphs(monkeypatch):
    ReplayByCall.instances.clear()
    monkeypatch.setattr(graph_decode, "CudaGraph", ReplayByCall)
    monkeypatch.setattr(graph_decode, "cuda_graphs_available", lambda device: True)
    return ReplayByCall.instances


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_decode_equals_eager_patched(family, cpu_graphs):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=3)
    kw = dict(max_new_tokens=12, min_new_tokens=12)
    try:
        replayssm.patch(model, buffer_len=4)
        eager = generate(model, ids, mask, **kw)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        graphs = generate(model, ids, mask, **kw)
        assert torch.equal(graphs.sequences, eager.sequences)
        assert max_logit_diff(graphs, eager) < 1e-5
        # the returned cache was handed to the caller, so the pool does not keep it
        assert replayssm.graph_report(model) == []
        # without returning the cache, the slot and its graph stay for the next call
        seq1 = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kw)
        seq2 = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kw)
        assert torch.equal(seq1, eager.sequences) and torch.equal(seq2, eager.sequences)
        (report,) = replayssm.graph_report(model)
        assert report["batch_size"] == 3 and report["captured"] and report["captures"] == 1
        assert report["max_len"] == 64 and report["fallback"] is None
        # the steps' inputs were built without transformers' preparation once checked against it
        (slot,) = graph_decode.GraphDecoder.of(model).slots
        assert slot.inputs.trusted is True
        graph = cpu_graphs[-1]
        decode_steps = kw["max_new_tokens"] - 1  # the first token comes from the prefill
        # first call: step 1 warms up, step 2 is captured (and run), the rest replay; second call: all replay
        assert graph.replays == (decode_steps - 2) + decode_steps
        # every replay after the one in a call's first graph step was launched from the stopping criterion
        assert report["steps_launched_ahead"] == (decode_steps - 2) + (decode_steps - 1)
    finally:
        replayssm.unpatch(model)
    assert not hasattr(model, graph_decode.ATTR)
    assert not {"forward", "generate", "prepare_inputs_for_generation"} & model.__dict__.keys()


def _prompt_and_greedy_kwargs(seed: int):
    """A 9-token prompt and the keywords of a 40-token greedy ``generate()``."""
    ids = torch.randint(3, 512, (1, 9), generator=torch.Generator().manual_seed(seed))
    return ids, dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, max_new_tokens=40,
                     min_new_tokens=40)


@pytest.mark.parametrize("family", [*FAMILIES, "falcon_h1"])
def test_assisted_generation_replays_its_windows(family, cpu_graphs, caplog):
    """Scripted drafts of 0..4 tokens (rounds of one plain step included): token for token the plain
    greedy output, through window graphs captured once per shape and kept for the next call
    (before transformers 5.24, on a ``StaticCache`` subclass whose attention layers crop; falcon_h1:
    layers holding both an SSM and an attention part)."""
    model = tiny(family)
    if compat.assisted_generation_gap(model):
        pytest.skip(compat.assisted_generation_gap(model))
    ids, kw = _prompt_and_greedy_kwargs(seed=8)
    try:
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        ref = model.generate(ids, **kw)
        plain_graphs = len(cpu_graphs)
        replays = []
        for _ in range(2):  # the same drafts twice
            drafter = ScriptedDrafter(model, ref, 4, seed=1, min_draft=0)
            before = sum(g.replays for g in cpu_graphs[plain_graphs:])
            with drafting(model, drafter), caplog.at_level(logging.WARNING, logger="replayssm"):
                out = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
            assert torch.equal(out, ref), drafter.log
            replays.append(sum(g.replays for g in cpu_graphs[plain_graphs:]) - before)
        assert "CUDA-graph decoding not used" not in caplog.text
        windows = [r for r in replayssm.graph_report(model) if r["assisted"]]
        assert len(windows) == 1 and windows[0]["fallback"] is None
        assert 2 <= windows[0]["window_graphs"] <= 5  # one per window length seen twice (1..5 tokens)
        # the second call finds the first's graphs: every forward after the prefill replays (one per
        # logged round after the first, plus the last one, for which the drafter had no room)
        assert 0 < replays[0] < replays[1] == len(drafter.log)
        assert windows[0]["window_replays"] == sum(replays)
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("assisted", [False, True])
def test_decode_context_is_entered_once_a_call_and_left_at_its_end(assisted, cpu_graphs):
    """transformers' decode context (a MoE's experts switched for decoding; 5.24 enters it around every
    verify forward, 5.17 in no assisted call) is entered for the first decode forward of a graph-decoded
    call, held over every later forward and left when ``generate`` returns; outside such a call it is
    the original; unpatch restores it."""
    model = tiny("nemotron_h")
    if not hasattr(model, compat.DECODE_SWITCH):
        pytest.skip(f"this transformers has no {compat.DECODE_SWITCH}")
    if assisted and compat.assisted_generation_gap(model):
        pytest.skip(compat.assisted_generation_gap(model))
    # transformers 5.17's assisted loop never enters the context (its sampling loop does): the graph
    # decoder then enters it itself, inside the first forward after the prefill
    loop = transformers.GenerationMixin._assisted_decoding if assisted else transformers.GenerationMixin._sample
    entered = compat.DECODE_SWITCH in inspect.getsource(loop)
    expected_entry = 1 if entered else 2 if assisted else None
    events, forwards = [], []

    @contextlib.contextmanager
    def switch():
        events.append(("enter", len(forwards)))
        yield
        events.append(("exit", len(forwards)))

    model._optimize_model_for_decode = switch  # (the instance's own: unpatch must bring it back)
    ids, kw = _prompt_and_greedy_kwargs(seed=3)
    kw["max_new_tokens"] = kw["min_new_tokens"] = 12
    try:
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        ref = model.generate(ids, **kw)
        inner = model.forward

        @functools.wraps(inner)  # (generate() checks its keywords against the signature)
        def counted(*args, **kwargs):
            forwards.append(1)
            return inner(*args, **kwargs)

        model.forward = counted
        for _ in range(2):
            events.clear()
            forwards.clear()
            if assisted:
                with drafting(model, ScriptedDrafter(model, ref, 4, seed=2, min_draft=0)):
                    out = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
            else:
                out = model.generate(ids, **kw)
            assert torch.equal(out, ref)
            # entered for the first decode forward (after the prefill), left after the last one
            expected = [("enter", expected_entry), ("exit", len(forwards))] if expected_entry else []
            assert len(forwards) > 2 and events == expected, events
        with model._optimize_model_for_decode():  # outside generate(): the original context
            pass
        assert events[-2:] == [("enter", len(forwards)), ("exit", len(forwards))]
    finally:
        replayssm.unpatch(model)
    assert model.__dict__["_optimize_model_for_decode"] is switch


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_assisted_windows_skip_transformers_input_preparation(family, cpu_graphs):
    """A window's inputs (its T tokens and positions, the padding mask in T causal rows) are built
    from the call's first window of that length once they reproduced transformers' own: later
    rounds prepare nothing, and the tokens stay the plain greedy ones."""
    model = tiny(family)
    if compat.assisted_generation_gap(model):
        pytest.skip(compat.assisted_generation_gap(model))
    ids, kw = _prompt_and_greedy_kwargs(seed=4)
    try:
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        ref = model.generate(ids, **kw)
        decoder = graph_decode.GraphDecoder.of(model)
        real, prepared = decoder._original_prepare, []
        decoder._original_prepare = lambda *a, **k: prepared.append(k.get("next_sequence_length")) or real(*a, **k)
        for _ in range(2):
            prepared.clear()
            drafter = ScriptedDrafter(model, ref, 4, seed=5, min_draft=4)  # windows of 5 (4 drafts + 1)
            with drafting(model, drafter):
                out = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
            assert torch.equal(out, ref), drafter.log
        (slot,) = [s for s in decoder.slots if s.assisted]
        assert slot.window_inputs[5].trusted is True
        # the second call: the prefill, then the first window of 5 (its template); the rest are built
        assert prepared[:2] == [None, 5] and prepared.count(5) == 1 and len(drafter.log) > 4, prepared
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_window_graphs_check_the_cache_once_a_call_and_recapture_when_it_moved(family, cpu_graphs, monkeypatch):
    """Each window graph compares the cache's tensor addresses with those it was captured on once per
    ``generate()`` call (not every round); a cache tensor that moved between calls makes it capture
    again, and the tokens stay the plain greedy ones."""
    model = tiny(family)
    if compat.assisted_generation_gap(model):
        pytest.skip(compat.assisted_generation_gap(model))
    ids, kw = _prompt_and_greedy_kwargs(seed=6)
    walks = []
    real_addresses = graph_decode._addresses
    monkeypatch.setattr(graph_decode, "_addresses", lambda cache: walks.append(1) or real_addresses(cache))
    try:
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        ref = model.generate(ids, **kw)
        decoder = graph_decode.GraphDecoder.of(model)

        def assisted_call():
            walks.clear()
            drafter = ScriptedDrafter(model, ref, 4, seed=2, min_draft=4)  # windows of 5 (4 drafts + 1)
            with drafting(model, drafter):
                out = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
            assert torch.equal(out, ref), drafter.log
            return drafter

        assisted_call()
        assisted_call()
        (slot,) = [s for s in decoder.slots if s.assisted]
        graphs, captures, replayed = len(slot.windows), slot.captures, slot.window_replays
        drafter = assisted_call()  # every window replays; each graph walks the cache once
        assert slot.window_replays - replayed > len(drafter.log) - 2 and len(walks) == graphs
        layer = next(layer for layer in slot.cache.layers if get_buffers(layer) is not None)
        buffers = get_buffers(layer)
        buffers.tensors[speculative.HIST] = buffers.tensors[speculative.HIST].clone()  # a tensor moves
        assisted_call()
        assert slot.captures > captures  # the window graph of 5 was captured again on the moved tensor
    finally:
        replayssm.unpatch(model)


def _recording_prefill(model, ids):
    """A cache recording its past (as assisted generation makes it) after a prefill of ``ids``'s
    first 9 tokens; returns (cache, the model's cache keyword)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    key = compat.generate_cache_kwarg(model)
    model(input_ids=ids[:, :9], **{key: cache})
    return cache, key


def test_a_rollback_on_a_cache_not_recording_its_past_is_refused():
    """Without the conv history (a plain cache) nothing can move back: an int or per-row count is
    refused, a zero count is a no-op."""
    from transformers import DynamicCache

    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=8)
    try:
        cache = DynamicCache(config=model.config)
        ids = torch.randint(3, 512, (1, 10), generator=torch.Generator().manual_seed(2))
        key = compat.generate_cache_kwarg(model)
        model(input_ids=ids[:, :9], **{key: cache})
        model(input_ids=ids[:, 9:], **{key: cache})
        layer = next(layer for layer in cache.layers if get_buffers(layer) is not None)
        cursor = get_buffers(layer).cursor.clone()
        for n in (2, torch.tensor([1])):
            with pytest.raises(RollbackError, match="expected a cache recording its past"):
                speculative.rollback_layer(layer, n)
        speculative.rollback_layer(layer, torch.tensor([0]))
        assert torch.equal(get_buffers(layer).cursor, cursor)
    finally:
        replayssm.unpatch(model)


def test_a_crop_settles_the_cache_and_a_window_unsettles_it():
    """What a window graph's replay waits for: every ReplaySSM layer with all its entries committed
    (after a crop), which a window forward (or a replay, ``unsettle``) ends."""
    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=8, cuda_graphs=True)
    try:
        ids = torch.randint(3, 512, (1, 12), generator=torch.Generator().manual_seed(9))
        cache, key = _recording_prefill(model, ids)
        assert not speculative.settled(cache)  # the prefill's window entries are drafts until a crop
        cache.crop(-2)
        assert speculative.settled(cache)
        model(input_ids=ids[:, 9:12], **{key: cache})
        assert not speculative.settled(cache)
        cache.crop(0)
        assert speculative.settled(cache)
        speculative.unsettle(cache, 3)
        assert not speculative.settled(cache)
    finally:
        replayssm.unpatch(model)


def _count_grouped_rollbacks(monkeypatch) -> list:
    """The (layers, n) of every one-launch rollback from here on, run on the PyTorch path (the Triton one
    forced, as on a GPU)."""
    import replayssm.kernels.rollback as rollback_kernels

    calls = []
    monkeypatch.setattr(speculative, "resolve_backend", lambda backend, device: "triton")
    monkeypatch.setattr(rollback_kernels, "layers_rollback_triton", lambda layers, n, table=None: (
        calls.append((len(layers), n)), rollback_kernels.layers_rollback_reference(layers, n))[1])
    return calls


def test_a_cache_crop_rolls_every_layer_back_at_once_and_its_copies_their_own(monkeypatch):
    """The cache's ``crop(-n)`` of tokens of the last window rolls all SSM layers back in one call of
    ``layers_rollback`` (here on the PyTorch path: the Triton one is forced and counted), settling the
    cache as the per-layer crops do; a deep copy of the cache crops itself, not the original; a crop past
    the last window goes through each layer's checks."""
    import copy

    model = tiny("nemotron_h")
    replayssm.patch(model, buffer_len=8)
    calls = _count_grouped_rollbacks(monkeypatch)
    try:
        ids = torch.randint(3, 512, (1, 12), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            cache, key = _recording_prefill(model, ids)
            model(input_ids=ids[:, 9:12], **{key: cache})
        layers = [layer for layer in cache.layers if get_buffers(layer) is not None]
        before = [get_buffers(layer).cursor.clone() for layer in layers]
        twin = copy.deepcopy(cache)
        assert twin.crop.__self__ is twin and cache.crop.__self__ is cache
        cache.crop(-2)
        assert calls == [(len(layers), 2)] and speculative.settled(cache) and not speculative.settled(twin)
        assert all(torch.equal(get_buffers(layer).cursor, c - 2) for layer, c in zip(layers, before))
        twin.crop(-1)
        assert calls[-1] == (len(layers), 1)
        assert all(torch.equal(get_buffers(layer).cursor, c - 2) for layer, c in zip(layers, before))
        assert all(torch.equal(get_buffers(layer).cursor, c - 1)
                   for layer, c in zip([x for x in twin.layers if get_buffers(x) is not None], before))
        with pytest.raises(RollbackError):  # beyond the tokens the ring still holds: the per-layer checks
            cache.crop(-12)
        assert len(calls) == 2
    finally:
        replayssm.unpatch(model)


def test_a_crop_count_given_as_a_device_tensor_is_read_once(monkeypatch):
    """transformers 5.17's assisted loop crops by ``-(candidate_length - n_matches)``, a 0-d tensor:
    the cache reads it once and rolls every SSM layer back in its one launch, with the same result
    as an integer count; a count past the ring still goes through each layer's checks."""
    model = tiny("nemotron_h")
    replayssm.patch(model, buffer_len=8)
    calls = _count_grouped_rollbacks(monkeypatch)
    try:
        ids = torch.randint(3, 512, (1, 12), generator=torch.Generator().manual_seed(4))
        cursors = []
        for count in (2, torch.tensor(2)):
            with torch.no_grad():
                cache, key = _recording_prefill(model, ids)
                model(input_ids=ids[:, 9:12], **{key: cache})
            cache.crop(-count)
            layers = [layer for layer in cache.layers if get_buffers(layer) is not None]
            cursors.append([get_buffers(layer).cursor.clone() for layer in layers])
            assert calls[-1] == (len(layers), 2) and type(calls[-1][1]) is int and speculative.settled(cache)
        assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(*cursors))
        with pytest.raises(RollbackError, match="still in its ReplaySSM ring"):
            cache.crop(-torch.tensor(12))
        assert len(calls) == 2
    finally:
        replayssm.unpatch(model)


def test_a_crop_within_the_last_window_reads_no_device_value(monkeypatch):
    """Rolling back tokens of the last window needs no check of the cursors (the flush-first rule keeps
    them in the ring): no tensor is read on the host. Past the window the check runs, and raises
    where the ring no longer holds the tokens; the cache, part cropped, then refuses to decode until
    a reset."""
    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=8)
    try:
        ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(9))
        cache, key = _recording_prefill(model, ids)
        cache.crop(-2)
        model(input_ids=ids[:, 9:14], **{key: cache})
        reads = []
        for name in ("__bool__", "item", "tolist", "__int__"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, _n=name: reads.append(_n) or
                                _real(self, *a))
        cache.crop(-3)
        cache.crop(-2)  # 5 of the 5-token window
        assert reads == []
        with pytest.raises(RollbackError):
            cache.crop(-1)  # past the window: checked on the cursors (the window's start), and refused
        assert reads
        monkeypatch.undo()
        # the attention layers before the refusing one were cropped: the cache refuses to decode on
        with pytest.raises(RollbackError, match="part rolled back"):
            model(input_ids=ids[:, 9:10], **{key: cache})
        cache.reset()
        model(input_ids=ids[:, :9], **{key: cache})
    finally:
        replayssm.unpatch(model)


def test_graph_slots_per_batch_and_sampling(cpu_graphs):
    model = tiny("qwen3_5")
    try:
        replayssm.patch(model, buffer_len=3, cuda_graphs=True, graph_max_len=64)
        for batch in (1, 2):
            ids, mask = left_padded_batch(seed=batch, batch=batch)
            kw = dict(attention_mask=mask, do_sample=True, top_k=20, temperature=0.8, num_return_sequences=2,
                      max_new_tokens=9, min_new_tokens=9, pad_token_id=0)
            torch.manual_seed(0)
            graphs = model.generate(ids, **kw)
            replayssm.patch(model, buffer_len=3, cuda_graphs=False)
            torch.manual_seed(0)
            eager = model.generate(ids, **kw)
            replayssm.patch(model, buffer_len=3, cuda_graphs=True, graph_max_len=64)
            assert torch.equal(graphs, eager)
        # graph_max_len too small for the call: eager, with a log line
    finally:
        replayssm.unpatch(model)


def test_fallbacks_log_why_and_stay_correct(cpu_graphs, caplog):
    model = tiny("nemotron_h")
    ids, mask = left_padded_batch(seed=4, batch=2)
    kw = dict(max_new_tokens=8, min_new_tokens=8)
    try:
        replayssm.patch(model, buffer_len=4)
        ref_beam = generate(model, ids, mask, num_beams=2, **kw)
        ref = generate(model, ids, mask, **kw)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True, graph_max_len=12)
        with caplog.at_level(logging.WARNING, logger="replayssm"):
            beam = generate(model, ids, mask, num_beams=2, **kw)
            long = generate(model, ids, mask, **kw)  # 9 + 8 positions > graph_max_len
        assert torch.equal(beam.sequences, ref_beam.sequences)
        assert torch.equal(long.sequences, ref.sequences)
        text = caplog.text
        assert "beam search" in text and "graph_max_len=12" in text
        assert replayssm.graph_report(model) == [] and not cpu_graphs
    finally:
        replayssm.unpatch(model)


def test_a_capture_that_fails_decodes_eagerly_with_the_same_tokens(cpu_graphs, monkeypatch, caplog):
    """A forward that cannot be captured (here every capture raises, as an op that syncs with the host would
    on a GPU), in plain decoding and in assisted windows: the tokens of the eager patched path, one log line
    naming the cause, the cause in ``graph_report``, and no graph kept or replayed."""
    def refuse(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

    monkeypatch.setattr(ReplayByCall, "capture_and_run", refuse)
    model = tiny("nemotron_h")
    ids, mask = left_padded_batch(seed=5, batch=2)
    kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=10, min_new_tokens=10)
    prompt, assisted_kw = _prompt_and_greedy_kwargs(seed=6)
    try:
        replayssm.patch(model, buffer_len=8)
        ref = model.generate(ids, attention_mask=mask, **kw)
        ref_one = model.generate(prompt, **assisted_kw)
        replayssm.patch(model, buffer_len=8, cuda_graphs=True)
        with caplog.at_level(logging.WARNING, logger="replayssm"):
            for _ in range(2):  # the second call finds the failed slot and stays eager
                assert torch.equal(model.generate(ids, attention_mask=mask, **kw), ref)
            if not compat.assisted_generation_gap(model):
                with drafting(model, ScriptedDrafter(model, ref_one, 4, seed=2, min_draft=0)):
                    assert torch.equal(model.generate(prompt, prompt_lookup_num_tokens=4, **assisted_kw), ref_one)
        cause = "capture failed (RuntimeError: operation not permitted when stream is capturing)"
        assert caplog.text.count(cause) == 1, caplog.text
        reports = replayssm.graph_report(model)
        assert [r["assisted"] for r in reports] == [False] + ([] if compat.assisted_generation_gap(model) else [True])
        assert all(r["fallback"] == cause and not r["captured"] and r["captures"] == 0 for r in reports)
        assert all(g.replays == 0 for g in cpu_graphs)
    finally:
        replayssm.unpatch(model)


def test_off_cuda_falls_back_once(caplog):
    model = tiny("bamba")
    ids, mask = left_padded_batch(seed=5, batch=2)
    try:
        replayssm.patch(model, buffer_len=4)
        ref = generate(model, ids, mask, max_new_tokens=6)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        with caplog.at_level(logging.WARNING, logger="replayssm"):
            a = generate(model, ids, mask, max_new_tokens=6)
            b = generate(model, ids, mask, max_new_tokens=6)
        assert torch.equal(a.sequences, ref.sequences) and torch.equal(b.sequences, ref.sequences)
        assert caplog.text.count("CUDA graphs need a CUDA device") == 1
    finally:
        replayssm.unpatch(model)


def test_config_records_graph_options():
    cfg = replayssm.ReplaySSMConfig(cuda_graphs=True, graph_max_len=1024)
    block = cfg.to_block([])
    assert block["cuda_graphs"] is True and block["graph_max_len"] == 1024
    again = replayssm.ReplaySSMConfig.from_block(block)
    assert again.cuda_graphs and again.graph_max_len == 1024
    for bad in (dict(cuda_graphs="yes"), dict(graph_max_len=1), dict(graph_max_len=True)):
        with pytest.raises(replayssm.ConfigError):
            replayssm.ReplaySSMConfig(**bad)


def test_two_models_keep_their_own_graphs(cpu_graphs):
    a, b = tiny("nemotron_h"), tiny("kimi_linear")
    ids, mask = left_padded_batch(seed=6, batch=2)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=7, min_new_tokens=7)
    try:
        refs = []
        for model in (a, b):
            replayssm.patch(model, buffer_len=3)
            refs.append(model.generate(ids, **kw))
            replayssm.patch(model, buffer_len=3, cuda_graphs=True)
        for _ in range(2):  # interleaved calls: each model replays its own graph on its own cache
            for model, ref in zip((a, b), refs):
                assert torch.equal(model.generate(ids, **kw), ref)
        ra, rb = replayssm.graph_report(a), replayssm.graph_report(b)
        assert len(ra) == len(rb) == 1 and ra[0]["captures"] == rb[0]["captures"] == 1
        assert graph_decode.GraphDecoder.of(a).slots[0].cache is not graph_decode.GraphDecoder.of(b).slots[0].cache
    finally:
        replayssm.unpatch(a)
        replayssm.unpatch(b)


@pytest.mark.parametrize("family", ["qwen4_exp", "glm5_next"])
def test_indexed_attention_layers_decode_eagerly(family, cpu_graphs, caplog):
    """Families whose static cache has sparse-attention (indexed) layers are not captured: eager, same tokens."""
    model = tiny(family)
    ids, mask = left_padded_batch(seed=8, batch=2)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=6, min_new_tokens=6)
    try:
        replayssm.patch(model, buffer_len=3)
        ref = model.generate(ids, **kw)
        replayssm.patch(model, buffer_len=3, cuda_graphs=True)
        with caplog.at_level(logging.WARNING, logger="replayssm"):
            out = model.generate(ids, **kw)
        assert torch.equal(out, ref) and replayssm.graph_report(model) == [] and not cpu_graphs
        assert "StaticIndexedLayer" in caplog.text
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_grouped_decode_attention_equals_sdpa(family, monkeypatch):
    """A patched model's attention (off CUDA, so without the Triton decode kernel) is sdpa's, except that a
    one-token query runs on the key/value heads (5.17-5.23 repeat the KV cache per query head, 5.24 not):
    same logits, and the one-token query really runs on the key/value heads."""
    from replayssm.patches import attention_switch

    model = tiny(family)
    ids, mask = left_padded_batch(batch=3, length=7)
    want = generate(model, ids, mask, max_new_tokens=6)
    shapes = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: shapes.append((q.shape, k.shape)) or sdpa(q, k, v, **kw))
    switched = attention_switch.use_grouped_decode_attention(model)
    try:
        assert switched
        got = generate(model, ids, mask, max_new_tokens=6)
    finally:
        attention_switch.restore_decode_attention(model)
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(got.sequences, want.sequences) and max_logit_diff(got, want) < 1e-5
    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    assert heads > kv
    grouped = [q for q, k in shapes if q[1] == k[1] == kv and q[2] == heads // kv]  # (B, H_kv, G, D)
    assert grouped and not [q for q, k in shapes if q[2] == 1]  # no decode step ran on repeated heads


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_patch_switches_attention_and_norms_and_unpatch_restores(cuda_graphs):
    from replayssm.patches import attention_switch

    model = tiny("qwen3_5")
    replayssm.patch(model, buffer_len=4, cuda_graphs=cuda_graphs)
    try:
        fused = [m for m in model.modules() if "_replayssm_rmsnorm_form" in m.__dict__]
        assert fused and all("forward" in m.__dict__ for m in fused)
        assert model.config._attn_implementation == "sdpa"
        attention = [m for m in model.modules() if hasattr(m, "num_key_value_groups")]
        assert attention and all(m.config._attn_implementation == attention_switch.GROUPED_SDPA for m in attention)
    finally:
        replayssm.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert not any("_replayssm_rmsnorm_form" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_step_inputs_trusted_for_one_unpadded_row(family, cpu_graphs):
    """Batch 1 without padding (the row's ids are a (1, n) slice: its strides differ from a copy's)."""
    model = tiny(family)
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, max_new_tokens=9)
    try:
        replayssm.patch(model, buffer_len=4)
        want = model.generate(ids, **kw)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        assert all(torch.equal(model.generate(ids, **kw), want) for _ in range(2))
        (slot,) = graph_decode.GraphDecoder.of(model).slots
        assert slot.inputs.trusted is True
    finally:
        replayssm.unpatch(model)


def test_step_inputs_are_checked_before_they_are_trusted():
    """StepInputs reproduces transformers' inputs or steps aside: a per-step input it does not know
    (here a counter) makes the check fail, and transformers' own preparation is used from then on."""
    from replayssm.patches.graph_inputs import StepInputs, same_inputs

    calls = []

    def prepared(n, extra):
        calls.append(n)
        mask4d = torch.zeros(2, 1, 1, 8, dtype=torch.bool)
        mask4d[:, 0, 0, :n] = torch.tensor([[0] + [1] * (n - 1), [1] * n], dtype=torch.bool)
        return {"input_ids": torch.full((2, 1), n), "attention_mask": {"full": mask4d, "linear": None},
                "use_cache": True, **extra}

    def kwargs(n):
        mask2d = torch.ones(2, n, dtype=torch.long)
        mask2d[0, 0] = 0
        return {"attention_mask": mask2d, "next_sequence_length": 1}

    def ids(n):
        return torch.full((2, n), n)

    good = StepInputs()
    for n in (3, 4, 5, 6):
        got = good.prepare(lambda n=n: prepared(n, {}), ids(n), kwargs(n))
        assert same_inputs(got, prepared(n, {}))
    assert good.trusted is True and calls.count(5) == 1 and calls.count(6) == 1  # step 3 on: no preparation
    good.new_call()  # a shorter call reuses the mask: positions the last call reached are cleared
    good.prepare(lambda: prepared(3, {}), ids(3), kwargs(3))
    got = good.prepare(lambda: prepared(4, {}), ids(4), kwargs(4))
    assert same_inputs(got, prepared(4, {}))

    # a later call of another structure (a per-step input the check never saw) is checked again
    good.new_call()
    for n in (3, 4, 5):
        got = good.prepare(lambda n=n: prepared(n, {"step": torch.tensor(n)}), ids(n), kwargs(n))
        assert same_inputs(got, prepared(n, {"step": torch.tensor(n)}))
    assert good.trusted is False

    bad = StepInputs()
    for n in (3, 4, 5):
        got = bad.prepare(lambda n=n: prepared(n, {"step": torch.tensor(n)}), ids(n), kwargs(n))
        assert same_inputs(got, prepared(n, {"step": torch.tensor(n)}))
    assert bad.trusted is False


def test_launch_ahead_stops_at_eos_and_leaves_the_next_call_exact(cpu_graphs):
    """End-of-sequence ends the loop while a step launched ahead has advanced the pooled cache; the
    next call starts from a reset cache and is exact again."""
    model = tiny("qwen3_5")
    ids, mask = left_padded_batch(seed=9, batch=1)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=12)
    try:
        replayssm.patch(model, buffer_len=4)
        full = model.generate(ids, min_new_tokens=12, **kw)
        eos = int(full[0, ids.shape[1] + 6])  # the 7th new token ends the sequence
        ref = model.generate(ids, eos_token_id=eos, **kw)
        assert ref.shape[1] == ids.shape[1] + 7
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        for _ in range(2):
            assert torch.equal(model.generate(ids, eos_token_id=eos, **kw), ref)
            assert torch.equal(model.generate(ids, min_new_tokens=12, **kw), full)
        assert replayssm.graph_report(model)[0]["steps_launched_ahead"] > 0
    finally:
        replayssm.unpatch(model)


def test_a_step_launched_on_other_inputs_raises(cpu_graphs, monkeypatch):
    from replayssm.errors import GraphDecodeError
    from replayssm.patches import launch_ahead

    model = tiny("nemotron_h")
    ids, mask = left_padded_batch(seed=10, batch=2)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=8, min_new_tokens=8)
    original = launch_ahead.LaunchAhead._launch

    def wrong_token(self, input_ids):
        original(self, input_ids)
        self.slot.static_inputs["input_ids"].add_(1)  # the graph's inputs are not the loop's next ones

    try:
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        model.generate(ids, **kw)
        monkeypatch.setattr(launch_ahead.LaunchAhead, "_launch", wrong_token)
        with pytest.raises(GraphDecodeError, match="launched ahead"):
            model.generate(ids, **kw)
        monkeypatch.setattr(launch_ahead.LaunchAhead, "_launch", original)
        replayssm.patch(model, buffer_len=4)
        ref = model.generate(ids, **kw)
        replayssm.patch(model, buffer_len=4, cuda_graphs=True)
        assert torch.equal(model.generate(ids, **kw), ref)
    finally:
        replayssm.unpatch(model)
