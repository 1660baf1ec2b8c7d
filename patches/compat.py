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
  which ``conv_window_of_prefill`` brings back to K columns.
* Gated DeltaNet: 5.17 expands q/k to the value heads inside the mixer, 5.23+ inside the
  recurrent function; the ReplaySSM layers do their own expansion, so this only matters
  to code that calls transformers' functions.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any

import torch

CACHE_KWARGS = ("cache", "cache_params", "past_key_values")


def find_cache(kwargs: dict[str, Any]):
    """The transformers cache passed to a mixer, under whichever keyword this version uses."""
    for key in CACHE_KWARGS:
        cache = kwargs.get(key)
        if cache is not None:
            return cache
    return None


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


# ---------------------------------------------------------------- decode attention
#: attention implementation of a patched model: a one-token query runs the Triton decode kernel where it
#: serves the call (``decode_attention.kernel_attention``), everything else what "sdpa" runs, except that
#: on 5.17-5.23 a one-token query runs on the key/value heads directly, as 5.24's own "sdpa" does
#: (``pack_gqa``), instead of copying the whole KV cache per query head (``repeat_kv``)
GROUPED_SDPA = "replayssm_grouped_sdpa"
_SAVED_ATTN = "_replayssm_saved_attn_implementation"


@functools.cache
def sdpa_groups_decode_queries() -> bool:
    """Whether this transformers' ``sdpa`` attention already skips ``repeat_kv`` for one query token.
    Answered once, when a model is patched: torch.compile (torch 2.11) cannot trace the import."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """The Triton decode kernel for a one-token query it serves; otherwise transformers' ``sdpa``
    attention, except that on 5.17-5.23 a one-token query (B, H, 1, D) of a grouped-query layer runs as
    (B, H_kv, H / H_kv, D) against the un-repeated keys and values (B, H_kv, S, D): the same products
    per query head, without materialising the repeated cache."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from .decode_attention import kernel_attention

    out = kernel_attention(query, key, value, attention_mask, dropout, scaling, kwargs)
    if out is not None:
        return out, None
    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask
    if (torch.compiler.is_compiling() or sdpa_groups_decode_queries() or groups <= 1 or query.shape[2] != 1
            or kwargs.get("position_bias") is not None
            or (mask is not None and (mask.dim() != 4 or mask.shape[1] != 1))
            or query.shape[1] != key.shape[1] * groups):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, heads // groups, groups, dim), key, value, attn_mask=mask, dropout_p=dropout,
        scale=scaling)
    return out.reshape(out.shape[0], heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_grouped_decode_attention(model) -> bool:
    """Switch the attention modules of ``model`` from ``sdpa`` to ``GROUPED_SDPA``, this instance
    only; returns whether it switched (not for a model whose code reads the name,
    ``reads_sdpa_name``). Each submodule that is not a ``PreTrainedModel`` and whose ``config``
    answers "sdpa" gets a view of that config (``attn_view``) as its own ``config``: the modules
    pick their attention function per call by ``self.config._attn_implementation``, so they run
    ``grouped_sdpa_attention`` while the config objects themselves, which other models may share,
    and the model-level configs (mask creation, ``model.config``) keep "sdpa". Registers the name
    (with sdpa's mask function) in transformers' attention registries, which are built for
    extension; no transformers class is changed. ``restore_decode_attention`` undoes it."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or reads_sdpa_name(model):
        return False
    from transformers import PreTrainedConfig, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    sdpa_groups_decode_queries()  # answered here, outside any compiled region
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    switched = model.__dict__.setdefault(_SAVED_ATTN, [])  # (module, its config); a repeated call adds none
    for module in model.modules():
        own = module.__dict__.get("config")
        if (not isinstance(module, PreTrainedModel) and isinstance(own, PreTrainedConfig)
                and not isinstance(own, _AttnView) and own._attn_implementation == "sdpa"):
            module.config = attn_view(own)
            switched.append((module, own))
    return True


def restore_decode_attention(model) -> None:
    """Give every module switched by ``use_grouped_decode_attention`` its original config object
    back (a module whose ``config`` was replaced since keeps the replacement)."""
    for module, config in model.__dict__.pop(_SAVED_ATTN, ()):
        view = module.__dict__.get("config")
        if isinstance(view, _AttnView) and view._replayssm_config is config:
            module.config = config


class _AttnView:
    """Marks the view classes of ``attn_view`` (mixed in before the config's class)."""

    __slots__ = ()


@functools.cache
def _attn_view_class(config_class: type) -> type:
    """The view subclass of ``config_class``, made once per class. It keeps the class's name and
    ``__init__`` (``to_diff_dict`` builds a default instance of ``type(self)``), compares as the
    viewed config (``view == config``), holds the viewed config in a slot (not in the shared
    ``__dict__``) and pickles / deep-copies as ``attn_view`` of the viewed config, so the copy of a
    model holds views of its own copied configs. The getter stays trivial: torch.compile traces it
    on every attention call."""
    setter = inspect.getattr_static(config_class, "_attn_implementation").fset

    def get(self):
        value = self._attn_implementation_internal
        return GROUPED_SDPA if value == "sdpa" else value

    def set(self, value):  # the config's own setter, on the shared fields
        setter(self, value)

    def reduce(self):
        return attn_view, (self._replayssm_config,)

    def eq(self, other):  # as the viewed configs compare (the class's own __eq__ wants one class)
        return config_class.__eq__(_viewed(self), _viewed(other))

    namespace = {"__slots__": ("_replayssm_config",), "__init__": config_class.__init__,
                 "__module__": config_class.__module__, "__qualname__": config_class.__qualname__,
                 "_attn_implementation": property(get, set), "__reduce__": reduce, "__eq__": eq}
    return type(config_class.__name__, (_AttnView, config_class), namespace)


def _viewed(config):
    return getattr(config, "_replayssm_config", config)  # a default-built view class instance views none


def attn_view(config):
    """A config object that is ``config`` in every field (it shares ``config.__dict__``: a later change
    to either is seen by both) except that its ``_attn_implementation`` answers ``GROUPED_SDPA``
    where ``config`` answers "sdpa" (any other value, e.g. "eager" set later by the user's
    ``model.set_attn_implementation``, passes through). Setting it sets ``config``'s."""
    view = object.__new__(_attn_view_class(type(config)))
    object.__setattr__(view, "__dict__", config.__dict__)
    object.__setattr__(view, "_replayssm_config", config)
    return view


_SDPA_NAME_TEST = re.compile(r"""_attn_implementation\s*(?:==|!=)\s*["']sdpa["']""")


def reads_sdpa_name(model) -> bool:
    """Whether the transformers modeling code of any of ``model``'s modules compares the attention
    implementation's name with ``"sdpa"``. Such a model computes differently under another name, so
    it keeps ``sdpa``: 5.24's glm5_next builds its top-k attention mask as booleans under ``sdpa``
    and as additive floats otherwise, and a query row with no selected key (a padding position)
    then gets zeros from the first and a uniform average over every key from the second.
    Code that cannot be read (no source file) counts as reading the name: the model keeps ``sdpa``."""
    modules = {type(m).__module__ for m in model.modules()}
    return any(_reads_sdpa_name(name) for name in modules if name.startswith("transformers.models."))


@functools.lru_cache(maxsize=None)
def _reads_sdpa_name(module_name: str) -> bool:
    try:
        source = inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):  # not imported, or no source file (a frozen install)
        return True
    return _SDPA_NAME_TEST.search(source) is not None


def attention_crop(layer_class: type):
    """The ``crop`` of the attention part of a cache-layer class (the first class in its MRO that
    defines ``crop`` and is not a linear-attention layer), None for a linear-attention-only class."""
    from transformers import cache_utils

    linear = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    for cls in layer_class.__mro__:
        if "crop" in cls.__dict__ and not (linear is not None and issubclass(cls, linear)):
            return cls.__dict__["crop"]
    return None


def conv_window_of_prefill(layer, width: int) -> None:
    """After a prefill on a layer recording its past: the conv state as a (B, C, width) tensor of the
    last ``width`` inputs (zeros before the first), as a non-recording prefill leaves it."""
    conv = layer.conv_states[0]
    if conv is None or conv.shape[-1] == width:
        return
    if conv.shape[-1] > width:
        conv = conv[..., -width:]
    else:
        conv = torch.nn.functional.pad(conv, (width - conv.shape[-1], 0))
    layer.conv_states[0] = conv.contiguous()


def is_uninitialized_linear_layer(layer) -> bool:
    """A linear-attention cache layer whose states were never set (5.17 builds one for every layer
    type it does not know, MLP-only layers included, and its ``crop`` then fails)."""
    states = getattr(layer, "conv_states", None)
    return (isinstance(states, dict) and all(v is None for v in states.values())
            and all(v is None for v in getattr(layer, "recurrent_states", {}).values()))


def assisted_generation_gap(model) -> str | None:
    """Why this transformers version's own assisted generation cannot serve ``model`` (patched or
    not), or None. 5.17: its assisted loop looks the cache up under ``past_key_values`` only, which
    its pure Mamba-2 model (``cache_params``) never has; and its qwen4_exp indexed attention, after a
    partial rejection, continues off the greedy path although the rolled-back cache layers equal
    freshly built ones (transformers' side; 5.24 passes the same test)."""
    import transformers

    old = tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 18)
    if old and generate_cache_kwarg(model) == "cache_params":
        return "transformers < 5.18 assisted decoding needs a past_key_values cache; this model takes cache_params"
    if old and str(getattr(getattr(model, "config", None), "model_type", "")).startswith("qwen4_exp"):
        return "transformers < 5.18: qwen4_exp's indexed attention leaves the greedy path after a crop"
    return None
