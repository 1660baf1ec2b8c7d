"""Checkpoint directories on disk: reading, verifying, copying, and writing them atomically.

* ``read_config_json`` reads ``config.json`` keeping its key order.
* ``scan_checkpoint`` lists a directory's weights (``model.safetensors`` or the shards of
  ``model.safetensors.index.json``), verifies every shard's safetensors header against the
  file size (so truncated or corrupt shards are found before anything is written), and sorts
  the other files into "copy" (tokenizer, generation config, chat template, README, remote
  code...) and "skip" (other weight formats, sub-directories, hidden files).
* ``copy_file`` streams one file in fixed-size chunks: memory stays at one chunk, never a
  whole shard, let alone the model.
* ``atomic_output_dir`` builds the output in a temporary directory beside OUT_DIR and
  renames it into place at the end; any exception, Ctrl-C or SIGTERM (raised as an
  exception by the CLI) removes the temporary directory, so OUT_DIR either appears complete
  or not at all.

PyTorch ``.bin`` weights are not converted: a checkpoint with only ``pytorch_model*.bin``
is refused (they are pickles: they cannot be verified without unpickling, and transformers
re-saves them as safetensors in one call). When both formats are present the ``.bin`` files
are skipped, as transformers itself prefers safetensors.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import CheckpointError, OutOfDiskError, OutputExistsError

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_INDEX_NAME = "model.safetensors.index.json"
#: the largest safetensors header the safetensors library accepts
MAX_HEADER_BYTES = 100_000_000
#: bytes copied per step (the only buffer the copy holds)
COPY_CHUNK = 4 * 1024 * 1024
#: space kept free on the output disk beyond the files themselves
DISK_RESERVE = 16 * 1024 * 1024

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
TEST_HOOK_ENV = "REPLAYSSM_TEST_HOOK"


# --------------------------------------------------------------------------- test hooks
def test_hook(event: str) -> str | None:
    """The argument of test-hook ``event`` in $REPLAYSSM_TEST_HOOK, else None.

    $REPLAYSSM_TEST_HOOK is a comma-separated list of ``event`` or ``event:arg`` items, used
    by the test-suite to inject failures (``fail-after-shard:1``, ``interrupt-after-shard:1``,
    ``pause-after-shard:1``, ``perturb-logits``, ``perturb-stock-logits``). Unset in normal use.
    """
    raw = os.environ.get(TEST_HOOK_ENV)
    if not raw:
        return None
    for item in raw.split(","):
        name, _, arg = item.strip().partition(":")
        if name == event:
            return arg
    return None


# --------------------------------------------------------------------------- progress
class Progress:
    """Progress reporting hooks (this base class ignores them; the CLI draws rich bars).

    A task is named by ``key``; ``unit`` is "bytes" or "steps" (for display only).
    """

    def start(self, key: str, description: str, total: float | None = None, *, unit: str = "steps") -> None:
        pass

    def advance(self, key: str, amount: float = 1) -> None:
        pass

    def update(self, key: str, *, description: str | None = None, total: float | None = None) -> None:
        pass

    def finish(self, key: str) -> None:
        pass


NULL_PROGRESS = Progress()


# --------------------------------------------------------------------------- formatting
def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value = float(n)
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover


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
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {_os_reason(exc)}", hint="check the file's permissions") from None
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
        raise CheckpointError(f"cannot read {path}: {_os_reason(exc)}", hint="check the file's permissions") from None
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
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read {index_path}: {_os_reason(exc)}") from None
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


# --------------------------------------------------------------------------- copying
def _write_error(exc: OSError, target: Path) -> BaseException:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return OutOfDiskError(
            f"out of disk space while writing {target}",
            hint="free some space or choose an OUT_DIR on a larger disk; nothing was left behind",
        )
    return CheckpointError(f"cannot write {target}: {_os_reason(exc)}", hint="check the output directory's permissions")


def copy_file(src: Path, dst: Path, *, expected_size: int | None = None,
              on_bytes: Callable[[int], None] | None = None, chunk: int = COPY_CHUNK) -> int:
    """Copy ``src`` to ``dst`` byte for byte, ``chunk`` bytes at a time; return the bytes copied.

    Memory use is one ``chunk`` buffer. If ``expected_size`` is given, a source that ends
    early (truncated while copying) or runs longer raises CheckpointError.
    """
    buf = bytearray(chunk)
    view = memoryview(buf)
    copied = 0
    try:
        src_fh = open(src, "rb")
    except OSError as exc:
        raise CheckpointError(f"cannot read {src}: {_os_reason(exc)}") from None
    with src_fh:
        try:
            dst_fh = open(dst, "xb")
        except OSError as exc:
            raise _write_error(exc, dst) from None
        with dst_fh:
            while True:
                try:
                    n = src_fh.readinto(view)
                except OSError as exc:
                    raise CheckpointError(f"cannot read {src}: {_os_reason(exc)}") from None
                if not n:
                    break
                try:
                    dst_fh.write(view[:n])
                except OSError as exc:
                    raise _write_error(exc, dst) from None
                copied += n
                if on_bytes is not None:
                    on_bytes(n)
            try:
                dst_fh.flush()
                os.fsync(dst_fh.fileno())
            except OSError as exc:
                raise _write_error(exc, dst) from None
    if expected_size is not None and copied != expected_size:
        state = "truncated" if copied < expected_size else "changed"
        raise CheckpointError(
            f"{src} is {state}: read {copied} bytes, its header describes {expected_size}",
            hint="was the file modified during the conversion? re-download it and retry",
        )
    return copied


def write_text_file(path: Path, text: str) -> int:
    data = text.encode("utf-8")
    try:
        with open(path, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise _write_error(exc, path) from None
    return len(data)


# --------------------------------------------------------------------------- output directory
def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk_space(out_dir: Path, needed: int) -> None:
    """Raise OutOfDiskError unless the disk that will hold ``out_dir`` has ``needed`` bytes free."""
    where = _existing_ancestor(Path(out_dir).parent)
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if free < needed + DISK_RESERVE:
        raise OutOfDiskError(
            f"not enough disk space in {where}: the output needs {human_bytes(needed)}, "
            f"{human_bytes(free)} free",
            hint="free some space, or choose an OUT_DIR on a larger disk",
        )


def _is_within(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def check_output_dir(out_dir: Path, *, force: bool, source: Path | None = None) -> Path:
    """Check OUT_DIR can be written; return it absolute. Writes nothing.

    Refuses an existing OUT_DIR unless ``force``; always refuses an OUT_DIR that is, holds or
    lies inside the source checkpoint (the input is never modified).
    """
    out = Path(out_dir).expanduser().absolute()
    if source is not None:
        src = Path(source).resolve()
        real_out = out.resolve()
        if real_out == src or _is_within(real_out, src) or _is_within(src, real_out):
            raise OutputExistsError(
                f"OUT_DIR {out} overlaps the input checkpoint {src}; the input is never modified",
                hint="choose an OUT_DIR outside the input directory",
            )
    if out.exists() or out.is_symlink():
        if not force:
            kind = "directory" if out.is_dir() else "file"
            raise OutputExistsError(
                f"{out} already exists ({kind})",
                hint="pass --force to replace it, or choose another OUT_DIR",
            )
        if not out.is_dir() or out.is_symlink():
            raise OutputExistsError(
                f"{out} exists and is not a directory; --force only replaces directories",
                hint="remove it yourself or choose another OUT_DIR",
            )
    ancestor = _existing_ancestor(out.parent)
    if not ancestor.is_dir():
        raise OutputExistsError(f"cannot create {out}: {ancestor} is not a directory",
                                hint="choose another OUT_DIR")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot create {out}: {ancestor} is not writable",
                              hint="choose an OUT_DIR in a directory you can write to")
    return out


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(out_dir: Path, *, force: bool = False, source: Path | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out_dir``; rename it to ``out_dir`` on success.

    On any exception (including KeyboardInterrupt and SystemExit) the temporary directory,
    and any parent directories created for it, are removed and the exception propagates.
    With ``force`` an existing ``out_dir`` is replaced only after the new one is complete.
    """
    out = check_output_dir(out_dir, force=force, source=source)
    created: list[Path] = []
    parent = out.parent
    missing = []
    probe = parent
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    tmp: Path | None = None
    try:
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise _write_error(exc, d) from None
            created.append(d)
        tag = secrets.token_hex(4)
        tmp = parent / f".{out.name}.replayssm-tmp-{tag}"
        try:
            tmp.mkdir()
        except OSError as exc:
            raise _write_error(exc, tmp) from None
        yield tmp
        _commit(tmp, out, force=force, tag=tag)
        tmp = None
    finally:
        if tmp is not None:
            _remove_tree(tmp)
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()


def _commit(tmp: Path, out: Path, *, force: bool, tag: str) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        return
    if not force:
        raise OutputExistsError(f"{out} appeared while converting", hint="pass --force to replace it")
    old = out.parent / f".{out.name}.replayssm-old-{tag}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    _remove_tree(old)


def fsync_dir(path: Path) -> None:
    """Best effort: make a directory's entries durable."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = [
    "NULL_PROGRESS", "Progress", "CONFIG_NAME", "SAFE_INDEX_NAME", "SAFE_WEIGHTS_NAME", "CheckpointScan", "FileEntry", "SafetensorsHeader",
    "atomic_output_dir", "check_disk_space", "check_output_dir", "copy_file", "dump_config_json", "human_bytes",
    "fsync_dir", "read_config_json", "read_safetensors_header", "scan_checkpoint", "test_hook", "write_text_file",
]
