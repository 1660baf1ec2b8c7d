"""Whole-model decode benchmark: ``model.generate()`` step time of stock and patched variants.

    settings = BenchSettings(batch_sizes=(1, 8, 64, 256))
    model, info = load_model(model="tiny:qwen3_5", preset=None, settings=settings)
    result = run_bench(model, settings, model_info=info)

One model instance is switched between the variants with ``replayssm.patch`` / ``unpatch``:

* ``stock``: the unpatched transformers model;
* ``eager``: ``patch(model, buffer_len=L)``;
* ``graphs``: ``patch(model, buffer_len=L, cuda_graphs=True)``;
* ``graphs-per-step``: ``patch(model, buffer_len=1, cuda_graphs=True)`` (buffer_len 1 runs the fused
  per-step kernels: the per-step baseline inside the same captured decode).

Step time is the wall time of greedy ``generate()`` calls with every row running every step:
``(t(N new) - t(n0 new)) / (N - n0)``, which removes prefill and the set-up of ``generate``. No row
stops early because the end-of-sequence id is one no token can take (the logits' width): the
per-step EOS check still runs, as in a user's call, and no minimum-length processor does
(``min_new_tokens`` would add two full-vocabulary passes over the fp32 logits a step). Each
(variant, batch) first runs one warm-up of every length (kernel compiles, autotuning, graph
capture), then ``repeats`` timed rounds; the median is reported. Prefill is the median time of
``generate`` with one new token. The settings and the checks of the options: ``bench_settings.py`` (re-exported here).
"""

from __future__ import annotations

import copy
import datetime
import statistics
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Sequence

from .bench_settings import (DEFAULT_BATCH_SIZES, GRAPH_VARIANTS, SMOKE, VARIANTS, BenchError, BenchSettings,
                             parse_batch_sizes, parse_variants)
from .errors import ConfigError


# --------------------------------------------------------------------------- the model
def load_model(*, model: str | None, preset: str | None, settings: BenchSettings, trust_remote_code: bool = False):
    """(model on the settings' device in eval mode, a JSON-ready description).

    ``model``: anything ``replayssm convert`` takes (a ``tiny:`` spec is built in memory, a
    directory or cached hub id is loaded with stock transformers); ``preset``: a real-size
    config from ``replayssm.presets`` with random weights, built on the device.
    """
    import torch

    from .presets import build_preset, preset as get_preset
    from .resolve import causal_lm_class, load_config, resolve_model
    from .tiny import build_tiny_model, is_tiny_spec, tiny_family

    if (model is None) == (preset is None):
        raise BenchError("give either MODEL or --preset, not both" if model else "give MODEL or --preset NAME")
    device = resolve_bench_device(settings.device, preset=preset)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[settings.dtype]
    if preset is not None:
        summary = get_preset(preset).summary
        net = build_preset(preset, dtype, device)
        source = {"kind": "preset", "name": preset, "summary": summary}
    elif is_tiny_spec(model):
        tiny_family(model)
        net = build_tiny_model(model, dtype).to(device)
        source = {"kind": "tiny", "spec": model}
    else:
        resolved = resolve_model(model)
        config = load_config(resolved, trust_remote_code=trust_remote_code)
        cls = causal_lm_class(config, trust_remote_code=trust_remote_code)
        extra = {"trust_remote_code": True} if trust_remote_code else {}
        try:
            net = cls.from_pretrained(str(resolved.path), config=config, dtype=dtype, device_map=str(device), **extra)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            from .errors import CheckpointError

            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"transformers cannot load {resolved.path}: {first}") from None
        source = resolved.to_dict()
    net.eval()
    config = net.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    info = {
        "source": source,
        "architecture": type(net).__name__,
        "model_type": getattr(config, "model_type", None),
        "parameters": sum(p.numel() for p in net.parameters()),
        "vocab_size": getattr(text, "vocab_size", None),
        "device": str(device),
        "dtype": settings.dtype,
    }
    return net, info


