"""Speculative decoding on the replay path: multi-token (verify) forwards and rollback.

A cache layer that records its past (transformers' ``activate_past_recording``, which assisted
generation calls on the target's and the draft's cache) is in *rollback mode*: every forward of
the rewritten mixer on it (T >= 1 new tokens) goes through the window path, which

* checks that the T tokens fit the ring (``VerifyWindowError`` otherwise),
* makes room where the ring cannot hold them: rows whose entries are all committed flush first
  inside the verify kernel; rows holding uncommitted entries (appended since the last crop, e.g.
  a draft model's single-token steps) first fold only their committed prefix and shift the rest
  to the front of the ring (``_compact``), folding uncommitted entries only if there is no other
  way (a later rollback into them then raises ``RollbackError``),
* runs the conv over the window with a history (``kernels.window_conv``: the window's start slot, the
  committed mark and the conv in one launch) and the kind's verify.

A rollback (``crop(-n)`` or ``rollback``) moves each row's cursor back and restores its conv state
from the history; it raises ``RollbackError`` when a removed token is no longer in the ring. Per
row, ``committed`` (int32, in the buffers) is the cursor at the last rollback: entries before it
may be folded freely. A cache's ``crop(-n)`` of tokens of the last window (what an assisted round
that rejects drafts asks) rolls all its SSM layers back in one launch (``rollback_cache``, through
a ``crop`` the cache instance gets in ``enable_layer_rollback``); each layer's own ``crop`` then
crops only its attention part.

The cache layer instances get a subclass (``rollback_layer_class``: ``is_croppable`` true in
rollback mode, ``crop`` that rolls the SSM part back and crops the attention part as its class
does); ``cache_state.detach_buffers`` gives them their class back. The model instance gets
``_is_stateful = False`` (``allow_assisted``), which ``restore_assisted`` removes.
"""

from __future__ import annotations

import contextvars
import inspect
import types

import torch

from replayssm.errors import RollbackError, VerifyWindowError
from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.rollback import layer_rollback, layers_rollback, layers_rollback_table
from replayssm.kernels.window_conv import layer_window_conv

from . import compat
from .cache_state import REFUSED, ROLLBACK_SAFE, SETTLED, ReplayBuffers, get_buffers

HIST, COMMITTED = "conv_hist", "committed"
#: model-instance attribute recording that ``allow_assisted`` set ``_is_stateful``
_STATEFUL_MARK = "_replayssm_stateless"
_LAYER_CLASSES: dict[type, type] = {}
#: cache-instance attribute: the address table of ``rollback_cache`` (with what it was built from)
_TABLE = "_replayssm_rollback_table"
#: the cache layers that the cache's ``crop`` in progress rolled back already
_ROLLED_BACK: contextvars.ContextVar[frozenset] = contextvars.ContextVar("replayssm_rolled_back", default=frozenset())


# ----------------------------------------------------------------------------- the window path
def ring_len(buffers: ReplayBuffers) -> int:
    """L of the layer's rings (slots per row): dim 2 of every ring tensor."""
    return next(t.shape[2] for name, t in buffers.tensors.items() if name not in (HIST, COMMITTED))


def prepare_window(mixer, layer, buffers: ReplayBuffers, T: int) -> None:
    """Make room for a T-token window on every row (module notes). Each row's window start slot
    and its committed mark follow in ``window_conv``, from the cursors this leaves."""
    L = ring_len(buffers)
    if T > L:
        raise VerifyWindowError(
            f"layer {getattr(mixer, 'layer_idx', '?')}: a forward of T new tokens on a cache in rollback mode keeps "
            f"all T in the ReplaySSM ring; expected T <= buffer_len = {L}, found T = {T}",
            hint=f"patch with buffer_len >= {T}, or draft fewer tokens (num_assistant_tokens / "
                 f"prompt_lookup_num_tokens <= {L - 1})")
    t = buffers.tensors
    if HIST not in t:
        _enter_rollback_mode(mixer, layer, buffers, L)
    cursor = buffers.cursor
    committed = t[COMMITTED]
    if not buffers.extra.get(SETTLED):  # else every entry is committed: nothing to keep, no host sync
        over = (cursor + T > L) & (committed < cursor)
        if bool(over.any()):  # uncommitted entries on a full ring (a draft's single steps): keep them
            fold = torch.maximum(committed, cursor + T - L).clamp(min=0)
            _compact(mixer, layer, buffers, torch.where(over, fold, torch.zeros_like(fold)))
    buffers.extra[SETTLED] = False
    buffers.extra[ROLLBACK_SAFE] = T


