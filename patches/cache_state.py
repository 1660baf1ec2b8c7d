"""ReplaySSM buffers that live with the transformers cache.

Each rewritten layer keeps its checkpoint in the cache layer's ``recurrent_states[0]``
and its ring buffers plus per-row cursor in a ``ReplayBuffers`` object stored on the
same cache-layer instance (attribute ``_replayssm``). The first time buffers are attached,
that instance's ``reorder_cache`` / ``batch_select_indices`` / ``batch_repeat_interleave``
/ ``reset`` / ``offload`` / ``prefetch`` are wrapped (on the instance, not the class) so
that beam search and batch edits keep buffers, cursors and checkpoint consistent. A new
``generate()`` builds a new cache, so it always starts clean.

Buffers are attached eagerly, at the end of the prefill, so that a compiled decode step
only reads them. Every cache layer that holds buffers is tracked, weakly, by the mixer that
attached them (``live_layers``; a ``copy.deepcopy`` of the cache is tracked too): a re-patch
with other options and ``unpatch`` fold their pending entries into the checkpoint, so a
cache still in use carries over exactly.
"""

from __future__ import annotations

import copy
import types
import weakref
from dataclasses import dataclass, field

import torch

ATTR = "_replayssm"
#: ``ReplayBuffers.extra`` flag of a layer in rollback mode (``speculative``): every row's entries are
#: committed (set by a rollback, cleared by a window forward and by ``clear``), so a window needs no
#: compaction and no host sync; a captured window forward relies on it
SETTLED = "settled"
#: ``ReplayBuffers.extra`` count of a layer in rollback mode: tokens that every active row can roll back
#: without a check (the last window's T, all in the ring by the flush-first rule, less what was rolled
#: back since), so that a crop within it needs no host sync
ROLLBACK_SAFE = "rollback_safe"
#: ``ReplayBuffers.extra`` entry of a layer whose rollback was refused (the message): the cache's other
#: layers may have been rolled back already, so every later forward on it raises until a reset
REFUSED = "refused_rollback"
ARRIVALS_ATTR = "_replayssm_arrivals"
METHODS = ("reorder_cache", "batch_select_indices", "batch_repeat_interleave", "reset", "offload", "prefetch")

#: rewritten mixer -> the cache layers it attached buffers to (both weakly)
_LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    #: weak references to the cache layer holding these buffers and the mixer that attached them
    _layer: weakref.ref | None = field(default=None, repr=False, compare=False)
    _owner: weakref.ref | None = field(default=None, repr=False, compare=False)

    def __deepcopy__(self, memo):
        """A copy of the cache is a live cache too: track the copied layer with the same mixer."""
        extra = {k: (None if k == "arrivals" else v) for k, v in self.extra.items()}  # per cache, set every step
        new = ReplayBuffers(copy.deepcopy(self.tensors, memo), copy.deepcopy(self.cursor, memo), self.buffer_len,
                            self.stock_dtype, copy.deepcopy(extra, memo))
        layer = self._layer() if self._layer is not None else None
        owner = self._owner() if self._owner is not None else None
        new_layer = memo.get(id(layer)) if layer is not None else None
        if new_layer is not None and owner is not None:
            new._layer, new._owner = weakref.ref(new_layer), self._owner
            track(owner, new_layer)
        return new

    def pending(self) -> bool:
        """Whether any row has buffered entries not yet in the checkpoint (synchronises)."""
        return bool((self.cursor > 0).any())

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
        self.extra.pop(SETTLED, None)
        self.extra.pop(ROLLBACK_SAFE, None)
        self.extra.pop(REFUSED, None)


