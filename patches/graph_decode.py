"""CUDA-graph decoding inside ``model.generate()`` for patched models.

``GraphDecoder.install(model)`` sets ``generate`` and ``forward`` as instance attributes of the
model (``uninstall`` removes them). The ``generate`` wrapper hands transformers a pooled
``StaticCache`` of this batch size and capacity (so every tensor a decode step touches has a
fixed address, reused by later calls) and turns transformers' own ``torch.compile`` off; the
``forward`` wrapper then runs the first decode step of a slot eagerly (the warm-up: Triton
compiles, cuBLAS picks its kernels), captures the second into a CUDA graph and replays that
graph for every later step, copying the step's inputs (token ids, positions, the 4-D attention
mask transformers builds for a static cache) into the graph's static input tensors. Prefill and
everything around the model call (logits processors, sampling, stopping) stay eager.

Assisted generation (a draft model, prompt lookup) gets pooled slots of its own (before transformers
5.24 a ``StaticCache`` subclass with croppable attention layers, ``compat.static_cache_class``):
after the prefill, every forward of T new tokens (a verify window, T = 1 in rounds without drafts)
is captured once per shape on its second occurrence and replayed after that, while every ReplaySSM
layer has all its entries committed (the state each crop leaves, which the captured window assumed:
``speculative.settled``); the crops run eagerly.
transformers' decode context (a MoE's experts switched to ``batched_mm``), which 5.24's assisted loop
enters and leaves around every forward and 5.17's never enters, is entered once per call here, at the
first forward after the prefill, and left when ``generate`` returns: every window then runs the
experts as plain decoding does, and the switch (two walks over every module) runs once.

Whatever the graphs cannot serve falls back to the eager patched path with one log line: beam
search, a cache passed in, a cache implementation asked for, a model off CUDA, a sliding-window
attention layer (its cache keeps a host-side counter that a graph would freeze), more tokens than
``max_len``, a capture that fails.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteriaList
from transformers.generation.configuration_utils import GenerationMode

from . import compat, speculative
from .cache_state import get_buffers
from .graph_inputs import StepInputs
from .launch_ahead import LaunchAhead

logger = logging.getLogger("replayssm")

ATTR = "_replayssm_graphs"
#: cache-layer classes whose decode step reads and writes only device tensors at fixed addresses
GRAPH_SAFE_LAYERS = frozenset({"StaticLayer", "LinearAttentionLayer", "LinearAttentionAndStaticFullAttentionLayer",
                               "DummyLayer"})
#: capacity of a pooled cache when no ``max_len`` is set: the call's need rounded up to a power of
#: two, at least this (attention in a static cache reads every position, so capacity costs time)
MIN_LEN = 64
#: pooled caches (with their graphs) kept per model; the least recently used goes first
MAX_SLOTS = 4
_WRAPPED = ("generate", "forward", "prepare_inputs_for_generation", compat.DECODE_SWITCH)
#: decoding modes whose loop (transformers' ``_sample``) copies a step's logits before the next step
_COPYING_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
_ASSISTED = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "assistant_tokenizer")


def cuda_graphs_available(device: torch.device) -> bool:
    """Whether decode steps on ``device`` can be captured (a CUDA device)."""
    return device.type == "cuda" and torch.cuda.is_available()


class CudaGraph:
    """A captured callable: ``capture_and_run(fn)`` records ``fn`` and runs it once, ``replay()`` again."""

    def __init__(self, pool):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    @staticmethod
    def new_pool():
        return torch.cuda.graph_pool_handle()

    @staticmethod
    def memory_allocated() -> int:
        return torch.cuda.memory_allocated()

    def capture_and_run(self, fn):
        with torch.cuda.graph(self.graph, pool=self.pool):
            output = fn()
        self.graph.replay()
        return output

    def replay(self) -> None:
        self.graph.replay()

    def replay_ahead(self) -> None:
        """Replay on the side stream, behind the work queued so far on the current one."""
        stream = side_stream()
        stream.wait_stream(torch.cuda.current_stream())
        if not hasattr(self, "done"):
            self.done = torch.cuda.Event()
        with torch.cuda.stream(stream):
            self.graph.replay()
            self.done.record(stream)

    def wait_ahead(self) -> None:
        """Queue the current stream behind the last ``replay_ahead``."""
        torch.cuda.current_stream().wait_event(self.done)


_SIDE_STREAMS: dict[int, "torch.cuda.Stream"] = {}


def side_stream() -> "torch.cuda.Stream":
    """The current device's side stream: one per device for the process (cuBLAS keeps a workspace
    per stream it has run on, for good)."""
    device = torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def _side_stream_call(fn):
    """Run ``fn`` on the side stream (warm-up steps before a capture, as CUDA graphs want)."""
    if not torch.cuda.is_available():
        return fn()
    stream = side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        result = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return result


@dataclass
class GraphSlot:
    """One pooled static cache and the decode graph captured on it."""

    batch_size: int
    max_len: int
    cache: object
    graph: CudaGraph | None = None
    signature: tuple | None = None
    addresses: tuple | None = None
    static_inputs: dict = field(default_factory=dict)
    static_output: object = None
    warm_signature: tuple | None = None
    step: int = 0
    capture_s: float | None = None
    captures: int = 0
    graph_bytes: int = 0
    failed: str | None = None
    last_used: int = 0
    inputs: StepInputs = field(default_factory=StepInputs)
    window_inputs: dict = field(default_factory=dict)  # T -> StepInputs(T) (assisted slots)
    share_output: bool = False  # this call's loop copies the logits before the next step (greedy / sampling)
    ahead: "LaunchAhead | None" = None  # this call's early launch of the next step, where it may run
    launched_ahead: int = 0
    assisted: bool = False  # a slot of assisted generation: its forwards after the prefill are windows
    windows: dict = field(default_factory=dict)  # signature -> WindowGraph (assisted slots)
    warm_windows: set = field(default_factory=set)  # signatures run once eagerly (assisted slots)
    window_replays: int = 0  # window forwards replayed from a graph (assisted slots)
    checked_windows: set = field(default_factory=set)  # signatures whose cache addresses this call checked

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _cache_tensors(self.cache))

    def report(self) -> dict:
        return {"batch_size": self.batch_size, "max_len": self.max_len, "assisted": self.assisted,
                "captured": self.graph is not None or bool(self.windows), "window_graphs": len(self.windows),
                "window_replays": self.window_replays,
                "captures": self.captures, "steps_launched_ahead": self.launched_ahead,
                "capture_s": self.capture_s, "cache_bytes": self.cache_bytes(),
                "graph_bytes": self.graph_bytes, "memory_bytes": self.cache_bytes() + self.graph_bytes,
                "fallback": self.failed}


@dataclass
class WindowGraph:
    """A captured forward of one window shape on an assisted slot."""

    graph: CudaGraph
    static_inputs: dict
    static_output: object
    addresses: tuple


def _cache_tensors(cache) -> list[torch.Tensor]:
    """Every device tensor a decode step may read or write, in a fixed order."""
    found: list[torch.Tensor] = []
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values", "cumulative_length", "cumulative_length_linear"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor):
                found.append(value)
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                found.extend(t for t in states.values() if isinstance(t, torch.Tensor))
        buffers = get_buffers(layer)
        if buffers is not None:
            found.extend(buffers.tensors.values())
            found.append(buffers.cursor)
    arrivals = getattr(cache, "__dict__", {}).get("_replayssm_arrivals", {})
    found.extend(arrivals.values())
    return found


def _addresses(cache) -> tuple:
    return tuple((t.data_ptr(), t.dtype, tuple(t.shape)) for t in _cache_tensors(cache))


def _signature(value):
    """A hashable description of a forward's arguments: tensors by shape/dtype/device, caches by identity."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device, value.stride())
    if isinstance(value, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in sorted(value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    return ("object", id(value))


def _window_len(kwargs: dict) -> int:
    """Tokens per row of a forward: input_ids (B, T) or inputs_embeds (B, T, hidden)."""
    ids = kwargs.get("input_ids")
    return (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]


def _static_copy(value):
    """Fresh tensors (outside any graph pool) of the same shape and contents."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _static_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_static_copy(v) for v in value)
    return value


def _copy_into(static, value) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(value)
    elif isinstance(static, dict):
        for k, v in static.items():
            _copy_into(v, value[k])
    elif isinstance(static, (list, tuple)):
        for s, v in zip(static, value):
            _copy_into(s, v)


def _fresh_output(static_output):
    """A copy of the graph's output object whose tensors the next replay will not overwrite."""
    out = copy.copy(static_output)
    for key, value in static_output.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.clone()
    return out


class GraphDecoder:
    """The CUDA-graph decode of one model (its pooled caches and graphs); see the module notes."""

    def __init__(self, model: torch.nn.Module, max_len: int | None = None):
        self.model = model
        self.max_len = max_len
        self.slots: list[GraphSlot] = []
        self.current: GraphSlot | None = None
        self._clock = 0
        self._logged: set[str] = set()
        self._original_generate = model.generate
        self._original_forward = model.forward
        self._original_prepare = model.prepare_inputs_for_generation
        self._original_switch = getattr(model, compat.DECODE_SWITCH, None)
        self._switched: contextlib.ExitStack | None = None  # the decode context, while a call holds it
        self._saved = {name: model.__dict__[name] for name in _WRAPPED if name in model.__dict__}

    # ------------------------------------------------------------ install
    @classmethod
    def install(cls, model: torch.nn.Module, max_len: int | None = None) -> "GraphDecoder":
        existing = getattr(model, ATTR, None)
        if existing is not None:
            existing.max_len = max_len
            existing.release()
            return existing
        decoder = cls(model, max_len)

        @functools.wraps(decoder._original_generate)
        def generate(*args, **kwargs):
            return decoder.generate(*args, **kwargs)

        @functools.wraps(decoder._original_forward)
        def forward(*args, **kwargs):
            return decoder.forward(*args, **kwargs)

        @functools.wraps(decoder._original_prepare)
        def prepare_inputs_for_generation(*args, **kwargs):
            return decoder.prepare_inputs(*args, **kwargs)

        model.generate, model.forward = generate, forward
        model.prepare_inputs_for_generation = prepare_inputs_for_generation
        if decoder._original_switch is not None:
            setattr(model, compat.DECODE_SWITCH, decoder.decode_switch)
        setattr(model, ATTR, decoder)
        return decoder

    @staticmethod
    def uninstall(model: torch.nn.Module) -> None:
        decoder = getattr(model, ATTR, None)
        if decoder is None:
            return
        decoder.release()
        for name in _WRAPPED:
            model.__dict__.pop(name, None)
            if name in decoder._saved:
                model.__dict__[name] = decoder._saved[name]
        delattr(model, ATTR)

    @staticmethod
    def of(model: torch.nn.Module) -> "GraphDecoder | None":
        return getattr(model, ATTR, None)

    def release(self) -> None:
        """Drop every pooled cache and graph (their memory returns to PyTorch's allocator)."""
        self.slots.clear()
        self.current = None

    def report(self) -> list[dict]:
        return [slot.report() for slot in self.slots]

    # ------------------------------------------------------------ generate
    def decode_switch(self):
        """transformers' decode context: entered at its first use in a graph-decoded call and held until
        ``generate`` returns (an empty context for the later uses); outside such a call, the original."""
        if self.current is None:
            return self._original_switch()
        self._hold_decode_switch()
        return contextlib.nullcontext()

    def _hold_decode_switch(self) -> None:
        """Enter transformers' decode context for the rest of this call, once."""
        if self._switched is None and self._original_switch is not None:
            self._switched = contextlib.ExitStack()
            self._switched.enter_context(self._original_switch())

    def _log_once(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("replayssm: CUDA-graph decoding not used: %s; decoding eagerly", reason)

    def _fallback_reason(self, kwargs, config) -> str | None:
        model = self.model
        if not cuda_graphs_available(model.device):
            return f"the model is on {model.device.type}, CUDA graphs need a CUDA device"
        if model.training:
            return "the model is in training mode"
        if compat.find_cache(kwargs) is not None:
            return "a cache was passed in"
        if (config.num_beams or 1) > 1:
            return "beam search"
        if config.use_cache is False:
            return "use_cache=False"
        if config.cache_implementation is not None:
            return f"cache_implementation={config.cache_implementation!r} was asked for"
        if config.output_attentions or config.output_hidden_states:
            return "per-layer outputs (attentions / hidden states) were asked for"
        if getattr(config, "prefill_chunk_size", None):
            return "chunked prefill"
        return None

    def _prompt_shape(self, args, kwargs) -> tuple[int, int] | None:
        for value in (*args[:1], kwargs.get("input_ids"), kwargs.get("inputs"), kwargs.get("inputs_embeds")):
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                return int(value.shape[0]), int(value.shape[1])
        return None

    def generate(self, *args, **kwargs):
        base = kwargs.get("generation_config") or self.model.generation_config
        config = copy.deepcopy(base)
        config.update(**{k: v for k, v in kwargs.items() if k != "generation_config"})
        shape = self._prompt_shape(args, kwargs)
        reason = self._fallback_reason(kwargs, config)
        if reason is None and shape is None:
            reason = "no input_ids / inputs_embeds tensor to size the cache"
        assisted = _assisted(kwargs)
        if reason is None:
            batch = shape[0] * (config.num_return_sequences or 1)
            new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - shape[1]
            # a verify window writes its drafts past the tokens kept: room for one ring of them
            need = shape[1] + max(int(new), 1) + (_window_room(self.model) if assisted else 0)
            if self.max_len is not None and need > self.max_len:
                reason = f"the call needs {need} cache positions, above graph_max_len={self.max_len}"
        if reason is not None:
            self._log_once(reason)
            return self._original_generate(*args, **kwargs)

        slot = self._slot(batch, need, assisted)
        reason = self._unsafe_layers(slot.cache)
        if reason is not None:
            self.slots.remove(slot)
            self._log_once(reason)
            return self._original_generate(*args, **kwargs)
        slot.cache.reset()
        slot.step = 0
        slot.inputs.new_call()
        for inputs in slot.window_inputs.values():
            inputs.new_call()
        slot.share_output = config.get_generation_mode() in _COPYING_MODES
        # the early launch leaves one step too many in the cache when EOS ends the loop: only where
        # the cache stays in the pool (a returned one must hold exactly the generated tokens)
        slot.ahead = LaunchAhead(slot, need) if (
            slot.share_output and not config.return_dict_in_generate and len(args) <= 1) else None
        if slot.ahead is not None:
            criteria = kwargs.get("stopping_criteria")
            kwargs["stopping_criteria"] = StoppingCriteriaList([*(criteria or []), slot.ahead])
        self.current = slot
        kwargs[compat.generate_cache_kwarg(self.model)] = slot.cache
        kwargs["disable_compile"] = True
        inputs_agreed = True
        try:
            result = self._original_generate(*args, **kwargs)
        finally:
            self.current = None
            if self._switched is not None:
                self._switched, switched = None, self._switched
                switched.close()
            if slot.ahead is not None:
                inputs_agreed = slot.ahead.finish()
                slot.launched_ahead += slot.ahead.launched
                slot.ahead = None
        if not inputs_agreed:
            from replayssm.errors import GraphDecodeError

            self.slots.remove(slot)
            raise GraphDecodeError("a decode step launched ahead ran on other inputs than generate() then passed; "
                                   "the result is discarded", hint="patch the model with cuda_graphs=False and report this")
        if isinstance(result, dict) and any(value is slot.cache for value in result.values()):
            # the caller now holds this cache: never reset it under them, never replay onto it again
            self.slots.remove(slot)
        return result

    def _slot(self, batch: int, need: int, assisted: bool = False) -> GraphSlot:
        self._clock += 1
        fitting = [s for s in self.slots if s.batch_size == batch and s.max_len >= need and s.assisted == assisted]
        if fitting:
            slot = min(fitting, key=lambda s: s.max_len)
        else:
            max_len = self.max_len or max(MIN_LEN, 1 << (need - 1).bit_length())
            cache_class = compat.static_cache_class(assisted)
            slot = GraphSlot(batch_size=batch, max_len=max_len, assisted=assisted,
                             cache=cache_class(config=self.model.config, max_cache_len=max_len))
            self.slots.append(slot)
            while len(self.slots) > MAX_SLOTS:
                self.slots.remove(min(self.slots, key=lambda s: s.last_used))
        slot.last_used = self._clock
        return slot

    @staticmethod
    def _unsafe_layers(cache) -> str | None:
        names = sorted({getattr(type(layer), "_replayssm_original_layer_class", type(layer)).__name__
                        for layer in cache.layers} - GRAPH_SAFE_LAYERS)
        if names:
            return f"cache layers {', '.join(names)} keep host-side state that a graph would freeze"
        return None

    # ------------------------------------------------------------ inputs, forward
    def prepare_inputs(self, input_ids, *args, **kwargs):
        slot = self.current
        T = kwargs.get("next_sequence_length")
        if (slot is None or args or type(T) is not int or T < 1 or (T > 1 and not slot.assisted)
                or kwargs.get("is_first_iteration") or compat.find_cache(kwargs) is not slot.cache):
            return self._original_prepare(input_ids, *args, **kwargs)
        inputs = slot.window_inputs.setdefault(T, StepInputs(T)) if slot.assisted else slot.inputs
        return inputs.prepare(lambda: self._original_prepare(input_ids, **kwargs), input_ids, kwargs)

    def forward(self, *args, **kwargs):
        slot = self.current
        if slot is not None and slot.assisted and not args and compat.find_cache(kwargs) is slot.cache:
            return self._window_forward(slot, kwargs)
        if slot is None or args or compat.find_cache(kwargs) is not slot.cache or not _single_token(kwargs):
            if slot is not None and slot.ahead is not None and slot.ahead.pending:
                slot.ahead.collect(kwargs, same_structure=False)  # raises: the cache is a step ahead
            return self._original_forward(*args, **kwargs)
        slot.step += 1
        signature = _signature(kwargs)
        if slot.failed is not None:
            return self._original_forward(**kwargs)
        if slot.ahead is not None and slot.ahead.pending:
            return slot.ahead.collect(kwargs, signature == slot.signature)
        if slot.graph is not None and signature == slot.signature and (
                slot.step > 2 or _addresses(slot.cache) == slot.addresses):
            _copy_into(slot.static_inputs, kwargs)
            slot.graph.replay()
            if slot.ahead is not None:
                slot.ahead.ran_graph()
            return self._output(slot)
        if slot.step > 1 and slot.warm_signature == signature:
            return self._capture(slot, kwargs, signature)
        slot.warm_signature = signature
        return _side_stream_call(lambda: self._original_forward(**kwargs))

    def _try_capture(self, slot: GraphSlot, kwargs: dict):
        """Capture (and run) one forward on static copies of ``kwargs`` in a graph with its own memory pool
        (a shared pool's handle dies with the last graph using it). Returns ``(graph, static inputs, output,
        graph bytes)``, or None where the forward cannot be captured (a host sync, a data-dependent shape):
        then the slot records why, one log line says so, nothing ran on the device, and the caller runs the
        forward eagerly, as the slot's later forwards do."""
        static_inputs = _static_copy(kwargs)
        graph = CudaGraph(CudaGraph.new_pool())
        before = CudaGraph.memory_allocated()
        try:
            output = graph.capture_and_run(lambda: self._original_forward(**static_inputs))
        except Exception as exc:
            slot.failed = f"capture failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            self._log_once(slot.failed)
            return None
        slot.captures += 1
        return graph, static_inputs, output, max(CudaGraph.memory_allocated() - before, 0)

    def _capture(self, slot: GraphSlot, kwargs: dict, signature: tuple):
        start = time.perf_counter()
        captured = self._try_capture(slot, kwargs)
        if captured is None:
            return self._original_forward(**kwargs)
        slot.capture_s = time.perf_counter() - start
        slot.graph, slot.static_inputs, slot.static_output, slot.graph_bytes = captured
        slot.signature, slot.addresses = signature, _addresses(slot.cache)
        if slot.ahead is not None:
            slot.ahead.ran_graph()
        return self._output(slot)

    def _window_forward(self, slot: GraphSlot, kwargs: dict):
        """A forward on an assisted slot: the prefill (its first) eagerly; then each window shape
        eagerly once, captured the second time, replayed after that while the cache is settled."""
        slot.step += 1
        if slot.step == 1:  # the prefill: the cache's tensors may have moved since the last call
            slot.checked_windows.clear()
            return self._original_forward(**kwargs)
        # every window in the decode context, as in plain decoding (5.17's assisted loop never enters it,
        # and a MoE's grouped_mm experts would be captured then)
        self._hold_decode_switch()
        if slot.failed is not None or not speculative.settled(slot.cache):
            return self._original_forward(**kwargs)
        signature = _signature(kwargs)
        record = slot.windows.get(signature)
        if record is not None and signature not in slot.checked_windows:
            # once a call (the walk over every cache tensor costs about 1 us each, per round otherwise):
            # after the prefill, a window forward keeps every tensor of the cache where it is
            if record.addresses != _addresses(slot.cache):
                del slot.windows[signature]  # the cache's tensors moved (a rebuild): capture again
                slot.warm_windows.discard(signature)
                record = None
            else:
                slot.checked_windows.add(signature)
        if record is not None:
            _copy_into(record.static_inputs, kwargs)
            record.graph.replay()
            slot.window_replays += 1
            speculative.unsettle(slot.cache, _window_len(kwargs))
            return _fresh_output(record.static_output)
        if signature not in slot.warm_windows:
            slot.warm_windows.add(signature)
            return _side_stream_call(lambda: self._original_forward(**kwargs))
        addresses = _addresses(slot.cache)
        captured = self._try_capture(slot, kwargs)
        if captured is None:
            return self._original_forward(**kwargs)
        graph, static_inputs, output, graph_bytes = captured
        slot.graph_bytes += graph_bytes
        slot.windows[signature] = WindowGraph(graph, static_inputs, output, addresses)
        slot.checked_windows.add(signature)
        return _fresh_output(output)

    @staticmethod
    def _output(slot: GraphSlot):
        """The step's output: the graph's own tensors where the loop copies the logits before the
        next step (transformers' greedy / sampling loop does, first thing), fresh copies otherwise."""
        return copy.copy(slot.static_output) if slot.share_output else _fresh_output(slot.static_output)


def _assisted(kwargs: dict) -> bool:
    return any(kwargs.get(name) is not None for name in _ASSISTED)


def _window_room(model) -> int:
    """The longest ring of the model's ReplaySSM layers (a verify window holds at most that many)."""
    return max((m.replay_options.buffer_len for m in model.modules() if hasattr(m, "replay_options")), default=0)


def _single_token(kwargs: dict) -> bool:
    ids = kwargs.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids.dim() == 2 and ids.shape[1] == 1
    embeds = kwargs.get("inputs_embeds")
    return isinstance(embeds, torch.Tensor) and embeds.dim() == 3 and embeds.shape[1] == 1
