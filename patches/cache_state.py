"""ReplaySSM buffers that live with the transformers cache.

Each rewritten layer keeps its checkpoint in the cache layer's ``recurrent_states[0]``
and its ring buffers plus per-row cursor in a ``ReplayBuffers`` object stored on the
same cache-layer instance (attribute ``_replayssm``). The first time buffers are attached,
that instance's ``reorder_cache`` / ``batch_select_indices`` / ``batch_repeat_interleave``
/ ``reset`` / ``offload`` / ``prefetch`` are wrapped (on the instance, not the class) so
that beam search and batch edits keep buffers, cursors and checkpoint consistent. A new
``generate()`` builds a new cache, so it always starts clean.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

ATTR = "_replayssm"
ARRIVALS_ATTR = "_replayssm_arrivals"


@dataclass
class ReplayBuffers:
    """Ring buffers (batch-first tensors) and the cursor of one layer.

    tensors: name -> tensor with the batch in dim 0 (e.g. x_buf, dt_buf, B_buf).
    cursor: (B,) int32, entries [0, cursor) are buffered; -1 marks an idle row.
    stock_dtype: dtype of the recurrent state that transformers' own code expects.
    """

    tensors: dict[str, torch.Tensor]
    cursor: torch.Tensor
    buffer_len: int
    stock_dtype: torch.dtype
    extra: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.cursor.shape[0])

    def _map(self, fn) -> None:
        self.tensors = {k: fn(v) for k, v in self.tensors.items()}
        self.cursor = fn(self.cursor)

    def index_select(self, index: torch.Tensor) -> None:
        self._map(lambda t: t.index_select(0, index.to(t.device)))

    def select(self, indices) -> None:
        self._map(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices, ...])

    def repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def to(self, device) -> None:
        self._map(lambda t: t.to(device, non_blocking=True))

    def clear(self) -> None:
        """Empty every row's buffer (after a reset or a fresh prefill)."""
        self.cursor.zero_()


def cache_arrivals(cache, device: torch.device, batch: int) -> torch.Tensor | None:
    """The Mamba-2 kernel's per-row arrival counters for ``cache`` on ``device``: int32 zeros, at
    least ``batch`` entries, one vector shared by every layer of the cache (its layers run one
    after the other), so that two caches decoding at once on different streams never share one.
    Stored on the cache object (attribute ``_replayssm_arrivals``); every launch leaves it at zero.
    None for a cache object that takes no attributes (the kernel then uses its per-device counter).
    """
    attrs = getattr(cache, "__dict__", None)
    if attrs is None:
        return None
    store = attrs.setdefault(ARRIVALS_ATTR, {})
    counters = store.get(device)  # torch.device is hashable: no string built on every decode step
    if counters is None or counters.numel() < batch:
        counters = torch.zeros(max(batch, 64), dtype=torch.int32, device=device)
        store[device] = counters
    return counters


def get_buffers(layer) -> ReplayBuffers | None:
    return getattr(layer, ATTR, None)


def _wrap(layer, name: str, after) -> None:
    original = getattr(layer, name, None)
    if original is None:
        return

    def wrapper(self, *args, **kwargs):
        result = original(*args, **kwargs)
        buffers = getattr(self, ATTR, None)
        if buffers is not None:
            after(buffers, *args, **kwargs)
        return result

    wrapper.__replayssm_original__ = original
    setattr(layer, name, types.MethodType(wrapper, layer))


def attach_buffers(layer, buffers: ReplayBuffers) -> None:
    """Store ``buffers`` on the cache layer, wrapping its batch-editing methods once."""
    if not getattr(layer, "_replayssm_wrapped", False):
        _wrap(layer, "reorder_cache", lambda b, beam_idx, *a, **k: b.index_select(beam_idx))
        _wrap(layer, "batch_select_indices", lambda b, indices, *a, **k: b.select(indices))
        _wrap(layer, "batch_repeat_interleave", lambda b, repeats, *a, **k: b.repeat_interleave(repeats))
        _wrap(layer, "reset", lambda b, *a, **k: b.clear())
        _wrap(layer, "offload", lambda b, *a, **k: b.to("cpu"))
        _wrap(layer, "prefetch", lambda b, *a, **k: b.to(getattr(layer, "device", None) or b.cursor.device))
        layer._replayssm_wrapped = True
    setattr(layer, ATTR, buffers)


def detach_buffers(layer) -> None:
    """Remove the buffers and restore the cache layer's own methods."""
    if getattr(layer, "_replayssm_wrapped", False):
        for name in ("reorder_cache", "batch_select_indices", "batch_repeat_interleave", "reset", "offload",
                     "prefetch"):
            bound = layer.__dict__.get(name)
            if bound is not None and hasattr(bound, "__func__"):
                del layer.__dict__[name]
        del layer._replayssm_wrapped
    if hasattr(layer, ATTR):
        delattr(layer, ATTR)
