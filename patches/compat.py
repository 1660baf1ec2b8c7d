"""The differences between transformers versions, in one place.

* 5.17 / 5.23: mixers take ``cache_params=``; 5.24 renames it ``cache=``; decoder layers of
  some families pass ``past_key_values=``. ``find_cache`` accepts all three.
* 5.17 has no ``Cache.get_conv_state``; every 5.x keeps the tensors in
  ``cache.layers[i].conv_states[0]`` / ``recurrent_states[0]`` and the flag in
  ``has_previous_state[0]``, which is what these helpers read.
* Speculative decoding: both versions call ``activate_past_recording`` on the target's and the
  assisted draft's cache, crop with ``crop(-n)`` and refuse models whose class has
  ``_is_stateful``; 5.24 also checks ``cache.is_croppable`` after the prefill (5.17 does not),
  and while recording a layer keeps the prefill's whole conv input (5.24) or K columns (5.17),
  which ``conv_window_of_prefill`` brings back to K columns. 5.17-5.23 refuse assisted generation on a
  cache of type ``StaticCache``, whose layers cannot crop there (a graph decoder's assisted slot is
  a subclass that crops them: ``static_cache_class``); 5.24 takes it, drops the mask of a one-token
  step on a cache whose layers record their past (so ``speculative`` answers ``is_compileable`` as a
  non-recording layer would) and its ``StaticIndexedLayer.crop`` keeps the cropped tokens' indexer
  positions (``speculative`` crops them where the class left them).
* 5.25 drops ``_is_stateful`` and serves assisted generation of stateful models itself: a recording
  linear-attention layer keeps ``recurrent_states_to_keep`` recurrent states (the candidate generator's
  ``num_drafting_tokens``) and its prefill computes them (``keep_no_state_history`` asks for none on a
  ReplaySSM layer, which rolls back in its ring); and a linear-attention layer counts its tokens
  (``cumulative_length_linear``, read by ``Cache.get_seq_length``; ``token_count``), which a ReplaySSM
  step's conv launch advances and a crop moves back. The count is created on the CPU and moved to the
  states' device by the linear-attention half of a layer's lazy initialization only while the layer has
  no device yet: in a layer that also holds attention (Zamba2's hybrid layers, whose attention runs
  first) it stays on the CPU beside CUDA states, and ``token_count`` moves it.
* 5.24's assisted loop enters ``_optimize_model_for_decode`` (switching a MoE's experts to
  ``batched_mm`` and back, two walks over every module) around every verify forward; 5.17 enters it
  once around the sampling loop only. ``DECODE_SWITCH`` names that context where the class has it.
* Gated DeltaNet: 5.17 expands q/k to the value heads inside the mixer, 5.23+ inside the
  recurrent function; the ReplaySSM layers do their own expansion, so this only matters
  to code that calls transformers' functions.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

CACHE_KWARGS = ("cache", "cache_params", "past_key_values")
#: the generation mixin's context that switches MoE experts for decoding (5.17+)
DECODE_SWITCH = "_optimize_model_for_decode"


def find_cache(kwargs: dict[str, Any]):
    """The transformers cache passed to a mixer, under whichever keyword this version uses."""
    for key in CACHE_KWARGS:
        cache = kwargs.get(key)
        if cache is not None:
            return cache
    return None


def output_cache(output):
    """The cache a model's forward returned: ``output.cache`` (5.25), else ``output.past_key_values``."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def cache_layer(cache, layer_idx: int):
    """The per-layer cache object (``LinearAttentionLayer`` or a hybrid layer), or None."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx is None or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    if not hasattr(layer, "recurrent_states") or not hasattr(layer, "conv_states"):
        return None
    return layer


def has_previous_state(layer) -> bool:
    """Whether the layer's prefill has run (its conv and recurrent states are live)."""
    flag = getattr(layer, "has_previous_state", False)
    if isinstance(flag, dict):
        return bool(flag.get(0, False))
    if callable(flag):
        return bool(flag())
    return bool(flag)


def is_recording_past(layer) -> bool:
    return bool(getattr(layer, "record_past", False))


def conv_state(layer) -> torch.Tensor:
    return layer.conv_states[0]


def recurrent_state(layer) -> torch.Tensor | None:
    return layer.recurrent_states.get(0) if isinstance(layer.recurrent_states, dict) else layer.recurrent_states[0]


