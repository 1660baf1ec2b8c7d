"""Hugging Face checkpoint directories on disk: reading and verifying them.

* ``read_config_json`` reads ``config.json`` keeping its key order.
* ``scan_checkpoint`` lists a directory's weights (``model.safetensors`` or the shards of
  ``model.safetensors.index.json``), verifies every shard's safetensors header against the
  file size (so truncated or corrupt shards are found before anything is written), and sorts
  the other files into "copy" (tokenizer, generation config, chat template, README, remote
  code...) and "skip" (other weight formats, sub-directories, hidden files).

Writing output directories is ``replayssm.output_dir``'s job. PyTorch ``.bin`` weights are
not converted: a checkpoint with only ``pytorch_model*.bin`` is refused (they are pickles:
they cannot be verified without unpickling, and transformers re-saves them as safetensors
in one call). When both formats are present the ``.bin`` files are skipped, as
transformers itself prefers safetensors.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import CheckpointError

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_INDEX_NAME = "model.safetensors.index.json"
#: the largest safetensors header the safetensors library accepts
MAX_HEADER_BYTES = 100_000_000

# element sizes in bits (safetensors dtype names)
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
_OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".ot", ".tflite",
                          ".npz", ".pdparams", ".safetensors")
_TEMP_SUFFIXES = (".lock", ".incomplete", ".tmp", ".part")


# --------------------------------------------------------------------------- config.json
def read_config_json(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory (a dict in file key order)."""
    directory = Path(directory)
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {CONFIG_NAME}; a Hugging Face checkpoint directory needs one",
            hint="pass the directory that contains config.json and the weights",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise read_error(path, exc) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc.reason})",
                              hint="the file is corrupt; restore it from the original source") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            hint="the file is corrupt or truncated; restore it from the original source",
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object; found {type(data).__name__}")
    return data


def dump_config_json(data: dict[str, Any]) -> str:
    """config.json text: keys in the given order, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def read_error(path: Path, exc: BaseException) -> CheckpointError:
    """A CheckpointError for a file that cannot be read, with the hint that fits the cause."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        return CheckpointError(
            f"{path} is a dangling symbolic link (to {os.readlink(path)}, which does not exist)",
            hint="restore the file it points to (an interrupted download or a moved cache?), or re-download "
                 "the checkpoint",
        )
    if isinstance(exc, FileNotFoundError):
        return CheckpointError(f"{path} does not exist (it disappeared while reading?)",
                               hint="make sure nothing modifies the checkpoint while it is read")
    if isinstance(exc, PermissionError):
        return CheckpointError(f"cannot read {path}: permission denied", hint="check the file's permissions")
    if isinstance(exc, IsADirectoryError):
        return CheckpointError(f"{path} is a directory, where a file was expected")
    return CheckpointError(f"cannot read {path}: {_os_reason(exc)}")


# --------------------------------------------------------------------------- safetensors
@dataclass(frozen=True)
class SafetensorsHeader:
    """What a safetensors file's header promises: tensors and where their bytes lie."""

    path: Path
    header_len: int
    data_len: int
    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str] | None

    @property
    def expected_size(self) -> int:
        return 8 + self.header_len + self.data_len


def _corrupt(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is corrupt: {what}",
        hint="re-download or re-save this shard; the checkpoint cannot be converted as it is",
    )


