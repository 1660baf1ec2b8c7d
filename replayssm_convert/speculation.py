"""Speculative decoding helpers for serving loops (batched verify, per-row rollback).

``generate(assistant_model=...)`` / ``prompt_lookup_num_tokens=`` need nothing from here: a
patched model's caches roll back through transformers' own ``crop``. A serving loop that verifies
a whole batch at once (rows accepting different numbers of drafts) uses:

* ``speculative_cache(model)``: a transformers cache that records its past, so every forward of the
  patched model on it (T >= 1 tokens per row, T <= buffer_len) keeps its tokens roll-back-able;
* ``verify(model, tokens, cache)``: one forward of (B, T) tokens, returning the (B, T, vocab) logits;
* ``rollback(cache, n)``: remove ``n`` tokens (an int, or (B,) per-row counts) from every ReplaySSM
  layer (a cursor move; the conv state follows). Per-row counts need a cache whose other layers
  hold no per-token attention state (a pure SSM model); a single count also crops attention layers.
  Where transformers keeps one token count per layer (5.25+: ``get_seq_length``), it follows the
  longest row (it moves back by the smallest count).
"""

from __future__ import annotations

import torch

from replayssm.patches import compat
from replayssm.patches.cache_state import get_buffers
from replayssm.patches.speculative import rollback_layer

from .errors import RollbackError

__all__ = ["rollback", "speculative_cache", "verify"]


def speculative_cache(model):
    """A new ``DynamicCache`` for ``model`` that records its past (roll-back-able)."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


@torch.no_grad()
def verify(model, tokens: torch.Tensor, cache, **kwargs) -> torch.Tensor:
    """Forward (B, T) ``tokens`` on ``cache`` (the prompt on a new cache, then verify windows);
    returns the fp32 logits (B, T, vocab)."""
    key = compat.generate_cache_kwarg(model)
    out = model(tokens, use_cache=True, **{key: cache}, **kwargs)
    return out.logits.float()


def rollback(cache, n) -> None:
    """Remove the last ``n`` tokens (int, or (B,) tensor of per-row counts) from the cache.

    Raises RollbackError, changing nothing, when a row's tokens are no longer all in its ReplaySSM
    ring, or when per-row counts differ on a cache with attention layers."""
    per_row = isinstance(n, torch.Tensor) and n.dim() == 1
    layers = list(getattr(cache, "layers", ()))
    ssm = [layer for layer in layers if get_buffers(layer) is not None]
    others = [layer for layer in layers if get_buffers(layer) is None and getattr(layer, "keys", None) is not None]
    if per_row and others and bool((n != n[0]).any()):
        raise RollbackError(f"expected one count for every row on a cache with {len(others)} attention layer(s) "
                            f"(their key/value length is shared by the batch); found per-row counts {n.tolist()}")
    if not per_row:
        cache.crop(-int(n))
        return
    for layer in ssm:
        rollback_layer(layer, n)
    for layer in ssm:  # a layer's one token count (transformers 5.25+) follows the longest row
        compat.count_tokens(layer, -int(n.min()))
    if others:
        for layer in others:
            layer.crop(-int(n[0]))