def cache_arrivals(cache, device: torch.device, batch: int) -> torch.Tensor | None:
    """The Mamba-2 kernel's per-row arrival counters for ``cache`` on ``device``: int32 zeros, at
    least ``batch`` entries, one vector shared by every layer of the cache (its layers run one
    after the other), so that two caches decoding at once on different streams never share one.
    Stored on the cache object (attribute ``_replayssm_arrivals``); every launch leaves it at zero.
    None for a cache object that takes no attributes (the kernel then uses its per-device counter).
    """
    if not hasattr(cache, "__dict__"):
        return None
    store = getattr(cache, ARRIVALS_ATTR, None)  # getattr / setattr (not __dict__): torch.compile traces them
    if store is None:
        store = {}
        setattr(cache, ARRIVALS_ATTR, store)
    counters = store.get(device)  # torch.device is hashable: no string built on every decode step
    if counters is None or counters.numel() < batch:
        counters = torch.zeros(max(batch, 64), dtype=torch.int32, device=device)
        store[device] = counters
    return counters


def get_buffers(layer) -> ReplayBuffers | None:
    return getattr(layer, ATTR, None)


def track(owner, layer) -> None:
    """Record that mixer ``owner`` keeps buffers on cache layer ``layer`` (weakly)."""
    live = _LIVE.get(owner)
    if live is None:
        live = _LIVE[owner] = weakref.WeakSet()
    live.add(layer)


def live_layers(owner) -> list:
    """The cache layers, still alive, on which mixer ``owner`` keeps buffers."""
    layers = []
    for layer in list(_LIVE.get(owner, ())):
        buffers = get_buffers(layer)
        if buffers is not None and buffers._owner is not None and buffers._owner() is owner:
            layers.append(layer)
    return layers


def forget(owner) -> None:
    _LIVE.pop(owner, None)


def _wrap(layer, name: str, after) -> None:
    original = getattr(layer, name, None)
    if original is None:
        return
    # call the class's function on whichever instance the wrapper is bound to (a deepcopy of
    # the layer rebinds the wrapper; a bound original would still edit the first layer)
    func = getattr(original, "__func__", None)

    def wrapper(self, *args, **kwargs):
        result = func(self, *args, **kwargs) if func is not None else original(*args, **kwargs)
        buffers = getattr(self, ATTR, None)
        if buffers is not None:
            after(self, buffers, *args, **kwargs)
        return result

    wrapper.__replayssm_original__ = original
    setattr(layer, name, types.MethodType(wrapper, layer))


def attach_buffers(layer, buffers: ReplayBuffers, owner=None) -> None:
    """Store ``buffers`` on the cache layer, wrapping its batch-editing methods once; ``owner``
    (the mixer) tracks the layer weakly."""
    if not getattr(layer, "_replayssm_wrapped", False):
        _wrap(layer, "reorder_cache", lambda s, b, beam_idx, *a, **k: b.index_select(beam_idx))
        _wrap(layer, "batch_select_indices", lambda s, b, indices, *a, **k: b.select(indices))
        _wrap(layer, "batch_repeat_interleave", lambda s, b, repeats, *a, **k: b.repeat_interleave(repeats))
        _wrap(layer, "reset", lambda s, b, *a, **k: b.clear())
        _wrap(layer, "offload", lambda s, b, *a, **k: b.to("cpu"))
        _wrap(layer, "prefetch", lambda s, b, *a, **k: b.to(getattr(s, "device", None) or b.cursor.device))
        layer._replayssm_wrapped = True
    if owner is not None:
        buffers._layer, buffers._owner = weakref.ref(layer), weakref.ref(owner)
        track(owner, layer)
    setattr(layer, ATTR, buffers)


def detach_buffers(layer) -> None:
    """Remove the buffers and restore the cache layer's own methods and class."""
    if getattr(layer, "_replayssm_wrapped", False):
        for name in METHODS:
            bound = layer.__dict__.get(name)
            if bound is not None and hasattr(bound, "__func__"):
                del layer.__dict__[name]
        del layer._replayssm_wrapped
    if hasattr(layer, ATTR):
        delattr(layer, ATTR)
    original = getattr(type(layer), "_replayssm_original_layer_class", None)
    if original is not None:  # the rollback subclass (``speculative.enable_layer_rollback``)
        layer.__class__ = original
