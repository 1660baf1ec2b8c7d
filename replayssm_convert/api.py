"""``patch`` / ``unpatch``: rewrite a model's SSM layers into ReplaySSM layers, reversibly."""

from __future__ import annotations

from typing import Iterable

import torch

from replayssm.patches.options import LayerReplayOptions
from replayssm.patches.kinds import KINDS
from replayssm.patches.registry import replay_class_for, restore_class
from replayssm.patches.base import OPTIONS_ATTR
from replayssm.patches import speculative
from replayssm.patches.graph_decode import GraphDecoder
from replayssm.patches.speedups import drop_decode_speedups, use_decode_speedups

from .config import CONFIG_KEY, ReplaySSMConfig
from .discovery import SSMLayerInfo, find_ssm_layers
from .errors import ConfigError, NoSSMLayersError, UnsupportedLayerError

REPORT_ATTR = "_replayssm_report"
_UNSET = object()


def _supported_families() -> str:
    return "; ".join(f"{k.label}: {', '.join(k.mixer_classes)}" for k in KINDS.values())


def _top_config(model):
    return getattr(model, "config", None)


def recorded_config(model) -> ReplaySSMConfig | None:
    """The configuration recorded in ``model.config`` (e.g. loaded from config.json), if any."""
    cfg = _top_config(model)
    block = getattr(cfg, CONFIG_KEY, None) if cfg is not None else None
    if block is None:
        return None
    return ReplaySSMConfig.from_block(block)