def token_count(layer, device: torch.device | None = None) -> torch.Tensor | None:
    """The layer's own token count where transformers keeps one, else None: 5.25's linear-attention
    layers count in ``cumulative_length_linear`` (a 0-d int64 tensor), which their conv path advances and
    ``Cache.get_seq_length`` reads when such a layer comes first (a continued ``generate`` starts its
    positions there). A ReplaySSM step runs its own conv, which advances it in the same launch, so the
    count is moved to ``device`` (the step's) where it is elsewhere (see the module notes)."""
    count = getattr(layer, "cumulative_length_linear", None)
    if not isinstance(count, torch.Tensor):
        return None
    if device is not None and count.device != device:
        count = layer.cumulative_length_linear = count.to(device)
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(count)
    return count


def count_tokens(layer, n: int) -> None:
    """Move ``token_count`` by ``n`` in place (a crop: ``-n``); nothing where the layer has none."""
    count = token_count(layer)
    if count is not None:
        count.add_(n)


def keep_no_state_history(layer) -> None:
    """On a layer recording its past, ask transformers' own forward for no intermediate recurrent states
    (5.25 computes ``recurrent_states_to_keep`` of them in a prefill, and fails on the None that
    ``activate_past_recording()`` leaves without a count): a ReplaySSM layer rolls back in its ring."""
    if getattr(layer, "recurrent_states_to_keep", 0) != 0:
        layer.recurrent_states_to_keep = 0


def set_recurrent_state(layer, tensor: torch.Tensor) -> None:
    """Replace the recurrent-state tensor (used when the checkpoint changes dtype)."""
    layer.recurrent_states[0] = tensor
    if not torch.compiler.is_compiling():
        try:
            torch._dynamo.mark_static_address(tensor)
        except Exception:  # pragma: no cover - best effort, as transformers does
            pass


def generate_cache_kwarg(model) -> str:
    """The keyword under which ``generate`` / ``forward`` take a cache: ``cache`` (5.24), else
    ``cache_params`` (5.17's pure Mamba-2 model) or ``past_key_values``."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return next((name for name in CACHE_KWARGS if name in params), "past_key_values")


# ---------------------------------------------------------------- sdpa
@functools.cache
def sdpa_groups_decode_queries() -> bool:
    """Whether this transformers' ``sdpa`` attention already skips ``repeat_kv`` for one query token.
    Answered once, when a model is patched: torch.compile (torch 2.11) cannot trace the import."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


@functools.lru_cache(maxsize=64)
def attention_crop(layer_class: type):
    """The ``crop`` of the attention part of a cache-layer class (the first class in its MRO that
    defines ``crop`` and is not a linear-attention layer; ``static_layer_crop`` for a full-attention
    static layer whose class has none, as before 5.24), None for a linear-attention-only class."""
    from transformers import cache_utils

    linear = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    for cls in layer_class.__mro__:
        if "crop" in cls.__dict__ and not (linear is not None and issubclass(cls, linear)):
            return cls.__dict__["crop"]
    if _full_attention_static(layer_class):
        return static_layer_crop
    return None


def static_layer_crop(layer, tokens_to_remove: int) -> None:
    """``crop(-n)`` of a static attention cache layer as transformers 5.24+ does it (before, its
    ``StaticLayer`` has no ``crop``): the length counter moves back by n, in place (a captured graph
    reads it), and the next update overwrites the stale positions."""
    if tokens_to_remove > 0:
        raise ValueError(f"expected crop(-n) (remove n tokens) on a static cache layer; found crop({tokens_to_remove})")
    layer.cumulative_length.sub_(-tokens_to_remove)


def lacks_static_crop(layer) -> bool:
    """A full-attention static cache layer whose class cannot crop (transformers before 5.24); not a
    sliding-window or indexed one, whose crop would have more to restore."""
    return _full_attention_static(type(layer)) and not callable(getattr(type(layer), "crop", None))


@functools.lru_cache(maxsize=64)
def _full_attention_static(layer_class: type) -> bool:
    """A static cache-layer class that is neither sliding-window nor indexed."""
    from transformers import cache_utils

    special = tuple(c for c in (getattr(cache_utils, "StaticSlidingWindowLayer", None),
                                getattr(cache_utils, "StaticIndexedLayer", None)) if c is not None)
    return issubclass(layer_class, cache_utils.StaticLayer) and not issubclass(layer_class, special)


