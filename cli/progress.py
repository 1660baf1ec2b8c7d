"""Rich progress bars (on stderr) for the library's progress hooks."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from replayssm.formatting import human_bytes
from replayssm.progress import Progress as ProgressHooks

from .common import err


class _AmountColumn(ProgressColumn):
    """"12.0 MiB/48.0 MiB" for byte tasks, "3/4" for step tasks."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        if task.fields.get("unit") == "bytes":
            return Text(f"{human_bytes(task.completed)}/{human_bytes(task.total)}", style="progress.download")
        return Text(f"{int(task.completed)}/{int(task.total)}", style="progress.download")


class RichProgress(ProgressHooks):
    """Draws one bar per task; use as a context manager around the work."""

    def __init__(self, enabled: bool = True):
        # bars are for people at a terminal; logs and pipes get the result lines only
        self.enabled = enabled and err.is_terminal
        self._bars: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "RichProgress":
        if self.enabled:
            self._bars = Progress(
                SpinnerColumn(finished_text="[green]✓[/green]"),
                TextColumn("{task.description}"),
                BarColumn(bar_width=30),
                _AmountColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=False,
            )
            self._bars.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bars is not None:
            if exc_type is not None:
                # on failure the error line says it all: erase the bars (print nothing to files)
                self._bars.live.transient = True
            self._bars.stop()
            self._bars = None

    def start(self, key, description, total=None, *, unit="steps"):
        if self._bars is None:
            return
        self._tasks[key] = self._bars.add_task(description, total=total, unit=unit)

    def advance(self, key, amount=1):
        if self._bars is not None and key in self._tasks:
            self._bars.advance(self._tasks[key], amount)

    def update(self, key, *, description=None, total=None):
        if self._bars is None or key not in self._tasks:
            return
        kwargs = {}
        if description is not None:
            kwargs["description"] = description
        if total is not None:
            kwargs["total"] = total
        self._bars.update(self._tasks[key], **kwargs)

    def finish(self, key):
        if self._bars is None or key not in self._tasks:
            return
        task_id = self._tasks.pop(key)
        task = self._bars.tasks[[t.id for t in self._bars.tasks].index(task_id)]
        total = task.total if task.total is not None else max(task.completed, 1)
        self._bars.update(task_id, total=total, completed=total)
        self._bars.stop_task(task_id)