def window_conv(mixer, layer, buffers: ReplayBuffers, x: torch.Tensor) -> torch.Tensor:
    """x (Bt, T, C) conv inputs -> (Bt, T, C) conv outputs; the cache's conv state, the history and
    the committed marks follow (``kernels.window_conv``: one launch on the Triton backend)."""
    t = buffers.tensors
    return layer_window_conv(t[HIST], compat.conv_state(layer), buffers.cursor, t[COMMITTED], x,
                             mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, mixer.activation, ring_len(buffers),
                             compat.token_count(layer, x.device), backend=mixer.replay_options.backend)


def _enter_rollback_mode(mixer, layer, buffers: ReplayBuffers, L: int) -> None:
    """First window on this cache layer: fold what plain decode steps buffered (their conv inputs
    were not kept, so they could not be rolled back) and allocate the history and the marks."""
    state = compat.recurrent_state(layer)
    if buffers.pending():
        mixer._replay_materialize(state, buffers)
    conv = compat.conv_state(layer)
    Bt, C, K = conv.shape
    buffers.tensors[HIST] = torch.zeros(Bt, C, K + L, dtype=conv.dtype, device=conv.device)
    buffers.tensors[COMMITTED] = torch.zeros(Bt, dtype=torch.int32, device=conv.device)
    buffers.extra[SETTLED] = False


def leave_rollback_mode(mixer, layer, buffers: ReplayBuffers) -> None:
    """The cache stopped recording its past: fold the ring (its cursor may be L, which a plain
    decode step does not take) and drop the history."""
    if buffers.pending():
        mixer._replay_materialize(compat.recurrent_state(layer), buffers)
    buffers.tensors.pop(HIST, None)
    buffers.tensors.pop(COMMITTED, None)
    buffers.extra.pop(SETTLED, None)
    buffers.extra.pop(ROLLBACK_SAFE, None)


def _ring_names(mixer) -> list[str]:
    kind = mixer.layer_kind
    return list(kind.buffer_specs(kind.shapes(mixer), 1, 1, None))