def resolve_bench_device(device: str, *, preset: str | None = None):
    """"auto" -> cuda when available, else cpu (a real-size preset then needs ``--device cpu``)."""
    import torch

    from .validate import resolve_device

    if device == "auto" and preset is not None and not torch.cuda.is_available():
        raise BenchError(f"no CUDA device, and preset {preset!r} is a real-size model",
                         hint="run it on a GPU machine, or pass --device cpu to time it on the CPU anyway (slow)")
    try:
        return resolve_device(device)
    except ConfigError as exc:
        raise BenchError(str(exc), hint="pass --device cpu, or --device auto to take a GPU when there is one") \
            from None


# --------------------------------------------------------------------------- variants
def graph_support() -> str | None:
    """None when this replayssm can capture decode steps in CUDA graphs, else why not."""
    import inspect

    import replayssm

    if "cuda_graphs" not in inspect.signature(replayssm.patch).parameters:
        return "this replayssm has no CUDA-graph decoding (patch() takes no cuda_graphs)"
    return None


def _patch_variant(model, variant: str, settings: BenchSettings, base) -> None:
    """Patch ``model`` for ``variant`` (``base``: the configuration recorded in the checkpoint, if any)."""
    import replayssm

    graphs = variant in GRAPH_VARIANTS
    buffer_len = 1 if variant == "graphs-per-step" else settings.buffer_len
    options: dict[str, Any] = dict(buffer_len=buffer_len, state_dtype=settings.state_dtype)
    if graph_support() is None:  # callers report the graph variants as unavailable otherwise
        options["cuda_graphs"] = graphs
    if base is None:
        replayssm.patch(model, **options)
        return
    # a converted checkpoint: keep its layer selection, strictness and backend
    names = {f.name for f in fields(base)}
    replayssm.patch(model, config=replace(base, **{k: v for k, v in options.items() if k in names}))


def _release_graphs(model) -> None:
    import replayssm

    release = getattr(replayssm, "release_graphs", None)
    if release is not None:
        release(model)


def _graph_entries(model) -> list[dict[str, Any]] | None:
    import replayssm

    report = getattr(replayssm, "graph_report", None)
    if report is None:
        return None
    return [dict(e) for e in report(model) or []]


def unavailable_reason(variant: str, device) -> str | None:
    """Why ``variant`` cannot run on ``device`` here, or None."""
    if variant not in GRAPH_VARIANTS:
        return None
    if getattr(device, "type", str(device)) != "cuda":
        return "n/a: needs CUDA"
    reason = graph_support()
    return f"n/a: {reason}" if reason else None


# --------------------------------------------------------------------------- timing
@dataclass
class BenchRow:
    """One (batch size, variant). ``status``: "ok", "n/a" (cannot run here), "fallback" (timed,
    but no CUDA graph was captured: the eager path ran), "error" (e.g. out of memory)."""

    batch_size: int
    variant: str
    status: str = "ok"
    note: str = ""
    ms_per_step: float | None = None
    tokens_per_s: float | None = None
    speedup_vs_stock: float | None = None
    speedup_vs_eager: float | None = None
    prefill_ms: float | None = None
    peak_memory_bytes: int | None = None
    capture_s: float | None = None
    graph_memory_bytes: int | None = None
    graphs: list[dict[str, Any]] | None = None
    step_ms_samples: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    meta: dict[str, Any]
    model: dict[str, Any]
    settings: BenchSettings
    rows: list[BenchRow]

    @property
    def failed(self) -> list[BenchRow]:
        return [r for r in self.rows if r.status == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": not self.failed, **self.meta, "model": self.model, "settings": self.settings.to_dict(),
                "rows": [r.to_dict() for r in self.rows]}


def environment(device) -> dict[str, Any]:
    """Date, GPU and the versions that decide the numbers."""
    import platform
    from importlib import metadata

    import torch

    from . import __version__

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cuda = getattr(device, "type", "") == "cuda"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "versions": {"replayssm": __version__, "python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "triton": version("triton"), "transformers": version("transformers")},
        # what the stock SSM layers can run on besides transformers' PyTorch path
        "stock_kernels": {name: version(dist) for name, dist in (("mamba_ssm", "mamba_ssm"),
                                                                 ("causal_conv1d", "causal_conv1d"),
                                                                 ("flash_linear_attention", "fla-core"))},
    }


