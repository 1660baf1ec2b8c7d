"""Every rewritable tiny family: generate() with ReplaySSM equals the stock model (fp32, CPU).

Greedy over 64 new tokens with L in {1, 3, 16} on a left-padded batch (so generations
cross many flushes): identical tokens, logits within 1e-4, state dict unchanged, and
transformers' own per-step recurrent function is never called while decoding.
Beam search returns the same sequences.
"""

import sys

import pytest
import torch

import replayssm
from replayssm.patches.registry import original_class

from replayssm.patches.kinds import KINDS

from helpers import (MAMBA2_FAMILIES, REWRITABLE_FAMILIES, generate, generate_patched, left_padded_batch,
                     max_logit_diff, tiny)

NEW = 64


@pytest.fixture
def forbid_stock_decode(monkeypatch):
    """Make transformers' per-step recurrent function raise while a patched model decodes."""

    def install(model):
        record = replayssm.find_ssm_layers(model)[0]
        module = sys.modules[original_class(model.get_submodule(record.name)).__module__]

        def boom(*args, **kwargs):
            raise AssertionError("the stock per-step recurrent function was called")

        monkeypatch.setattr(module, KINDS[record.kind].stock_step, boom)

    return install


@pytest.mark.parametrize("family", REWRITABLE_FAMILIES)
def test_greedy_matches_stock_across_flushes(family, forbid_stock_decode):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=1)
    ref = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        for L in (1, 3, 16):
            replayssm.patch(model, buffer_len=L)
            assert all(r.patched for r in replayssm.find_ssm_layers(model))
            forbid_stock_decode(model)
            out = generate(model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
            assert torch.equal(out.sequences, ref.sequences), f"L={L}"
            assert max_logit_diff(out, ref) < 1e-4, f"L={L}"
            state = model.state_dict()
            assert state.keys() == state_before.keys()
            assert all(torch.equal(state[k], state_before[k]) for k in state)
            replayssm.unpatch(model)
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family", MAMBA2_FAMILIES + ["qwen3_5", "kimi_linear"])
def test_beam_search_matches_stock(family):
    model = tiny(family)
    ids, mask = left_padded_batch(seed=2, batch=2)
    kw = dict(max_new_tokens=24, min_new_tokens=24, num_beams=3, num_return_sequences=2, output_logits=False)
    ref = generate(model, ids, mask, **kw)
    out = generate_patched(model, ids, mask, dict(buffer_len=4), **kw)
    assert torch.equal(out.sequences, ref.sequences)