def _shift(t: torch.Tensor, m: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` with each row's entries along ``dim`` moved down by ``m[b]`` (the tail repeats)."""
    n = t.shape[dim]
    idx = (torch.arange(n, device=t.device)[None, :] + m[:, None]).clamp(max=n - 1)  # (Bt, n)
    shape = [t.shape[0]] + [1] * (t.dim() - 1)
    shape[dim] = n
    return t.gather(dim, idx.view(shape).expand(t.shape))


def _compact(mixer, layer, buffers: ReplayBuffers, m: torch.Tensor) -> None:
    """Fold each row's first ``m[b]`` ring entries into the checkpoint and move the rest to the front
    (ring, conv history, cursor, committed mark). KDA's running decay sums are re-based."""
    m = m.long()
    fold = ReplayBuffers(buffers.tensors, m.to(buffers.cursor.dtype), buffers.buffer_len, buffers.stock_dtype)
    mixer._replay_materialize(compat.recurrent_state(layer), fold)
    t = buffers.tensors
    for name in _ring_names(mixer):
        ring = t[name]
        shifted = _shift(ring, m, 2)
        if name == "g_buf" and ring.dim() == 4:  # KDA: G_j - G_{m-1}
            idx = (m - 1).clamp(min=0).view(-1, 1, 1, 1).expand(ring.shape[0], ring.shape[1], 1, ring.shape[3])
            base = torch.where((m > 0).view(-1, 1, 1, 1), ring.gather(2, idx), torch.zeros((), device=ring.device))
            shifted = shifted - base
        ring.copy_(shifted)
    t[HIST].copy_(_shift(t[HIST], m, 2))
    buffers.cursor.sub_(torch.where(buffers.cursor >= 0, m, 0).to(buffers.cursor.dtype))
    t[COMMITTED].copy_((t[COMMITTED] - m.to(torch.int32)).clamp(min=0))


# ----------------------------------------------------------------------------- rollback
def rollback_layer(layer, n) -> None:
    """Move the layer's rows back by ``n`` tokens (an int, or (Bt,) per-row counts >= 0) and restore
    their conv states; mark the result committed. Raises RollbackError (changing nothing) when a
    row would need a token no longer in its ring, or the layer is not in rollback mode."""
    buffers = get_buffers(layer)
    cursor = buffers.cursor
    t = buffers.tensors
    if isinstance(n, int) and n == 0:  # every draft accepted: nothing moves, one launch and no host sync
        if HIST in t:
            torch.clamp(cursor, min=0, out=t[COMMITTED])
            buffers.extra[SETTLED] = True
        return

    def counts() -> torch.Tensor:  # (Bt,) int32, for the checks (for an int: a host-to-device copy)
        return torch.as_tensor(n, device=cursor.device).to(torch.int32).expand(cursor.shape)

    if HIST not in t:
        if isinstance(n, int) or bool((counts() != 0).any()):
            raise RollbackError(
                f"expected a cache recording its past (rollback mode) to roll back {int(counts().max())} token(s); "
                "found one that is not: its conv inputs were not kept",
                hint="call cache.activate_past_recording() before the prefill (assisted generation does)")
        return
    safe = buffers.extra.get(ROLLBACK_SAFE, 0)
    within = isinstance(n, int) and 0 < n <= safe  # the last window's tokens: valid, no host sync
    if not within:
        n = counts()
        bad = (n < 0) | ((cursor >= 0) & (n > cursor))
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            message = (f"cannot roll back row {row} by {int(n[row])} token(s): expected at most the "
                       f"{int(cursor[row])} still in its ReplaySSM ring (ring of {ring_len(buffers)}); the others "
                       "were folded into the checkpoint")
            buffers.extra[REFUSED] = message
            raise RollbackError(message, hint="patch with a larger buffer_len, or verify / draft fewer tokens "
                                              "between rollbacks; the cache is unusable until reset")
    owner = buffers._owner() if buffers._owner is not None else None
    layer_rollback(cursor, n, t[HIST], compat.conv_state(layer), t[COMMITTED],
                   backend=owner.replay_options.backend if owner is not None else "auto")
    buffers.extra[SETTLED] = True
    buffers.extra[ROLLBACK_SAFE] = safe - n if within else 0


def rollback_cache(cache, n: int) -> frozenset:
    """Roll every ReplaySSM layer of ``cache`` back by ``n`` in one launch (``kernels.layers_rollback``;
    n = 0 marks every entry committed) where that needs no check: every such layer in rollback mode on
    the Triton backend, n within its last window (no host synchronisation), all of one shape. Returns the
    ids of the layers rolled back; empty where the one launch does not apply (each layer's ``crop`` then
    rolls itself back, with its checks)."""
    entries = []
    for layer in getattr(cache, "layers", ()):
        buffers = get_buffers(layer)
        if buffers is None:
            continue
        t = buffers.tensors
        owner = buffers._owner() if buffers._owner is not None else None
        if (HIST not in t or not 0 <= n <= buffers.extra.get(ROLLBACK_SAFE, 0) or owner is None
                or resolve_backend(owner.replay_options.backend, buffers.cursor.device) != "triton"):
            return frozenset()
        entries.append((layer, buffers, (buffers.cursor, t[HIST], compat.conv_state(layer), t[COMMITTED])))
    if not entries:
        return frozenset()
    tensors = [tensors for _, _, tensors in entries]
    built_from = tuple((t.data_ptr(), t.shape, t.stride(), t.dtype) for layer in tensors for t in layer)
    saved = cache.__dict__.get(_TABLE)
    if saved is None or saved[0] != built_from:
        try:
            saved = (built_from, layers_rollback_table(tensors))
        except ValueError:  # layers of several shapes: one launch each
            return frozenset()
        cache.__dict__[_TABLE] = saved
    layers_rollback(tensors, n, saved[1], backend="triton")
    for _, buffers, _ in entries:
        buffers.extra[SETTLED] = True
        buffers.extra[ROLLBACK_SAFE] -= n
    return frozenset(id(layer) for layer, _, _ in entries)


def _cache_crop(self, tokens_to_remove: int, *args, **kwargs):
    """A cache's ``crop`` (bound to the instance; a deep copy's is bound to the copy): ``crop(-n)``, n >= 0,
    rolls the SSM layers back in one launch where it can, then the class's ``crop``, whose per-layer crops
    skip the SSM part of the layers rolled back. A count given as a 0-d integer tensor (transformers'
    assisted loop computes it on the device) is read once here, not once a layer."""
    if isinstance(tokens_to_remove, torch.Tensor) and tokens_to_remove.dim() == 0 and (
            not tokens_to_remove.is_floating_point() and not tokens_to_remove.is_complex()):
        tokens_to_remove = int(tokens_to_remove)
    done = rollback_cache(self, -tokens_to_remove) if isinstance(tokens_to_remove, int) and tokens_to_remove <= 0 \
        else frozenset()
    token = _ROLLED_BACK.set(done)
    try:
        return type(self).crop(self, tokens_to_remove, *args, **kwargs)
    finally:
        _ROLLED_BACK.reset(token)


def check_not_refused(layer) -> None:
    """Raise RollbackError when a refused rollback left ``layer``'s cache part rolled back (other
    layers may have moved before the refusal): decoding on would mix two sequence lengths."""
    buffers = get_buffers(layer)
    if buffers is not None and REFUSED in buffers.extra:
        raise RollbackError(f"expected a cache in one piece; found one that a refused rollback left part rolled "
                            f"back ({buffers.extra[REFUSED]})", hint="reset the cache (cache.reset()) or start a new one")


def settled(cache) -> bool:
    """Whether every ReplaySSM layer of ``cache`` is in rollback mode with all entries committed
    (what a captured window forward assumed); False for a cache without such layers."""
    found = False
    for layer in getattr(cache, "layers", ()):
        buffers = get_buffers(layer)
        if buffers is None:
            continue
        if not buffers.extra.get(SETTLED):
            return False
        found = True
    return found


def unsettle(cache, T: int) -> None:
    """A window of T tokens ran outside Python (a graph replay): set the flags as ``prepare_window``
    would."""
    for layer in getattr(cache, "layers", ()):
        buffers = get_buffers(layer)
        if buffers is not None:
            buffers.extra[SETTLED] = False
            buffers.extra[ROLLBACK_SAFE] = T


def _crop_count(tokens_to_remove: int) -> int:
    if tokens_to_remove > 0:
        raise RollbackError(f"expected crop(-n) (remove n tokens) on a ReplaySSM cache layer; found crop("
                            f"{tokens_to_remove}), the legacy absolute length, which a recurrent layer cannot serve")
    return -int(tokens_to_remove)


def _class_answer(layer, name: str):
    """What the layer's original cache-layer class answers for ``name`` (a property or a plain value)."""
    value = inspect.getattr_static(type(layer)._replayssm_original_layer_class, name)
    return value.__get__(layer) if isinstance(value, property) else value


def _in_rollback_mode(layer) -> bool:
    return get_buffers(layer) is not None and compat.is_recording_past(layer)


def _is_croppable(self) -> bool:
    """True in rollback mode (buffers here and the cache recording its past); else the class's answer."""
    return True if _in_rollback_mode(self) else _class_answer(self, "is_croppable")


def _is_compileable(self) -> bool:
    """In rollback mode, the class's answer for a layer that does not record its past: transformers'
    recording layer grows its conv state, the window path keeps every tensor at its size and address
    (the conv history is a buffer of its own). A static cache then keeps the 4-D masks of its
    one-token steps, which transformers drops on a cache it cannot compile: its unwritten and cropped
    positions would be attended."""
    if not _in_rollback_mode(self):
        return _class_answer(self, "is_compileable")
    self.record_past = False
    try:
        return _class_answer(self, "is_compileable")
    finally:
        self.record_past = True


def _crop(self, tokens_to_remove: int) -> None:
    """``crop(-n)``: the SSM part rolled back by n tokens (``rollback_layer``), the attention part of a
    hybrid layer cropped as its class does."""
    original = type(self)._replayssm_original_layer_class
    if get_buffers(self) is None:
        if compat.is_uninitialized_linear_layer(self):
            return None  # nothing to crop (transformers 5.17 crashes on such a layer)
        return original.crop(self, tokens_to_remove)
    n = _crop_count(tokens_to_remove)
    if id(self) not in _ROLLED_BACK.get():  # else the cache's crop rolled it back with the others
        rollback_layer(self, n)
    compat.count_tokens(self, -n)
    attention_crop = compat.attention_crop(original)
    if attention_crop is not None:
        attention_crop(self, tokens_to_remove)


def rollback_layer_class(cls: type) -> type:
    """The rollback subclass of cache-layer class ``cls`` (created once per class; single
    inheritance, so that an instance's ``__class__`` can be swapped both ways)."""
    if getattr(cls, "_replayssm_original_layer_class", None) is not None:
        return cls
    sub = _LAYER_CLASSES.get(cls)
    if sub is None:
        sub = type(f"Replay{cls.__name__}", (cls,), {
            "__module__": __name__, "_replayssm_original_layer_class": cls,
            "is_croppable": property(_is_croppable), "is_compileable": property(_is_compileable), "crop": _crop,
            "__doc__": f"{cls.__name__} holding ReplaySSM buffers: croppable while recording its past."})
        _LAYER_CLASSES[cls] = sub
    return sub


def _crop_indexer_positions(self, tokens_to_remove: int) -> None:
    """The class's crop, then the indexer's position ids cropped too where the class left them
    (transformers 5.24's ``StaticIndexedLayer`` does; its dynamic twin crops them)."""
    before = self.indexer_position_ids
    type(self).__mro__[1].crop(self, tokens_to_remove)
    if tokens_to_remove < 0 and before is not None and self.indexer_position_ids is before:
        self.indexer_position_ids = before[..., :tokens_to_remove]


def _indexed_layer_class(cls: type) -> type:
    """The subclass of an indexed attention cache-layer class whose crop also crops the indexer's
    position ids (created once per class)."""
    if cls.__name__.startswith("PositionCropping"):
        return cls
    sub = _LAYER_CLASSES.get(cls)
    if sub is None:
        sub = type(f"PositionCropping{cls.__name__}", (cls,), {
            "__module__": __name__, "crop": _crop_indexer_positions,
            "__doc__": f"{cls.__name__} whose crop also crops the indexer's position ids."})
        _LAYER_CLASSES[cls] = sub
    return sub


def enable_layer_rollback(layer, cache=None) -> None:
    """Give the cache layer instance its rollback subclass (``cache_state.detach_buffers`` undoes it)
    and ``cache`` its one-launch ``crop`` (an instance attribute: the cache object is the call's own, or
    a graph decoder's pooled one; it falls back to the layers' crops wherever the launch does not apply).
    With ``cache``, also its linear-attention layers that no layer ever initialises (5.17 gives
    MLP-only layers one): their subclass's crop is a no-op, as nothing is there to crop; and its
    indexed attention layers a crop that leaves no rejected draft's position behind."""
    layer.__class__ = rollback_layer_class(type(layer))
    if cache is not None and callable(getattr(type(cache), "crop", None)) and "crop" not in cache.__dict__:
        cache.crop = types.MethodType(_cache_crop, cache)
    for other in getattr(cache, "layers", ()):
        if compat.is_uninitialized_linear_layer(other):
            other.__class__ = rollback_layer_class(type(other))
        elif hasattr(other, "indexer_position_ids") and "crop" in type(other).__dict__:
            other.__class__ = _indexed_layer_class(type(other))


# ----------------------------------------------------------------------------- the model
def allow_assisted(model) -> None:
    """Let ``generate`` run assisted / prompt-lookup decoding on this (fully rewritten) model instance."""
    if getattr(type(model), "_is_stateful", False) and "_is_stateful" not in model.__dict__:
        model._is_stateful = False
        setattr(model, _STATEFUL_MARK, True)


def restore_assisted(model) -> None:
    """Undo ``allow_assisted``: the class's refusal applies again."""
    if model.__dict__.pop(_STATEFUL_MARK, False):
        model.__dict__.pop("_is_stateful", None)
