"""What every ReplaySSM mixer shares: routing between decode and the stock path.

A rewritten mixer is an instance whose ``__class__`` is ``type(name, (ReplayMixin
subclass, OriginalMixer), {})``. Its ``forward``:

* single-token decode on a cache whose prefill has run -> the family's replay step
  (checkpoint + ring buffer; transformers' per-step state-update function is never called);
* anything else (prefill, no cache, training, a cache that records the past) -> first
  fold any buffered tokens back into the checkpoint (so transformers sees the exact
  state in the dtype it expects), then the original class's ``forward``; after it, the
  cache layer gets its buffers (allocated here, eagerly, so that a compiled decode step
  allocates nothing and wraps nothing).

Options change (``patch`` again) and ``unpatch`` go through ``_replay_reconfigure`` /
``_replay_release``: every live cache the mixer prepared is folded, so it carries over exactly.
"""

from __future__ import annotations

import sys

import torch

from replayssm.kernels.backend import resolve_backend
from replayssm.kernels.conv import ACTIVATIONS, conv_update

from . import compat, speculative
from .cache_state import (ReplayBuffers, attach_buffers, cache_arrivals, detach_buffers, forget, get_buffers,
                          live_layers)
from .kinds import LayerKind
from .options import LayerReplayOptions
from .quant_state import decode_state, encode_state, init_quant_tensors, quant_specs

OPTIONS_ATTR = "_replayssm_options"


