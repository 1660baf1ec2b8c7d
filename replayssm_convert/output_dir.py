"""Writing output directories: streamed copies, disk-space checks, atomic publication.

* ``copy_file`` streams one file in fixed-size chunks: memory stays at one chunk, never a
  whole shard, let alone the model.
* ``atomic_output_dir`` builds the output in a temporary directory beside OUT_DIR and
  renames it into place at the end; any exception, Ctrl-C or SIGTERM (raised as an
  exception by the CLI) removes the temporary directory, so OUT_DIR either appears complete
  or not at all.
* A process killed outright (SIGKILL, out of memory) cannot clean up: its temporary
  directory holds a lock file that the process keeps locked (``flock``) while it runs, so a
  later run tells a leftover (lock free) from a directory in use, and
  ``remove_stale_temp_dirs`` removes the leftovers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import Callable, Iterator

from .checkpoint_dir import _os_reason, read_error
from .errors import CheckpointError, OutOfDiskError, OutputExistsError
from .formatting import human_bytes

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: leftovers are named, never removed
    fcntl = None

#: bytes copied per step (the only buffer the copy holds)
COPY_CHUNK = 4 * 1024 * 1024
#: space kept free on the output disk beyond the files themselves
DISK_RESERVE = 16 * 1024 * 1024
TMP_MARK = ".replayssm-tmp-"
OLD_MARK = ".replayssm-old-"
#: inside a temporary directory; locked by the process writing it
LOCK_NAME = ".replayssm-writer.lock"


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
        raise read_error(src, exc) from None
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
                    raise read_error(src, exc) from None
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
            f"not enough disk space in {where}: the output needs {human_bytes(needed)} plus "
            f"{human_bytes(DISK_RESERVE)} kept free, {human_bytes(free)} free",
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
    While the directory exists this process holds the lock of its lock file (module notes).
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
    lock: int | None = None
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
        tmp = parent / f".{out.name}{TMP_MARK}{tag}"
        try:
            tmp.mkdir()
        except OSError as exc:
            raise _write_error(exc, tmp) from None
        lock = _take_lock(tmp)
        yield tmp
        if lock is not None:  # still held: nobody takes the directory for a leftover while it is renamed
            (tmp / LOCK_NAME).unlink()
        _commit(tmp, out, force=force, tag=tag)
        tmp = None
    finally:
        if tmp is not None:
            _remove_tree(tmp)
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()
        if lock is not None:
            os.close(lock)


def _commit(tmp: Path, out: Path, *, force: bool, tag: str) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        return
    if not force:
        raise OutputExistsError(f"{out} appeared while converting", hint="pass --force to replace it")
    old = out.parent / f".{out.name}{OLD_MARK}{tag}"
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


# --------------------------------------------------------------------------- leftovers of killed runs
def _take_lock(tmp: Path) -> int | None:
    """Create and lock ``tmp/LOCK_NAME`` (holding the pid, for people); return its descriptor."""
    if fcntl is None:
        return None
    try:
        fd = os.open(tmp / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise _write_error(exc, tmp / LOCK_NAME) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a file system without locks: a leftover will be named, never removed
        os.close(fd)
        (tmp / LOCK_NAME).unlink(missing_ok=True)
        return None
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _is_stale(tmp: Path) -> bool:
    """True if ``tmp`` was written by this tool and its writer is gone (its lock is free)."""
    if fcntl is None:
        return False
    lock = tmp / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:  # no lock file: not ours, or its writer is publishing it right now
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # locked: a running process writes it
        try:  # the lock file is still the one in tmp (tmp was not renamed meanwhile)
            return os.stat(lock).st_ino == os.fstat(fd).st_ino
        except OSError:
            return False
    finally:
        os.close(fd)


def remove_stale_temp_dirs(out_dir: Path, *, dry_run: bool = False) -> tuple[list[Path], list[Path]]:
    """Remove the temporary directories that killed runs writing ``out_dir`` left beside it.

    Returns (removed, kept): ``kept`` are this tool's temporary names that are in use by a
    running process, or that cannot be shown to be leftovers (no lock file: written by an older
    version, or on a system without ``flock``); they are never removed. A ``.replayssm-old-``
    directory (the previous OUT_DIR being replaced) is removed only when OUT_DIR exists.
    With ``dry_run`` nothing is removed ("removed" lists what would be).
    """
    out = Path(out_dir).expanduser().absolute()
    removed: list[Path] = []
    kept: list[Path] = []
    try:
        entries = sorted(out.parent.iterdir())
    except OSError:
        return removed, kept
    for path in entries:
        if not path.name.startswith(f".{out.name}") or path.is_symlink() or not path.is_dir():
            continue
        mark = path.name[len(out.name) + 1:]
        if mark.startswith(TMP_MARK):
            stale = _is_stale(path)
        elif mark.startswith(OLD_MARK):
            stale = out.is_dir()
        else:
            continue
        if stale:
            if not dry_run:
                _remove_tree(path)
            removed.append(path)
        else:
            kept.append(path)
    return removed, kept


__all__ = [
    "COPY_CHUNK", "DISK_RESERVE", "atomic_output_dir", "check_disk_space", "check_output_dir", "copy_file",
    "fsync_dir", "remove_stale_temp_dirs", "write_text_file",
]
