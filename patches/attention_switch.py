"""How a patched model's attention modules reach the decode-attention kernel, per instance.

``use_grouped_decode_attention`` gives the model's attention modules a view of their config that
names ``GROUPED_SDPA``, a registered form of ``sdpa`` (``grouped_sdpa_attention``), while the config
objects keep ``sdpa``; ``restore_decode_attention`` undoes it. A model whose modeling code reads the
name (``reads_sdpa_name``) keeps ``sdpa``.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys

import torch

from . import compat

#: attention implementation of a patched model: a one-token query runs the Triton decode kernel where it
#: serves the call (``decode_attention.kernel_attention``), everything else what "sdpa" runs, except that
#: on 5.17-5.23 a one-token query runs on the key/value heads directly, as 5.24's own "sdpa" does
#: (``pack_gqa``), instead of copying the whole KV cache per query head (``repeat_kv``)
GROUPED_SDPA = "replayssm_grouped_sdpa"
#: model-instance attribute: the (module, original config) pairs ``use_grouped_decode_attention`` switched
_SWITCHED = "_replayssm_attention_views"


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """An MLA module's latents through ``latent_attention``; the Triton decode kernel for a one-token
    query it serves; otherwise transformers' ``sdpa``
    attention, except that on 5.17-5.23 a one-token query (B, H, 1, D) of a grouped-query layer runs as
    (B, H_kv, H / H_kv, D) against the un-repeated keys and values (B, H_kv, S, D): the same products
    per query head, without materialising the repeated cache."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from . import latent_attention
    from .decode_attention import kernel_attention

    # key and value are an MLA module's latents (its expand_kv's mark; never set in a compiled region)
    if not torch.compiler.is_compiling() and latent_attention.latent_call(module):
        return latent_attention.attend(module, query, key, value, attention_mask, dropout, scaling, kwargs, lambda k, v:
                                       grouped_sdpa_attention(module, query, k, v, attention_mask, dropout, scaling,
                                                              is_causal, **kwargs)[0]), None
    out = kernel_attention(query, key, value, attention_mask, dropout, scaling, kwargs)
    if out is not None:
        return out, None
    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask
    if (torch.compiler.is_compiling() or compat.sdpa_groups_decode_queries() or groups <= 1 or query.shape[2] != 1
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

    compat.sdpa_groups_decode_queries()  # answered here, outside any compiled region
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    switched = model.__dict__.setdefault(_SWITCHED, [])  # (module, its config); a repeated call adds none
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
    for module, config in model.__dict__.pop(_SWITCHED, ()):
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