class ReplayMixin:
    """Base of the per-family replay mixins. Subclasses implement the ``_replay_*`` hooks."""

    #: the layer kind this mixin rewrites (``kinds.KINDS``): its shapes and buffer specs
    layer_kind: LayerKind
    #: whether the family's kernel counts arrivals in the cache's shared counters
    #: (``buffers.extra["arrivals"]``, from ``cache_arrivals``)
    uses_arrival_counters: bool = False
    #: the state dimension an int8 / fp8 checkpoint's scales run over (the family's kernels')
    state_scale_dim: int = -1

    # ----------------------------------------------------------------- hooks
    def _replay_buffer_specs(self, batch: int, act_dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        kind = self.layer_kind
        opts = self.replay_options
        shapes = kind.shapes(self)
        specs = kind.buffer_specs(shapes, batch, opts.buffer_len, act_dtype)
        specs.update(quant_specs(opts, kind.state_shape(shapes), batch, self.state_scale_dim, opts.state_dtype))
        return specs

    def _replay_step(self, hidden_states, layer, buffers: ReplayBuffers, attention_mask, window: bool = False):
        """Decode step (hidden_states (B, 1, hidden)), or with ``window`` (after
        ``speculative.prepare_window``) a verify of T >= 1 tokens (B, T, hidden) on the window path."""
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
        if layer is not None:
            speculative.check_not_refused(layer)
        ready = (
            layer is not None
            and not self.training
            and compat.has_previous_state(layer)
            and compat.recurrent_state(layer) is not None
        )
        # a cache recording its past (speculative decoding) takes every forward, T >= 1 tokens, on the
        # window path (its tokens stay roll-back-able); any other cache only single-token decode steps
        window = ready and compat.is_recording_past(layer)
        if (layer is not None and not ready and not self.training and hidden_states.shape[1] > 1
                and compat.is_recording_past(layer) and not torch.compiler.is_compiling()):
            return self._replay_prefill_with_window(cache, layer, hidden_states, args, kwargs)
        if not window and not (ready and hidden_states.shape[1] == 1):
            if layer is not None:
                self._replay_sync_for_stock(layer)
            out = super().forward(hidden_states, *args, **kwargs)
            if layer is not None and not self.training and not torch.compiler.is_compiling():
                self._replay_ready(cache, layer, hidden_states)
            return out
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is None and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            attention_mask = args[1]
        buffers = self._replay_prepare(layer, hidden_states)
        if self.uses_arrival_counters:
            buffers.extra["arrivals"] = cache_arrivals(cache, buffers.cursor.device, buffers.batch_size)
        if window:
            speculative.enable_layer_rollback(layer, cache)
            speculative.prepare_window(self, layer, buffers, hidden_states.shape[1])
            return self._replay_step(hidden_states, layer, buffers, attention_mask, window=True)
        if speculative.HIST in buffers.tensors:  # the cache stopped recording its past
            speculative.leave_rollback_mode(self, layer, buffers)
        return self._replay_step(hidden_states, layer, buffers, attention_mask)

    def _replay_prefill_with_window(self, cache, layer, hidden_states, args, kwargs):
        """A prefill on a cache recording its past: its last tokens may be drafts that a crop removes
        (assisted generation's first round verifies the prompt and the drafts in one forward), so the
        last ``min(S - 1, L)`` tokens take the window path (roll-back-able) and the rest the stock
        prefill."""
        S = hidden_states.shape[1]
        head = S - min(S - 1, self.replay_options.buffer_len)

        def cut(value, lo, hi):  # per-token 2-D inputs (the padding mask) follow the split
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == hidden_states.shape[:2]:
                return value[:, lo:hi]
            return value

        keep = compat.conv_state(layer)  # transformers replaces it in this prefill (recording its past)
        compat.keep_no_state_history(layer)
        out_head = super().forward(hidden_states[:, :head], *[cut(a, 0, head) for a in args],
                                   **{k: cut(v, 0, head) for k, v in kwargs.items()})
        self._replay_ready(cache, layer, hidden_states, keep_conv=keep)
        tail_args = [cut(a, head, S) for a in args]
        tail_kwargs = {k: cut(v, head, S) for k, v in kwargs.items()}
        out_tail = self.forward(hidden_states[:, head:], *tail_args, **tail_kwargs)  # now the window path
        return torch.cat([out_head, out_tail], dim=1)

    # --------------------------------------------------------------- helpers
    def _replay_key(self, act_dtype: torch.dtype, stock_dtype: torch.dtype) -> tuple:
        """What the buffers' layout and the checkpoint's dtype depend on."""
        opts = self.replay_options
        return act_dtype, opts.buffer_len, opts.state_dtype or stock_dtype, opts.state_rounding, opts.state_seed

    def _replay_prepare(self, layer, hidden_states) -> ReplayBuffers:
        """The decode step's buffers; the checkpoint in its dtype. Nothing is allocated here once the
        prefill has run (``_replay_ready``), so that a compiled decode step only reads the cache."""
        state = compat.recurrent_state(layer)
        buffers = get_buffers(layer)
        if (buffers is None or buffers.extra.get("key") != self._replay_key(hidden_states.dtype, buffers.stock_dtype)
                or buffers.batch_size != hidden_states.shape[0] or buffers.cursor.device != state.device):
            # a cache this mixer did not prepare, or options / batch / device changed behind its back
            buffers = torch.compiler.disable(self._replay_rebuild)(layer, hidden_states.shape[0], hidden_states.dtype)
            state = compat.recurrent_state(layer)
        target = buffers.extra["key"][2]
        if state.dtype != target:  # first decode step after a prefill: every cursor is 0
            compat.set_recurrent_state(layer, encode_state(state, buffers.tensors, target, self.state_scale_dim))
        return buffers

    def _replay_pack(self) -> None:
        """Store the weights of projections that share an input as one buffer (``packed_linear``); a family
        with such projections says which."""

    def _replay_ready(self, cache, layer, hidden_states, keep_conv=None) -> None:
        """After the stock path: have buffers (and the cache's arrival counters) ready for decoding
        (``keep_conv``: see ``compat.conv_window_of_prefill``), and the projections packed again if their
        weights were replaced or moved since ``patch``."""
        if not (torch.compiler.is_compiling() or (hidden_states.is_cuda and torch.cuda.is_current_stream_capturing())):
            self._replay_pack()
        state = compat.recurrent_state(layer)
        if state is None or not compat.has_previous_state(layer):
            return
        if compat.is_recording_past(layer):  # a prefill of a cache that will roll back (speculative decoding)
            compat.conv_window_of_prefill(layer, self.conv1d.weight.shape[-1], keep_conv)
            speculative.enable_layer_rollback(layer, cache)
        buffers = get_buffers(layer)
        if (buffers is None or buffers.extra.get("key") != self._replay_key(hidden_states.dtype, buffers.stock_dtype)
                or buffers.batch_size != state.shape[0] or buffers.cursor.device != state.device
                or buffers._owner is None or buffers._owner() is not self):
            self._replay_rebuild(layer, state.shape[0], hidden_states.dtype, convert=False)
        if self.uses_arrival_counters:
            get_buffers(layer).extra["arrivals"] = cache_arrivals(cache, state.device, state.shape[0])

    def _replay_rebuild(self, layer, batch: int, act_dtype: torch.dtype, convert: bool = True) -> ReplayBuffers:
        """New buffers for the current options; pending entries of the old ones are folded into the
        checkpoint first (exactly), and (``convert``) the checkpoint is given the dtype the options
        ask for. After a prefill the checkpoint keeps the stock dtype until the first decode step,
        so that a prefill in several chunks runs on the stock state throughout."""
        old = get_buffers(layer)
        exact = self._replay_fold(layer)
        state = compat.recurrent_state(layer)
        stock_dtype = old.stock_dtype if old is not None else state.dtype
        key = self._replay_key(act_dtype, stock_dtype)
        specs = self._replay_buffer_specs(batch, act_dtype)
        buffers = ReplayBuffers(
            tensors={name: torch.zeros(shape, dtype=dtype, device=state.device) for name, (shape, dtype) in specs.items()},
            cursor=torch.zeros(batch, dtype=torch.int32, device=state.device),
            buffer_len=self.replay_options.buffer_len,
            stock_dtype=stock_dtype,
            extra={"key": key, "arrivals": None},  # fixed keys: a compiled step guards on them
        )
        init_quant_tensors(buffers.tensors, self.replay_options, int(getattr(self, "layer_idx", 0) or 0))
        if old is not None and exact is not None and state.dtype == key[2]:
            # the checkpoint keeps its dtype: it keeps its scales (and rows their random streams)
            for name in ("state_scale", "state_rng"):
                if name in buffers.tensors and name in old.tensors \
                        and old.tensors[name].shape == buffers.tensors[name].shape:
                    buffers.tensors[name].copy_(old.tensors[name].to(state.device))
        attach_buffers(layer, buffers, owner=self)
        if convert and exact is not None and state.dtype != key[2]:
            compat.set_recurrent_state(layer, encode_state(exact, buffers.tensors, key[2], self.state_scale_dim))
        return buffers

    def _replay_fold(self, layer) -> torch.Tensor | None:
        """Fold the layer's pending buffer entries into its checkpoint, in place.

        Returns the exact fp32 state, or None where there is nothing to fold (no buffers, or no
        prefill yet: the next prefill overwrites the state). Raises CacheStateError when pending
        entries cannot be matched with the checkpoint's rows, rather than drop them.
        """
        buffers = get_buffers(layer)
        state = compat.recurrent_state(layer)
        if buffers is None or state is None:
            return None
        # a cache made under torch.inference_mode() is folded in it (e.g. by unpatch, outside it)
        with torch.no_grad(), torch.inference_mode(state.is_inference()):
            return self._replay_fold_now(layer, buffers, state)

    def _replay_fold_now(self, layer, buffers: ReplayBuffers, state: torch.Tensor) -> torch.Tensor | None:
        if not compat.has_previous_state(layer):
            buffers.clear()
            return None
        if buffers.batch_size != state.shape[0]:
            if buffers.pending():
                from replayssm.errors import CacheStateError

                raise CacheStateError(
                    f"layer {getattr(self, 'layer_idx', '?')}: expected the cache's recurrent state to have the "
                    f"{buffers.batch_size} rows its ReplaySSM buffers hold pending tokens for, found "
                    f"{state.shape[0]}: the cache was edited by something that does not edit its buffers too",
                    hint="edit a cache through its own methods (reorder_cache, batch_select_indices, ...), "
                         "or start a new one")
            buffers.clear()
            return None
        if buffers.cursor.device != state.device:
            buffers.to(state.device)
        return self._replay_materialize(state, buffers)

    def _replay_foldable(self, layer) -> bool:
        buffers = get_buffers(layer)
        state = compat.recurrent_state(layer)
        return (buffers is None or state is None or not compat.has_previous_state(layer)
                or buffers.batch_size == state.shape[0] or not buffers.pending())

    def _replay_sync_for_stock(self, layer) -> None:
        """Before the stock path runs: fold buffered tokens in and restore the stock dtype."""
        buffers = get_buffers(layer)
        exact = self._replay_fold(layer)
        state = compat.recurrent_state(layer)
        if buffers is None or state is None or state.dtype == buffers.stock_dtype:
            return
        if exact is None:
            exact = decode_state(state, buffers.tensors, self.state_scale_dim)
        compat.set_recurrent_state(layer, exact.to(buffers.stock_dtype))

    def _replay_reconfigure(self, options: LayerReplayOptions) -> None:
        """New options for this mixer. Every live cache it prepared carries over exactly: pending
        entries folded into the checkpoint, buffers rebuilt for the new options. Raises
        CacheStateError (and changes nothing) if one of them cannot be folded."""
        layers = live_layers(self)
        self._replay_check_live_caches()
        setattr(self, OPTIONS_ATTR, options)
        for layer in layers:
            state = compat.recurrent_state(layer)
            if state is None:
                detach_buffers(layer)
            else:
                self._replay_rebuild(layer, state.shape[0], get_buffers(layer).extra["key"][0])

    def _replay_check_live_caches(self) -> None:
        """Raise CacheStateError if a live cache of this mixer holds entries that cannot be folded."""
        for layer in live_layers(self):
            if not self._replay_foldable(layer):
                self._replay_fold(layer)  # raises

    def _replay_release(self) -> None:
        """Before unpatching: turn every live cache this mixer prepared into a plain stock cache
        (pending entries folded, checkpoint in the stock dtype, buffers and wrappers removed). A
        cache whose pending entries cannot be folded gets a NaN state: it can no longer be read
        right by the stock layer, and must not be read silently wrong."""
        for layer in live_layers(self):
            buffers, state = get_buffers(layer), compat.recurrent_state(layer)
            if state is not None and not self._replay_foldable(layer):
                compat.set_recurrent_state(layer, torch.full_like(state, float("nan"), dtype=buffers.stock_dtype))
            else:
                self._replay_sync_for_stock(layer)
            detach_buffers(layer)
        forget(self)

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
            return conv_update(conv_state, x, weight, self.conv1d.bias, self.activation,
                               compat.token_count(layer, x.device), backend=backend)
        compat.count_tokens(layer, 1)
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