def patch(
    model: torch.nn.Module,
    *,
    buffer_len: int | object = _UNSET,
    state_dtype=_UNSET,
    state_rounding: str | object = _UNSET,
    state_seed: int | object = _UNSET,
    layers: str | Iterable[str] | None | object = _UNSET,
    strict: bool | object = _UNSET,
    backend: str | object = _UNSET,
    cuda_graphs: bool | object = _UNSET,
    graph_max_len: int | None | object = _UNSET,
    config: ReplaySSMConfig | None = None,
) -> torch.nn.Module:
    """Rewrite the model's SSM layers in place into ReplaySSM layers; return the same model.

    Arguments not given come from ``config``, else from a ``replayssm`` block already in
    ``model.config`` (a converted checkpoint), else the defaults (buffer_len=16, the
    cache's fp32 checkpoint, every SSM layer, strict, backend "auto", no CUDA graphs).
    ``cuda_graphs=True`` makes ``model.generate()`` replay each decode step as a CUDA graph
    (see ``replayssm.patches.graph_decode``). Idempotent: patching a patched model only
    updates its options; generation caches still in use carry over to the new options exactly
    (their buffered tokens are folded into the checkpoint). The configuration is recorded on
    ``model.config`` so that ``save_pretrained`` keeps it. Once every SSM layer is rewritten, the
    model instance accepts assisted and prompt-lookup generation (its caches roll back by moving
    ring cursors; see ``replayssm.patches.speculative``); ``unpatch`` restores the refusal.

    Raises NoSSMLayersError if the model has no SSM layer, UnsupportedLayerError for a
    selected layer this version cannot rewrite (with ``strict=False`` it is skipped and
    listed in ``replayssm_report(model)``), ConfigError for invalid options, CacheStateError
    (changing nothing) when a cache in use holds buffered tokens for rows its recurrent state
    no longer has (it was edited behind the buffers' back) and so cannot carry over.
    """
    base = config or recorded_config(model) or ReplaySSMConfig()
    overrides = {k: v for k, v in dict(buffer_len=buffer_len, state_dtype=state_dtype, state_rounding=state_rounding,
                                        state_seed=state_seed, layers=layers,
                                        strict=strict, backend=backend, cuda_graphs=cuda_graphs,
                                        graph_max_len=graph_max_len).items() if v is not _UNSET}
    if config is not None and overrides:
        raise ConfigError(f"pass either config= or keyword options, not both (got config and {sorted(overrides)})")
    params = base.as_dict()
    params.update(overrides)
    params["schema_version"] = ReplaySSMConfig().schema_version
    cfg = ReplaySSMConfig(**params)

    records = find_ssm_layers(model)
    if not records:
        raise NoSSMLayersError(
            f"{type(model).__name__} has no SSM layer; supported families — {_supported_families()}",
            hint="check the model id, or run `replayssm inspect MODEL` to see what was found",
        )
    selected = [r for r in records if cfg.selects(r.name)]
    if cfg.layers is not None and not selected:
        names = ", ".join(r.name for r in records[:6]) + (", ..." if len(records) > 6 else "")
        raise ConfigError(f"layers={list(cfg.layers)!r} matches none of the SSM layers ({names})")
    blocked = [r for r in selected if not r.can_rewrite]
    if not any(r.can_rewrite for r in selected):
        first = blocked[0]
        raise UnsupportedLayerError(
            f"none of the selected SSM layers can be rewritten; {first.name} ({first.class_name}): {first.reason}",
            hint="`replayssm inspect MODEL` lists every SSM layer and whether this version can rewrite it",
        )
    if blocked and cfg.strict:
        first = blocked[0]
        more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
        raise UnsupportedLayerError(
            f"cannot rewrite {first.name} ({first.class_name}): {first.reason}{more}",
            hint="pass strict=False (CLI: --skip-unsupported) to skip such layers, or layers= (--layers) to pick others",
        )
    options = LayerReplayOptions(buffer_len=cfg.buffer_len, state_dtype=cfg.torch_state_dtype, backend=cfg.backend,
                                 state_rounding=cfg.state_rounding, state_seed=cfg.state_seed)
    for record in selected:  # new options for a layer with live caches: all of them can carry over, or nothing changes
        module = model.get_submodule(record.name)
        if record.can_rewrite and getattr(module, OPTIONS_ATTR, options) != options:
            module._replay_check_live_caches()
    rewritten: list[SSMLayerInfo] = []
    for record in selected:
        if not record.can_rewrite:
            continue
        module = model.get_submodule(record.name)
        previous = getattr(module, OPTIONS_ATTR, None)
        module.__class__ = replay_class_for(module)
        if previous is not None and previous != options:
            module._replay_reconfigure(options)  # live caches carry over to the new options
        else:
            setattr(module, OPTIONS_ATTR, options)
        rewritten.append(record)
    if rewritten:
        use_decode_speedups(model)
    if cfg.cuda_graphs:
        GraphDecoder.install(model, cfg.graph_max_len)
    else:
        GraphDecoder.uninstall(model)
    # layers patched earlier but not selected now keep their rewrite (idempotent, additive)
    if all(r.patched for r in find_ssm_layers(model)):  # every recurrent layer can roll back
        speculative.allow_assisted(model)
    else:
        speculative.restore_assisted(model)
    top = _top_config(model)
    block_layers = [{"name": r.name, "kind": r.kind} for r in rewritten]
    if top is not None:
        setattr(top, CONFIG_KEY, cfg.to_block(block_layers))
    setattr(model, REPORT_ATTR, {"config": cfg, "rewritten": rewritten, "skipped": blocked,
                                 "unselected": [r for r in records if r not in selected]})
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Restore every rewritten layer's original class and drop the recorded configuration.

    Generation caches still in use are turned into plain stock caches first (their buffered
    tokens folded into the recurrent state), so a generation can continue unpatched exactly.
    """
    GraphDecoder.uninstall(model)
    drop_decode_speedups(model)
    speculative.restore_assisted(model)
    for _, module in model.named_modules():
        if hasattr(module, OPTIONS_ATTR) or getattr(type(module), "_replayssm_original_class", None):
            if hasattr(module, "_replay_release"):
                module._replay_release()
            restore_class(module)
            if OPTIONS_ATTR in module.__dict__:
                delattr(module, OPTIONS_ATTR)
    top = _top_config(model)
    if top is not None and hasattr(top, CONFIG_KEY):
        delattr(top, CONFIG_KEY)
    if REPORT_ATTR in model.__dict__:
        delattr(model, REPORT_ATTR)
    return model


def is_patched(model: torch.nn.Module) -> bool:
    return any(getattr(type(m), "_replayssm_original_class", None) is not None for m in model.modules())


def replayssm_report(model: torch.nn.Module) -> dict:
    """What the last ``patch`` did: config, rewritten / skipped / unselected layer records."""
    return getattr(model, REPORT_ATTR, {})


def graph_report(model: torch.nn.Module) -> list[dict]:
    """The pooled caches and CUDA graphs of a model patched with ``cuda_graphs=True``: one dict per
    (batch size, capacity) with ``batch_size``, ``max_len``, ``captured``, ``capture_s``,
    ``cache_bytes``, ``graph_bytes``, ``memory_bytes`` and ``fallback`` (why a capture failed); for
    assisted generation ``assisted``, ``window_graphs`` (one per window length) and ``window_replays``."""
    decoder = GraphDecoder.of(model)
    return decoder.report() if decoder is not None else []


def release_graphs(model: torch.nn.Module) -> None:
    """Free the pooled caches and CUDA graphs (they are captured again on the next ``generate()``)."""
    decoder = GraphDecoder.of(model)
    if decoder is not None:
        decoder.release()