def _prompt(batch: int, settings: BenchSettings, vocab: int, special: set[int], device):
    """A random prompt (seeded by the batch size, so every variant gets the same one)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + batch)
    ids = torch.randint(0, vocab, (batch, settings.prompt_len), generator=gen)
    fill = next((t for t in range(vocab) if t not in special), 0)
    for token in special:  # no EOS / pad / BOS inside the prompt
        ids[ids == token] = fill
    return ids.to(device)


def _special_tokens(model) -> tuple[int | None, set[int]]:
    gen = getattr(model, "generation_config", None)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    special: set[int] = set()
    for source in (gen, config):
        for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
            value = getattr(source, key, None)
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(v, int):
                    special.add(v)
    pad = getattr(gen, "pad_token_id", None)
    if not isinstance(pad, int):
        pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int):
        eos = getattr(gen, "eos_token_id", None) or getattr(config, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos if isinstance(eos, int) else 0
    return pad, special


def unreachable_token(model, vocab: int) -> int:
    """A token id past every logit column (the output embeddings may be wider than the vocabulary)."""
    out = model.get_output_embeddings()
    return max(vocab, int(out.weight.shape[0]) if out is not None else 0)


def _timed_generate(model, ids, mask, new_tokens: int, pad: int, eos: int, cuda: bool) -> float:
    """Seconds of one greedy ``generate`` of exactly ``new_tokens`` tokens per row (``eos``: an id no
    token takes)."""
    import torch

    if cuda:
        torch.cuda.synchronize(ids.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             eos_token_id=eos, do_sample=False, num_beams=1, use_cache=True, pad_token_id=pad)
    if cuda:
        torch.cuda.synchronize(ids.device)
    elapsed = time.perf_counter() - t0
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate() returned {out.shape[1] - ids.shape[1]} new tokens, expected {new_tokens}")
    return elapsed


def _measure(model, row: BenchRow, settings: BenchSettings, vocab: int, pad: int, special: set[int], device) -> None:
    import torch

    cuda = device.type == "cuda"
    ids = _prompt(row.batch_size, settings, vocab, special, device)
    mask = torch.ones_like(ids)
    eos = unreachable_token(model, vocab)
    n0, n = settings.first_tokens, settings.new_tokens
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for length in (1, n0, n):  # warm-up: compiles, autotuning, graph capture
        _timed_generate(model, ids, mask, length, pad, eos, cuda)
    prefill, steps = [], []
    for _ in range(settings.repeats):
        prefill.append(_timed_generate(model, ids, mask, 1, pad, eos, cuda))
        t_short = _timed_generate(model, ids, mask, n0, pad, eos, cuda)
        t_long = _timed_generate(model, ids, mask, n, pad, eos, cuda)
        steps.append((t_long - t_short) / (n - n0) * 1e3)
    row.step_ms_samples = steps
    row.ms_per_step = statistics.median(steps)
    row.tokens_per_s = row.batch_size / (row.ms_per_step / 1e3) if row.ms_per_step > 0 else None
    row.prefill_ms = statistics.median(prefill) * 1e3
    if cuda:
        row.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
    if row.ms_per_step <= 0:
        row.status, row.note = "error", "timing noise exceeds the step time; raise --new-tokens or --repeats"


def _out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_bench(model, settings: BenchSettings, *, model_info: dict[str, Any] | None = None,
              on_row: Callable[[BenchRow], None] | None = None, raise_errors: bool = False) -> BenchResult:
    """Time every variant at every batch size on ``model``; at the end its graphs are released and it is
    given back as it came (stock, or patched with the configuration it had).

    A (variant, batch) that fails becomes an "error" row and the others are still timed (after
    an out-of-memory error, the larger batches of that variant are skipped); ``raise_errors``
    re-raises instead. ``on_row`` is called with each row as it is done.
    """
    import torch

    import replayssm
    from .api import recorded_config
    from .config import CONFIG_KEY

    device = next(model.parameters()).device
    top = model.config
    block = copy.deepcopy(getattr(top, CONFIG_KEY, None))  # unpatch drops it from the config; put back at the end
    base = recorded_config(model)  # a converted checkpoint's own settings: its layer selection is kept
    was_patched = replayssm.is_patched(model)
    if was_patched:
        _release_graphs(model)
        replayssm.unpatch(model)
    # fail on a model without rewritable SSM layers before anything is timed
    _patch_variant(model, "eager", settings, base)
    replayssm.unpatch(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = int(getattr(config, "vocab_size", 0) or model.get_output_embeddings().weight.shape[0])
    pad, special = _special_tokens(model)
    rows: list[BenchRow] = []
    try:
        for variant in settings.variants:
            reason = unavailable_reason(variant, device)
            if reason is None and variant != "stock":
                _patch_variant(model, variant, settings, base)
            too_big: int | None = None
            for batch in settings.batch_sizes:
                row = BenchRow(batch, variant)
                if reason is not None:
                    row.status, row.note = "n/a", reason[len("n/a: "):]
                elif too_big is not None and batch > too_big:
                    row.status, row.note = "error", f"skipped: batch {too_big} ran out of memory"
                else:
                    _release_graphs(model)
                    try:
                        _measure(model, row, settings, vocab, pad, special, device)
                    except Exception as exc:  # noqa: BLE001 - one failed cell must not lose the others
                        if raise_errors:
                            raise
                        first = (str(exc).strip().splitlines() or [""])[0][:200]
                        row.status, row.note = "error", f"{type(exc).__name__}: {first}"
                        row.ms_per_step = row.tokens_per_s = row.prefill_ms = None
                        if _out_of_memory(exc):
                            row.note = "out of memory"
                            too_big = batch if too_big is None else min(too_big, batch)
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    if variant in GRAPH_VARIANTS and row.status == "ok":
                        entries = _graph_entries(model)
                        if entries is None:
                            row.note = "graph_report() unavailable: capture not confirmed"
                        elif not entries:
                            row.status = "fallback"
                            row.note = "no CUDA graph was captured: the eager patched path ran"
                        else:
                            row.graphs = entries
                            row.capture_s = sum(float(e.get("capture_s") or 0.0) for e in entries)
                            row.graph_memory_bytes = sum(int(e.get("memory_bytes") or 0) for e in entries)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            _release_graphs(model)
            if variant != "stock" and replayssm.is_patched(model):
                replayssm.unpatch(model)
    finally:
        _release_graphs(model)
        if replayssm.is_patched(model):
            replayssm.unpatch(model)
        if was_patched:  # give the model back as it came
            replayssm.patch(model, config=base)
        if block is not None:
            setattr(top, CONFIG_KEY, block)
    _speedups(rows)
    meta = environment(device)
    return BenchResult(meta=meta, model=model_info or {"architecture": type(model).__name__}, settings=settings,
                       rows=rows)


def _speedups(rows: Sequence[BenchRow]) -> None:
    by_key = {(r.batch_size, r.variant): r for r in rows}
    for r in rows:
        if r.status not in ("ok", "fallback") or not r.ms_per_step:
            continue
        for ref_name, attr in (("stock", "speedup_vs_stock"), ("eager", "speedup_vs_eager")):
            ref = by_key.get((r.batch_size, ref_name))
            if ref is not None and ref.status == "ok" and ref.ms_per_step:
                setattr(r, attr, ref.ms_per_step / r.ms_per_step)


__all__ = ["BenchError", "BenchResult", "BenchRow", "BenchSettings", "DEFAULT_BATCH_SIZES", "GRAPH_VARIANTS",
           "SMOKE", "VARIANTS", "environment", "graph_support", "load_model", "parse_batch_sizes", "parse_variants",
           "run_bench"]