def conv_window_of_prefill(layer, width: int, keep: torch.Tensor | None = None) -> None:
    """After a prefill on a layer recording its past: the conv state as a (B, C, width) tensor of the
    last ``width`` inputs (zeros before the first), as a non-recording prefill leaves it; written into
    ``keep`` (the layer's conv state before the prefill, which transformers replaced) where it has that
    form, so that the cache's tensors keep their addresses from call to call (captured graphs)."""
    conv = layer.conv_states[0]
    if conv is None or conv is keep:
        return
    if conv.shape[-1] > width:
        conv = conv[..., -width:]
    elif conv.shape[-1] < width:
        conv = torch.nn.functional.pad(conv, (width - conv.shape[-1], 0))
    if (keep is not None and keep.shape == conv.shape and keep.dtype == conv.dtype and keep.device == conv.device
            and keep.is_contiguous()):
        layer.conv_states[0] = keep.copy_(conv)
    else:
        layer.conv_states[0] = conv.contiguous()


def is_uninitialized_linear_layer(layer) -> bool:
    """A linear-attention cache layer whose states were never set (5.17 builds one for every layer
    type it does not know, MLP-only layers included, and its ``crop`` then fails)."""
    states = getattr(layer, "conv_states", None)
    return (isinstance(states, dict) and all(v is None for v in states.values())
            and all(v is None for v in getattr(layer, "recurrent_states", {}).values()))


def _version() -> tuple[int, int]:
    import transformers

    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _before_5_24() -> bool:
    return _version() < (5, 24)


def static_cache_class(assisted: bool) -> type:
    """The ``StaticCache`` class of a graph decoder's pooled cache. Before 5.24 the assisted loop refuses
    a cache whose type is exactly ``StaticCache`` (its static layers cannot crop there): an assisted
    slot takes a subclass whose ``crop`` crops those layers by ``static_layer_crop``."""
    from transformers import StaticCache

    if assisted and _before_5_24():
        return _assisted_static_cache_class()
    return StaticCache


def _crop_layers(cache, tokens_to_remove: int) -> None:
    """``crop`` of the assisted slot's cache: each layer's own, ``static_layer_crop`` for a full-attention
    static layer, whose class has none before 5.24."""
    for layer in cache.layers:
        if callable(getattr(type(layer), "crop", None)):
            layer.crop(tokens_to_remove)
        elif lacks_static_crop(layer):
            static_layer_crop(layer, tokens_to_remove)
        else:
            raise ValueError(f"expected cache layers that can crop; found a {type(layer).__name__} (transformers "
                             "before 5.24 gives it no crop)")


def _layers_croppable(cache) -> bool:
    return all(lacks_static_crop(layer) or layer.is_croppable for layer in cache.layers)


@functools.lru_cache(maxsize=1)
def _assisted_static_cache_class() -> type:
    from transformers import StaticCache

    return type("AssistedStaticCache", (StaticCache,), {
        "crop": _crop_layers, "is_croppable": property(_layers_croppable),
        "__doc__": "A StaticCache that transformers < 5.24's assisted loop takes (its check is on the exact "
                   "type), whose full-attention static layers crop as 5.24's do."})


def refuses_assisted_on_static_caches() -> bool:
    """transformers before 5.24 refuses assisted generation on a ``StaticCache`` (a ValueError)."""
    return _before_5_24()


def assisted_generation_gap(model) -> str | None:
    """Why this transformers version's own assisted generation cannot serve ``model`` (patched or
    not), or None. Before 5.24 its assisted loop looks the cache up under ``past_key_values`` only,
    which the pure Mamba-2 model (``cache_params``) never has; before 5.21 qwen4_exp's indexed
    attention, after a partial rejection, continues off the greedy path although the rolled-back
    cache layers equal freshly built ones (transformers' side; 5.21 passes the same test)."""
    if _before_5_24() and generate_cache_kwarg(model) == "cache_params":
        return "transformers < 5.24 assisted decoding needs a past_key_values cache; this model takes cache_params"
    if _version() < (5, 21) and str(getattr(getattr(model, "config", None), "model_type", "")).startswith("qwen4_exp"):
        return "transformers < 5.21: qwen4_exp's indexed attention leaves the greedy path after a crop"
    return None