def read_safetensors_header(path: Path, *, size: int | None = None) -> SafetensorsHeader:
    """Parse and check a safetensors header; verify the file size matches its data offsets.

    Reads only the header (a few KiB to MiB), never the tensor data. Raises CheckpointError
    naming the file and what is wrong: truncated, corrupt header, inconsistent offsets.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            actual = os.fstat(fh.fileno()).st_size if size is None else size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path} is truncated: {actual} bytes, shorter than a safetensors header",
                    hint="re-download or re-save this shard",
                )
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len == 0 or header_len > MAX_HEADER_BYTES:
                raise _corrupt(path, f"header length field reads {header_len} bytes")
            if 8 + header_len > actual:
                raise CheckpointError(
                    f"{path} is truncated: the header needs {8 + header_len} bytes, the file has {actual}",
                    hint="re-download or re-save this shard",
                )
            raw = fh.read(header_len)
    except OSError as exc:
        raise read_error(path, exc) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _corrupt(path, "the header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise _corrupt(path, "__metadata__ is not an object")
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise _corrupt(path, f"tensor {name!r} has no dtype/shape/data_offsets") from None
        bits = _DTYPE_BITS.get(dtype)
        if bits is None:
            raise _corrupt(path, f"tensor {name!r} has unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise _corrupt(path, f"tensor {name!r} has an invalid shape {shape!r}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise _corrupt(path, f"tensor {name!r} has invalid data offsets {[begin, end]!r}")
        numel = 1
        for d in shape:
            numel *= d
        if numel * bits != (end - begin) * 8:
            raise _corrupt(path, f"tensor {name!r} ({dtype}{shape}) spans {end - begin} bytes, "
                                 f"expected {numel * bits // 8}")
        spans.append((begin, end, name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise _corrupt(path, f"tensor {name!r} starts at byte {begin}, expected {position} (gap or overlap)")
        position = end
    data_len = position
    result = SafetensorsHeader(path=path, header_len=header_len, data_len=data_len, tensors=header,
                               metadata=metadata)
    if actual < result.expected_size:
        raise CheckpointError(
            f"{path} is truncated: its header describes {result.expected_size} bytes, the file has {actual}",
            hint="re-download or re-save this shard",
        )
    if actual > result.expected_size:
        raise _corrupt(path, f"{actual - result.expected_size} bytes after the last tensor")
    return result


# --------------------------------------------------------------------------- scanning
@dataclass(frozen=True)
class FileEntry:
    """One file of the source checkpoint and what happens to it."""

    name: str
    size: int
    role: str  # "weights" | "index" | "config" | "file"
    tensors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.size, "role": self.role, "tensors": self.tensors}


@dataclass
class CheckpointScan:
    """A verified checkpoint directory: its config, weights shards and other files."""

    directory: Path
    config: dict[str, Any]
    weights: list[FileEntry]
    index: FileEntry | None
    others: list[FileEntry]
    skipped: list[str] = field(default_factory=list)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)

    @property
    def weights_bytes(self) -> int:
        return sum(f.size for f in self.weights)

    @property
    def largest_shard_bytes(self) -> int:
        return max((f.size for f in self.weights), default=0)

    @property
    def num_tensors(self) -> int:
        return sum(f.tensors for f in self.weights)

    def copy_bytes(self, config_text_len: int = 0) -> int:
        """Bytes the output needs: weights, index, other files and the new config.json."""
        extra = (self.index.size if self.index else 0) + sum(f.size for f in self.others)
        return self.weights_bytes + extra + config_text_len


def _is_other_weights(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(_OTHER_WEIGHT_SUFFIXES) or any(
        lower.endswith(s + ".index.json") for s in (".bin", ".h5", ".msgpack", ".pt", ".pth"))


def scan_checkpoint(directory: Path, *, on_shard: Callable[[str], None] | None = None,
                    on_total: Callable[[int], None] | None = None) -> CheckpointScan:
    """List and verify a checkpoint directory (headers and sizes only; no tensor data read).

    ``on_total(n)`` is called once with the number of shards, ``on_shard(name)`` after each
    shard is verified (for progress displays).
    """
    directory = Path(directory)
    config = read_config_json(directory)
    try:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise CheckpointError(f"cannot list {directory}: {_os_reason(exc)}") from None

    names = {p.name: p for p in entries}
    index_entry: FileEntry | None = None
    if SAFE_INDEX_NAME in names:
        index_path = names[SAFE_INDEX_NAME]
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise read_error(index_path, exc) from None
        except UnicodeDecodeError:
            raise CheckpointError(f"{index_path} is not UTF-8 text", hint="re-download or re-save the checkpoint") \
                from None
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{index_path} is not valid JSON (line {exc.lineno}: {exc.msg})",
                                  hint="re-download or re-save the checkpoint") from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path} has no weight_map", hint="re-download or re-save the checkpoint")
        shard_names = sorted(set(weight_map.values()))
        for shard in shard_names:
            if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard.startswith("."):
                raise CheckpointError(f"{index_path} names an unexpected shard file {shard!r}")
            if (directory / shard).is_symlink() and not (directory / shard).exists():
                raise read_error(directory / shard, FileNotFoundError())
            if not (directory / shard).is_file():
                raise CheckpointError(
                    f"{directory} is incomplete: {SAFE_INDEX_NAME} lists {shard}, which is missing",
                    hint="finish the download (or re-save the checkpoint) before converting",
                )
        index_entry = FileEntry(SAFE_INDEX_NAME, index_path.stat().st_size, "index")
    elif SAFE_WEIGHTS_NAME in names:
        shard_names, weight_map = [SAFE_WEIGHTS_NAME], None
    else:
        bins = [n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]
        if bins:
            raise CheckpointError(
                f"{directory} has only PyTorch .bin weights ({bins[0]}); replayssm converts safetensors checkpoints",
                hint="re-save it as safetensors first: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir)",
            )
        raise CheckpointError(
            f"{directory} has no weights: neither {SAFE_WEIGHTS_NAME} nor {SAFE_INDEX_NAME}",
            hint="pass a complete checkpoint directory (config.json plus safetensors weights)",
        )

    if on_total is not None:
        on_total(len(shard_names))
    weights: list[FileEntry] = []
    headers: dict[str, SafetensorsHeader] = {}
    for shard in shard_names:
        header = read_safetensors_header(directory / shard)
        headers[shard] = header
        weights.append(FileEntry(shard, header.expected_size, "weights", len(header.tensors)))
        if on_shard is not None:
            on_shard(shard)
    if weight_map is not None:
        for tensor, shard in weight_map.items():
            if tensor not in headers[shard].tensors:
                raise CheckpointError(
                    f"{directory / shard} does not hold tensor {tensor!r}, which {SAFE_INDEX_NAME} places there",
                    hint="the index and the shards come from different saves; re-download the checkpoint",
                )

    used = set(shard_names) | {CONFIG_NAME, SAFE_INDEX_NAME}
    others: list[FileEntry] = []
    skipped: list[str] = []
    for name, path in names.items():
        if name in used:
            continue
        if name.startswith(".") or name.endswith(_TEMP_SUFFIXES):
            skipped.append(name)
        elif path.is_dir():
            skipped.append(name + "/")
        elif _is_other_weights(name):
            skipped.append(name)
        elif path.is_file():
            others.append(FileEntry(name, path.stat().st_size, "file"))
        else:
            skipped.append(name)
    return CheckpointScan(directory=directory, config=config, weights=weights, index=index_entry,
                          others=others, skipped=skipped, headers=headers)


__all__ = [
    "CONFIG_NAME", "SAFE_INDEX_NAME", "SAFE_WEIGHTS_NAME", "CheckpointScan", "FileEntry", "SafetensorsHeader",
    "dump_config_json", "read_config_json", "read_error", "read_safetensors_header", "scan_checkpoint",
]
