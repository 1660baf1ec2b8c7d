"""The progress protocol of long library calls (``convert``, ``validate_checkpoint``).

The library reports progress through a ``Progress`` object; this base class ignores every
call, and the CLI's subclass draws rich bars on stderr.
"""

from __future__ import annotations


class Progress:
    """Progress reporting hooks (all no-ops here).

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

__all__ = ["NULL_PROGRESS", "Progress"]
