"""Live progress in the terminal (rich), or plain lines in quiet mode."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressView:
    """Shows step, version, reward, held-out accuracy, tokens/s and the ledger as a run goes."""

    def __init__(self, total: int, title: str, quiet: bool = False) -> None:
        self.quiet = quiet
        self.console = Console(stderr=True)
        self.total = total
        self._acc: float | None = None
        self._t0 = time.perf_counter()
        self._progress: Progress | None = None
        if not quiet:
            self._progress = Progress(
                TextColumn(f"[bold]{title}[/]"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._task = self._progress.add_task(title, total=total, info="")
            self._progress.start()

    def log(self, message: str) -> None:
        self.console.print(message)

    def update(self, step: int, m: dict[str, Any]) -> None:
        if m.get("heldout_acc") is not None:
            self._acc = m["heldout_acc"]
        acc = f"{self._acc:.3f}" if self._acc is not None else "-"
        info = (
            f"v{m.get('version', step)} reward {m.get('reward_mean', 0):.3f} acc {acc} "
            f"gen {m.get('engine/tokens_per_s', 0):,.0f} tok/s "
            f"kept {m.get('ledger/trained', 0)}/{m.get('ledger/generated', 0)}"
        )
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        elif m.get("heldout_acc") is not None or step == self.total:
            elapsed = time.perf_counter() - self._t0
            self.console.print(f"step {step}/{self.total} {info} [{elapsed:.0f}s]")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
