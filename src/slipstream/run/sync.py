"""`train_sync`: the in-process synchronous run, built, resumed and finished.

The run is set up from its config (`run.setup`), restored from its newest checkpoint when
resuming (`run.resume`), given its watchdog (`run.rollback`), and handed to the loop proper
(`schedule.sync.train_steps`), which decides when each step happens; its checkpoints are
written here, and the run ends in `run.summary.finish`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slipstream.config import Config
from slipstream.run.resume import check_resume, checkpoint, restore, resume_from
from slipstream.run.rollback import inprocess_rollback, make_watchdog
from slipstream.run.setup import Run, setup
from slipstream.run.summary import finish
from slipstream.schedule.sync import train_steps
from slipstream.train.checkpoint import checkpoint_step


def train_sync(cfg: Config, resume: bool = False, *, checked: bool = False) -> dict[str, Any]:
    """Train `cfg.run.steps` steps; with `resume`, continue the run in `cfg.run.dir` from its
    newest complete checkpoint (the same trajectory as an unbroken run, bit for bit).
    `checked`: the caller made `check_resume`'s checks already (the CLI, in its own words)."""
    if resume and not checked:
        check_resume(cfg)
    ckpt = resume_from(cfg) if resume else None
    run = setup(cfg, checkpoint_step(ckpt) if ckpt is not None else None)
    try:
        with sigterm_as_interrupt():
            return _train(run, ckpt)
    except BaseException:  # an error or Ctrl-C: what `train_async` leaves, the same way
        run.close_observers()  # the terminal restored; metrics and timeline up to the last step
        # every group generated and neither trained nor filtered was back, not trained
        run.ledger.in_flight = run.ledger.generated - run.ledger.settled()
        run.write_ledger()
        raise
    finally:  # also when it raises: an in-process caller (a notebook) keeps no worker processes
        run.close_workers()


def _train(run: Run, ckpt: Path | None) -> dict[str, Any]:
    """`train_sync` on the run set up: its watchdog, the checkpoint `ckpt` (if given) restored,
    the loop, the summary."""
    wd = make_watchdog(run)  # before `restore`, which puts its state back
    if wd is not None:
        wd.rollback = inprocess_rollback(run)
    saved = restore(run, ckpt) if ckpt is not None else {}

    def save(extra: dict[str, Any]) -> None:
        checkpoint(run, **extra)

    acc_start, acc, wall = train_steps(run, wd, saved, save)
    return finish(run, acc_start, acc, wall)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's preemption, `kill`) raises KeyboardInterrupt in the main thread,
    as Ctrl-C does, so the in-process loop takes its one shutdown path: its environment and
    reward workers are stopped, its ledger written. By default SIGTERM ended the process at
    once and left those workers running. Elsewhere than the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
