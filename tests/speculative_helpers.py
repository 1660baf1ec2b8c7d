"""Drafters for the speculative-decoding tests of ``generate()``.

``ScriptedDrafter`` is a transformers ``CandidateGenerator`` that knows the target's own greedy
continuation (the oracle) and proposes, each round, a random number of tokens of which a random
prefix agrees with the oracle (0: full rejection; all: full acceptance) and the rest do not.
After every round (right after transformers cropped the cache) it poisons, with NaN, every ring
slot and conv-history column past each row's cursor: entries of rejected tokens must never be
read again.
"""

from __future__ import annotations

import contextlib

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from replayssm.patches.cache_state import get_buffers, live_layers
from replayssm.patches.quant_state import RNG, SCALE
from replayssm.patches.speculative import COMMITTED, HIST

VOCAB = 512


class ScriptedDrafter(CandidateGenerator):
    """Proposes min_draft..max_draft tokens per round (0: the round is one plain step); ``log``
    records (drafted, agreed) per round. ``agree_all``: every draft is the oracle's (full
    acceptance every round); ``follow``: the target must stay on the oracle's path (else the
    drafts are taken from the oracle at the target's length, whatever it generated);
    ``plain_first``: no drafts in the first round (the prompt's forward is a plain prefill)."""

    def __init__(self, model, oracle: torch.Tensor, max_draft: int, seed: int = 0, poison: bool = True,
                 min_draft: int = 1, agree_all: bool = False, follow: bool = True, plain_first: bool = False):
        self.model, self.oracle, self.max_draft, self.poison = model, oracle, max_draft, poison
        self.min_draft, self.agree_all, self.follow, self.plain_first = min_draft, agree_all, follow, plain_first
        self.gen = torch.Generator().manual_seed(seed)
        self.log: list[tuple[int, int]] = []

    @property
    def num_drafting_tokens(self) -> int:  # what transformers 5.25 asks a candidate generator
        return self.max_draft

    def get_candidates(self, input_ids, **kwargs):
        cur = input_ids.shape[1]
        if self.follow:
            assert torch.equal(input_ids[0], self.oracle[0, :cur].to(input_ids.device)), \
                "the target left its greedy path"
        room = self.oracle.shape[1] - cur - 1
        if room <= 0:
            return input_ids, None
        k = min(int(torch.randint(self.min_draft, self.max_draft + 1, (1,), generator=self.gen)), room)
        k = 0 if self.plain_first and not self.log else k
        r = len(self.log) % 4  # every fourth round full rejection, every fourth full acceptance
        agree = 0 if r == 1 else k if r == 2 else int(torch.randint(0, k + 1, (1,), generator=self.gen))
        agree = k if self.agree_all else agree
        right = self.oracle[0, cur:cur + k].to(input_ids.device)
        wrong = (right + 1 + torch.randint(0, VOCAB - 1, (k,), generator=self.gen).to(right.device)) % VOCAB
        draft = torch.where(torch.arange(k, device=right.device) < agree, right, wrong)
        self.log.append((k, agree))
        if k == 0:
            return input_ids, None
        return torch.cat([input_ids, draft[None]], dim=1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self.poison:
            poison_past_cursors(self.model)


def poison_past_cursors(model) -> int:
    """NaN into every ring slot at or past each row's cursor and every conv-history column past its
    conv window, for every live cache of the model's rewritten mixers. Returns the layers poisoned."""
    count = 0
    for module in model.modules():
        for layer in live_layers(module):
            buffers = get_buffers(layer)
            cursor = buffers.cursor.long().clamp(min=0)
            for name, t in buffers.tensors.items():
                if name in (COMMITTED, SCALE, RNG):  # per row, not per slot
                    continue
                slots = torch.arange(t.shape[2], device=t.device)
                limit = cursor + (layer.conv_states[0].shape[-1] if name == HIST else 0)
                stale = slots[None, :] >= limit[:, None]  # (Bt, slots)
                shape = [t.shape[0], 1, t.shape[2]] + [1] * (t.dim() - 3)
                t.masked_fill_(stale.view(shape), float("nan"))
            count += 1
    return count


@contextlib.contextmanager
def drafting(model, drafter):
    """Inside the block ``model.generate`` takes ``drafter`` as its candidate generator (an instance
    attribute, removed on leaving)."""
    model._get_candidate_generator = lambda *args, **kwargs: drafter
    try:
        yield drafter
    finally:
        model.__dict__.pop("_get_candidate_generator", None)
