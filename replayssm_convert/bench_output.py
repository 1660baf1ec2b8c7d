"""The files ``replayssm bench`` writes: output-path checks, atomic writes and the tokens/s plot.

The plot needs matplotlib (``pip install 'replayssm[bench]'``); without it the CLI prints the table
and one line saying how to get the plot (``PLOT_HINT``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .bench_settings import BenchError

if TYPE_CHECKING:
    from .bench import BenchResult

PLOT_HINT = "pip install 'replayssm[bench]'"


def check_output_path(path: str | os.PathLike, option: str, *, suffix: str | None = None) -> Path:
    """An output file that can be written: its folder exists and is writable, it is not a folder."""
    p = Path(path).expanduser()
    if suffix is not None and p.suffix.lower() != suffix:
        raise BenchError(f"{option} writes a {suffix[1:].upper()} file; give a path ending in {suffix}, "
                         f"got {str(path)!r}")
    if p.is_dir():
        raise BenchError(f"{option} {str(path)!r} is a directory; give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise BenchError(f"{option} {str(path)!r}: the folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise BenchError(f"{option} {str(path)!r}: not writable (permission denied)")
    return p


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot(result: BenchResult, path: Path) -> None:
    """A PNG of tokens/s against batch size (log-log), one line per variant, written atomically."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import io

    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        drawn = 0
        for variant in result.settings.variants:
            points = [(r.batch_size, r.tokens_per_s) for r in result.rows
                      if r.variant == variant and r.status == "ok" and r.tokens_per_s]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", label=variant)
                drawn += 1
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}")
                                     if ax.get_ylim()[1] < 10 * ax.get_ylim()[0] else NullFormatter())
        sizes = sorted(result.settings.batch_sizes)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens / s (generate, decode steps)")
        source = result.model.get("source") or {}
        name = source.get("name") or source.get("spec") or result.model.get("architecture", "model")
        where = result.meta.get("gpu") or result.meta.get("device", "")
        ax.set_title(f"{name} · {where} · {result.settings.dtype}, L={result.settings.buffer_len} · "
                     f"{result.meta.get('date', '')}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend()
        missing = sorted({f"{r.variant} ({r.note})" for r in result.rows if r.status == "n/a"})
        if missing:
            fig.text(0.01, 0.005, "not run: " + "; ".join(missing), fontsize=7, color="0.35")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    write_atomically(path, buf.getvalue())


__all__ = ["PLOT_HINT", "check_output_path", "matplotlib_available", "plot", "write_atomically"]
