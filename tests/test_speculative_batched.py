"""The batched speculative loop (examples/speculative_batched.py) and the per-row rollback API:
rows accepting different numbers of drafts in one verify, outputs equal to plain greedy."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

import replayssm
from replayssm.errors import RollbackError
from replayssm.speculation import rollback, speculative_cache, verify

from helpers import generate, tiny

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "speculative_batched.py"


def _example():
    spec = importlib.util.spec_from_file_location("speculative_batched", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_and_matches_plain_greedy():
    assert _example().main(["--rows", "3", "--new", "24", "--device", "cpu"]) == 0


def test_rows_accepting_different_counts_match_plain_greedy():
    """A drafter that knows each row's greedy continuation and spoils it at a random place per row
    and round: every round rows accept 0..K drafts, independently."""
    example = _example()
    model = tiny("mamba2")
    prompt = torch.randint(3, 512, (4, 7), generator=torch.Generator().manual_seed(1))
    new, k = 40, 5
    replayssm.patch(model, buffer_len=8)
    try:
        ref = generate(model, prompt, torch.ones_like(prompt), max_new_tokens=new + 2 * k + 2,
                       min_new_tokens=new + 2 * k + 2).sequences
        oracle = {tuple(ref[b, :7].tolist()): ref[b].tolist() for b in range(4)}
        gen = torch.Generator().manual_seed(2)

        def draft(seq, kk):
            full = oracle[tuple(seq[:7])]
            right = (full[len(seq):len(seq) + kk] + [1] * kk)[:kk]
            cut = int(torch.randint(0, kk + 1, (1,), generator=gen))
            return right[:cut] + [(t + 1) % 512 for t in right[cut:]]

        out, gain = example.speculative_greedy(model, prompt, new, k, draft_fn=draft)
    finally:
        replayssm.unpatch(model)
    assert torch.equal(out, ref[:, 7:7 + new])
    assert gain > 2.0  # drafts were accepted in part, so rows moved at different speeds


def test_per_row_counts_on_a_cache_with_attention_layers_raise():
    model = tiny("nemotron_h")
    replayssm.patch(model, buffer_len=8)
    try:
        cache = speculative_cache(model)
        verify(model, torch.randint(3, 512, (2, 6)), cache)
        verify(model, torch.randint(3, 512, (2, 3)), cache)
        with pytest.raises(RollbackError, match="expected one count for every row"):
            rollback(cache, torch.tensor([1, 2]))
        rollback(cache, torch.tensor([2, 2]))
        rollback(cache, 1)  # 5 of the 6 prompt tokens took the window path (a prefill may hold drafts)
        with pytest.raises(RollbackError, match="expected at most the 5 still in its ReplaySSM ring"):
            rollback(cache, 6)
    finally:
        replayssm.unpatch(model)


@pytest.mark.parametrize("family,counts", [("mamba2", [1, 2, 3]), ("nemotron_h", [2, 2])])
def test_per_row_rollback_keeps_the_sequence_length_of_the_longest_row(family, counts):
    """``get_seq_length`` (transformers 5.25 reads an SSM layer's own token count first) gives the
    longest row's length after per-row counts: the prompt plus the window, less the smallest count."""
    from replayssm.patches import compat

    model = tiny(family)
    replayssm.patch(model, buffer_len=8)
    rows = len(counts)
    try:
        cache = speculative_cache(model)
        verify(model, torch.randint(3, 512, (rows, 6)), cache)
        if family == "mamba2" and compat.token_count(cache.layers[0]) is None:
            pytest.skip("this transformers keeps no sequence length for a cache of SSM layers only")
        verify(model, torch.randint(3, 512, (rows, 4)), cache)
        assert int(cache.get_seq_length()) == 10
        rollback(cache, torch.tensor(counts))
        assert int(cache.get_seq_length()) == 10 - min(counts)
    finally:
        replayssm.unpatch(model)
