"""``convert``: write a ReplaySSM checkpoint — the original weights plus a ``replayssm`` block.

The output is a standard Hugging Face checkpoint directory:

* the safetensors weights (and their index) copied byte for byte under the same names,
  streamed in fixed-size chunks (memory stays at one chunk; each shard's header is
  verified against its size before and after the copy);
* ``config.json``: the original JSON, same keys in the same order, plus a top-level
  ``"replayssm"`` block (schema version, package version, buffer_len, state_dtype, backend,
  the rewritten layers with their kinds). Runtimes that ignore the block load the original
  model; ``replayssm.from_pretrained`` / ``replayssm.patch`` apply it;
* tokenizer files, ``generation_config.json`` and the other small files copied as they are.

Which layers get rewritten is decided by patching a model built on the meta device from
the config (no weights read). The output is built in a temporary directory beside OUT_DIR
and renamed into place only after everything — validation included — succeeded.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .checkpoint_dir import (CONFIG_NAME, CheckpointScan, FileEntry, dump_config_json, read_safetensors_header,
                             scan_checkpoint)
from .config import (
    CONFIG_KEY,
    DEFAULT_BUFFER_LEN,
    ReplaySSMConfig,
    StateDtype,
    activation_dtype,
    parse_device,
    parse_model_dtype,
)
from .errors import CheckpointError, UnsupportedLayerError, ValidationFailedError
from .formatting import count
from .output_dir import (
    atomic_output_dir,
    check_disk_space,
    check_output_dir,
    copy_file,
    fsync_dir,
    remove_stale_temp_dirs,
    write_text_file,
)
from .progress import NULL_PROGRESS, Progress
from .resolve import ResolvedModel, check_config_dict, resolve_model

if TYPE_CHECKING:  # torch and transformers are imported only once the paths and options are checked
    from .discovery import SSMLayerInfo
    from .validate import ValidationResult


@dataclass
class ConvertResult:
    """What ``convert`` did (or, with ``dry_run``, would do)."""

    model: str
    source: ResolvedModel
    out_dir: Path
    dry_run: bool
    written: bool
    model_type: str
    architecture: str
    config: ReplaySSMConfig
    block: dict[str, Any]
    rewritten: list[SSMLayerInfo]
    skipped: list[SSMLayerInfo]
    unselected: list[SSMLayerInfo]
    files: list[FileEntry]
    skipped_files: list[str]
    weights_bytes: int
    total_bytes: int
    largest_shard_bytes: int
    act_bytes: int = 2
    act_dtype_assumed: bool = False  # config.json records no dtype: 16-bit activations assumed
    validation: ValidationResult | None = None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def state_bytes(self, info: SSMLayerInfo) -> int:
        """State-checkpoint bytes per sequence of a layer, at the configured state dtype."""
        itemsize = StateDtype(self.block.get("state_dtype") or StateDtype.FP32.value).itemsize
        return info.state_bytes * itemsize // StateDtype.FP32.itemsize

    def buffer_bytes(self, info: SSMLayerInfo) -> int:
        """Ring-buffer bytes per sequence of a layer at this buffer_len."""
        return info.buffer_bytes(self.config.buffer_len, self.act_bytes)

    def layer_rows(self) -> list[dict[str, Any]]:
        return [
            {"name": r.name, "kind": r.kind, "kind_label": r.kind_label, "kind_short": r.kind_short,
             "class_name": r.class_name, "layer_idx": r.layer_idx, "shapes": dict(r.shapes), "state_bytes": self.state_bytes(r),
             "buffer_bytes": self.buffer_bytes(r)}
            for r in self.rewritten
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "model": self.model,
            "source": self.source.to_dict(),
            "out_dir": str(self.out_dir),
            "dry_run": self.dry_run,
            "written": self.written,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "replayssm": self.block,
            "layers": self.layer_rows(),
            "skipped_layers": [{"name": r.name, "kind": r.kind, "class_name": r.class_name, "reason": r.reason}
                               for r in self.skipped],
            "unselected_layers": [r.name for r in self.unselected],
            "totals": {
                "state_bytes": sum(self.state_bytes(r) for r in self.rewritten),
                "buffer_bytes": sum(self.buffer_bytes(r) for r in self.rewritten),
                "act_bytes": self.act_bytes,
                "act_dtype_assumed": self.act_dtype_assumed,
            },
            "files": [f.to_dict() for f in self.files],
            "skipped_files": list(self.skipped_files),
            "weights_bytes": self.weights_bytes,
            "total_bytes": self.total_bytes,
            "largest_shard_bytes": self.largest_shard_bytes,
            "validation": self.validation.to_dict() if self.validation is not None else None,
            "notes": list(self.notes),
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _copy_checkpoint(scan: CheckpointScan, tmp: Path, config_text: str, progress: Progress) -> list[FileEntry]:
    """Copy weights (verified), index, new config.json and the other files into ``tmp``."""
    written: list[FileEntry] = []
    progress.start("copy", f"Copying {len(scan.weights)} weight file(s)", total=scan.weights_bytes, unit="bytes")
    for entry in scan.weights:
        src, dst = scan.directory / entry.name, tmp / entry.name
        copy_file(src, dst, expected_size=entry.size, on_bytes=lambda n: progress.advance("copy", n))
        copied = read_safetensors_header(dst)
        if copied.expected_size != entry.size or copied.tensors != scan.headers[entry.name].tensors:
            raise CheckpointError(f"{dst} does not match {src} after copying", hint="check the output disk")
        written.append(entry)
    progress.finish("copy")
    extras = ([scan.index] if scan.index else []) + list(scan.others)
    progress.start("save", "Writing config and files", total=1 + len(extras))
    size = write_text_file(tmp / CONFIG_NAME, config_text)
    written.append(FileEntry(CONFIG_NAME, size, "config"))
    progress.advance("save")
    for entry in extras:
        copy_file(scan.directory / entry.name, tmp / entry.name)
        written.append(entry)
        progress.advance("save")
    fsync_dir(tmp)
    progress.finish("save")
    return written


def _layer_patterns(layers: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if layers is None:
        return None
    if isinstance(layers, str):
        return (layers,)
    items = tuple(layers)
    return items or None


def convert(
    model: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    buffer_len: int = DEFAULT_BUFFER_LEN,
    state_dtype: str | None = None,
    state_rounding: str = "nearest",
    state_seed: int = 0,
    layers: str | Iterable[str] | None = None,
    strict: bool = True,
    backend: str = "auto",
    cuda_graphs: bool = False,
    graph_max_len: int | None = None,
    validate: bool = True,
    device: str = "auto",
    dtype: str = "auto",
    dry_run: bool = False,
    force: bool = False,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert MODEL (a directory, a cached hub id or a ``tiny:`` spec) into OUT_DIR.

    ``layers``: names or regular expressions of the layers to rewrite (default: all).
    ``strict=False`` skips SSM layers this version cannot rewrite instead of failing (it still
    fails when none is left). ``validate``: load the written checkpoint on ``device`` in
    ``dtype`` and compare the stock and ReplaySSM models before publishing OUT_DIR.
    ``dry_run``: run every check, write nothing. ``force``: replace an existing OUT_DIR.
    ``cuda_graphs`` / ``graph_max_len`` are recorded for ``replayssm.patch`` of the loaded model
    (CUDA-graph decoding inside ``generate()``); validation always runs eagerly.

    Raises (all ReplaySSMError): ConfigError, ModelSpecError, CheckpointError,
    NoSSMLayersError, UnsupportedLayerError, SchemaVersionError, OutputExistsError,
    OutOfDiskError, ValidationFailedError (its ``.validation`` holds the measurements).
    OUT_DIR is never left half-written and the input is never modified.
    """
    start = time.perf_counter()
    progress = progress or NULL_PROGRESS
    # options and paths first: these checks need neither torch nor transformers
    rs_config = ReplaySSMConfig(buffer_len=buffer_len, state_dtype=state_dtype, state_rounding=state_rounding,
                                state_seed=state_seed, layers=_layer_patterns(layers),
                                strict=strict, backend=backend, cuda_graphs=cuda_graphs,
                                graph_max_len=graph_max_len)
    if validate:
        parse_device(device)
        parse_model_dtype(dtype)
    progress.start("read", "Reading checkpoint", total=None)
    resolved = resolve_model(str(model))
    out = check_output_dir(Path(out_dir), force=force, source=resolved.path)
    scan = scan_checkpoint(resolved.path, on_total=lambda n: progress.update("read", total=n),
                           on_shard=lambda _name: progress.advance("read"))
    check_config_dict(scan.config, resolved.path)
    existing = scan.config.get(CONFIG_KEY)
    if existing is not None:
        ReplaySSMConfig.from_block(existing)  # refuses a block from a newer package
    resolved_device = None
    if validate:
        from .validate import resolve_device, resolve_dtype

        resolved_device = resolve_device(device)
        resolve_dtype(dtype, resolved_device)

    from .resolve import build_meta_model, load_config

    hf_config = load_config(resolved, trust_remote_code=trust_remote_code)
    meta = build_meta_model(hf_config, trust_remote_code=trust_remote_code)
    progress.finish("read")

    from .api import patch, replayssm_report

    patch(meta, config=rs_config)
    report = replayssm_report(meta)
    rewritten, skipped = list(report["rewritten"]), list(report["skipped"])
    if not rewritten:
        first = skipped[0] if skipped else None
        raise UnsupportedLayerError(
            f"no SSM layer left to rewrite: {len(skipped)} selected layer(s) cannot be rewritten"
            + (f" ({first.name}: {first.reason})" if first else ""),
            hint="run `replayssm inspect MODEL` to see which layers this version supports",
        )
    block = getattr(meta.config, CONFIG_KEY)
    new_config = dict(scan.config)
    new_config[CONFIG_KEY] = block
    config_text = dump_config_json(new_config)
    total = scan.copy_bytes(len(config_text.encode("utf-8")))
    check_disk_space(out, total)

    # ring buffers hold activations in the dtype the model runs in: the checkpoint's
    act_name, act_assumed = activation_dtype(scan.config)
    files = list(scan.weights) + ([scan.index] if scan.index else []) + \
        [FileEntry(CONFIG_NAME, len(config_text.encode("utf-8")), "config")] + list(scan.others)
    result = ConvertResult(
        model=str(model), source=resolved, out_dir=out, dry_run=dry_run, written=False,
        model_type=str(scan.config.get("model_type", getattr(hf_config, "model_type", "?"))),
        architecture=type(meta).__name__, config=rs_config, block=block, rewritten=rewritten, skipped=skipped,
        unselected=list(report["unselected"]), files=files, skipped_files=list(scan.skipped),
        weights_bytes=scan.weights_bytes, total_bytes=total, largest_shard_bytes=scan.largest_shard_bytes,
        act_bytes=StateDtype(act_name).itemsize, act_dtype_assumed=act_assumed,
    )
    if existing is not None:
        result.notes.append("the input already had a replayssm block; it was replaced")
    del meta
    if dry_run:
        stale, kept = remove_stale_temp_dirs(out, dry_run=True)
        result.notes += _stale_notes(stale, kept, dry_run=True)
        result.elapsed_s = time.perf_counter() - start
        return result

    stale, kept = remove_stale_temp_dirs(out)
    result.notes += _stale_notes(stale, kept, dry_run=False)
    with atomic_output_dir(out, force=force, source=resolved.path) as tmp:
        _copy_checkpoint(scan, tmp, config_text, progress)
        if validate:
            from .validate import validate_checkpoint

            result.validation = validate_checkpoint(tmp, device=resolved_device, dtype=dtype,
                                                    trust_remote_code=trust_remote_code, progress=progress)
            gc.collect()  # drop the loaded model (and its file maps) before the rename
            if not result.validation.passed:
                raise _validation_error(result.validation)
    result.written = True
    result.elapsed_s = time.perf_counter() - start
    return result


def _validation_error(validation: ValidationResult) -> ValidationFailedError:
    failed = next(c for c in validation.checks if not c.ok)
    if validation.dtype != StateDtype.FP32.value:
        hint = ("try --dtype fp32 for a tighter comparison; if it persists, report it with the output of "
                "`replayssm env`")
    else:
        hint = "this is a fault of replayssm, not of the input: report it with the output of `replayssm env`"
    error = ValidationFailedError(f"validation failed: {failed.detail}; nothing was written", hint=hint)
    error.validation = validation
    return error


def _stale_notes(removed: list[Path], kept: list[Path], *, dry_run: bool) -> list[str]:
    notes = []
    if removed:
        verb = "would remove" if dry_run else "removed"
        notes.append(f"{verb} {count(len(removed), 'temporary directory', 'temporary directories')} left by an "
                     f"interrupted run: {', '.join(p.name for p in removed)}")
    if kept:
        notes.append(f"left {', '.join(str(p) for p in kept)} in place (in use by a running conversion, or not "
                     "known to be a leftover); delete it yourself if no conversion is running")
    return notes


__all__ = ["ConvertResult", "convert"]
