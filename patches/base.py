"""What every ReplaySSM mixer shares: routing between decode and the stock path.

A rewritten mixer is an instance whose ``__class__`` is ``type(name, (ReplayMixin
subclass, OriginalMixer), {})``. Its ``forward``:

* single-token decode on a cache whose prefill has run -> the family's replay step
  (checkpoint + ring buffer; transformers' per-step state-update function is never called);
* anything else (prefill, no cache, training, a cache that records the past) -> first
  fold any buffered tokens back into the checkpoint (so transformers sees the exact
  state in the dtype it expects), then the original class's ``forward``.
"""

from __future__ import annotations

import sys

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.conv import ACTIVATIONS, conv_update

from . import compat
from .cache_state import ReplayBuffers, attach_buffers, cache_arrivals, get_buffers
from .options import LayerReplayOptions

OPTIONS_ATTR = "_replayssm_options"


class ReplayMixin:
    """Base of the per-family replay mixins. Subclasses implement the ``_replay_*`` hooks."""

    #: "mamba2" | "gated_deltanet" | "kda"
    replay_kind: str = ""
    #: whether the family's kernel counts arrivals in the cache's shared counters
    #: (``buffers.extra["arrivals"]``, from ``cache_arrivals``)
    uses_arrival_counters: bool = False

    # ----------------------------------------------------------------- hooks
    def _replay_buffer_specs(self, batch: int, act_dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def _replay_step(self, hidden_states, layer, buffers: ReplayBuffers, attention_mask):
        raise NotImplementedError

    def _replay_materialize(self, state: torch.Tensor, buffers: ReplayBuffers) -> torch.Tensor:
        """Fold buffers into ``state`` in place; return the exact fp32 state."""
        raise NotImplementedError

    # --------------------------------------------------------------- routing
    @property
    def replay_options(self) -> LayerReplayOptions:
        return getattr(self, OPTIONS_ATTR, None) or LayerReplayOptions()

    def forward(self, hidden_states, *args, **kwargs):
        cache = compat.find_cache(kwargs)
        if cache is None and args and hasattr(args[0], "layers"):
            cache = args[0]
        layer = compat.cache_layer(cache, getattr(self, "layer_idx", None)) if cache is not None else None
        decode = (
            layer is not None
            and hidden_states.shape[1] == 1
            and not self.training
            and compat.has_previous_state(layer)
            and not compat.is_recording_past(layer)
            and compat.recurrent_state(layer) is not None
        )
        if not decode:
            if layer is not None:
                self._replay_sync_for_stock(layer)
            return super().forward(hidden_states, *args, **kwargs)
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is None and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            attention_mask = args[1]
        buffers = self._replay_prepare(layer, hidden_states)
        if self.uses_arrival_counters:
            buffers.extra["arrivals"] = cache_arrivals(cache, buffers.cursor.device, buffers.batch_size)
        return self._replay_step(hidden_states, layer, buffers, attention_mask)

    # --------------------------------------------------------------- helpers
    def _replay_prepare(self, layer, hidden_states) -> ReplayBuffers:
        """Buffers for this cache layer, allocated once per batch shape; checkpoint in its dtype."""
        opts = self.replay_options
        state = compat.recurrent_state(layer)
        batch = hidden_states.shape[0]
        act_dtype = hidden_states.dtype
        buffers = get_buffers(layer)
        key = (act_dtype, opts.buffer_len)
        if (buffers is None or buffers.extra.get("key") != key or buffers.batch_size != batch
                or buffers.cursor.device != state.device):  # first decode step of this cache / shape
            stock_dtype = buffers.stock_dtype if buffers is not None else state.dtype
            specs = self._replay_buffer_specs(batch, act_dtype)
            tensors = {name: torch.zeros(shape, dtype=dtype, device=state.device) for name, (shape, dtype) in specs.items()}
            buffers = ReplayBuffers(
                tensors=tensors,
                cursor=torch.zeros(batch, dtype=torch.int32, device=state.device),
                buffer_len=opts.buffer_len,
                stock_dtype=stock_dtype,
                extra={"key": key},
            )
            attach_buffers(layer, buffers)
        if opts.state_dtype is not None and state.dtype != opts.state_dtype:
            compat.set_recurrent_state(layer, state.to(opts.state_dtype))
        return buffers

    def _replay_sync_for_stock(self, layer) -> None:
        """Before the stock path runs: fold buffered tokens in and restore the stock dtype."""
        buffers = get_buffers(layer)
        state = compat.recurrent_state(layer)
        if buffers is None or state is None:
            return
        if buffers.batch_size == state.shape[0] and compat.has_previous_state(layer):
            exact = self._replay_materialize(state, buffers)
        else:
            exact = state.float()
            buffers.clear()
        if state.dtype != buffers.stock_dtype:
            compat.set_recurrent_state(layer, exact.to(buffers.stock_dtype))

    def _conv(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x (B, C) -> conv output (B, C), updating the cache's conv state in place.

        On the Triton backend one in-place kernel (``replayssm.kernels.conv``); otherwise
        transformers' own ``causal_conv1d_update`` of the original modeling file, and ``conv_step``
        only where a file has none.
        """
        conv_state = compat.conv_state(layer)
        weight = self.conv1d.weight.squeeze(1)
        backend = self.replay_options.backend
        if (self.activation in ACTIVATIONS and not torch.compiler.is_compiling()
                and resolve_backend(backend, x.device) == "triton"):
            return conv_update(conv_state, x, weight, self.conv1d.bias, self.activation, backend=backend)
        stock_conv = self._stock_function("causal_conv1d_update")
        if stock_conv is not None:
            return stock_conv(x[:, :, None], conv_state, weight, self.conv1d.bias, self.activation)[:, :, 0]
        return conv_step(conv_state, x, weight, self.conv1d.bias, self.activation)

    def _stock_function(self, name: str):
        """A module-level function of the original class's modeling file (resolved at call time)."""
        original = getattr(type(self), "_replayssm_original_class", None)
        module = sys.modules.get(original.__module__) if original is not None else None
        return getattr(module, name, None) if module is not None else None


def apply_padding_mask(hidden_states: torch.Tensor, attention_mask) -> torch.Tensor:
    """Zero padded positions like transformers' ``apply_mask_to_padding_states``."""
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] == hidden_states.shape[1] \
            and attention_mask.shape[0] == hidden_states.shape[0] and hidden_states.shape[0] > 1:
        return (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
    return hidden_states


def conv_step(conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias, activation: str | None):
    """One causal depthwise conv step, in place on ``conv_state`` (B, C, K); x (B, C) -> (B, C)."""
    new = torch.cat([conv_state[:, :, 1:], x[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state.copy_(new)
    out = (new.to(weight.dtype) * weight).sum(-1)
    if bias is not None:
        out = out + bias
    if activation in ("silu", "swish"):
        out = torch.nn.functional.silu(out)
    return out.to(x.dtype)
