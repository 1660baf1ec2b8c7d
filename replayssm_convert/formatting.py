"""Human-readable numbers for messages and tables."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value = float(n)
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover


def count(n: int, noun: str, plural: str | None = None) -> str:
    """(1, "layer") -> '1 layer'; (3, "layer") -> '3 layers'."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


__all__ = ["count", "human_bytes"]
