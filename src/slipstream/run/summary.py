"""The end of a run and its step records read back.

`finish` closes a run that trained every step and writes its `summary.json` and
`ledger.json`: the in-process loop (`run.sync`), the orchestrated one (`run.launch`) and a
replayed one (`run.replay_run`) end here. `read_records` reads a run's metrics.jsonl back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slipstream.files import read_run_jsonl, write_atomic
from slipstream.run.setup import Run
from slipstream.schedule.step_stats import goodput


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl (none when there is none yet): objects with an
    integer `step`. A line that is not JSON, anywhere (a torn last line, or what a failing
    metrics sink left), is skipped: the end of a run, its resume and a bench's table read
    what the run recorded, and a damaged line must not stop them."""
    if not path.exists():
        return []
    lines, _ = read_run_jsonl(path, OSError)
    return [
        line.value
        for line in lines
        if isinstance(line.value, dict) and isinstance(line.value.get("step"), int)
    ]


def finish(run: Run, acc_start: float, acc_end: float, wall: float) -> dict[str, Any]:
    """The end of a run: its workers and observers closed, `summary.json` (accuracies, wall
    time, steps, the ledger, the run's info, goodput) and `ledger.json` written, each whole or
    not at all (`slipstream.files.write_atomic`), one line logged; returns the summary."""
    run.close_workers()
    run.close_observers()
    samplers = run.info.get("samplers", 0)
    records = read_records(run.dir / "metrics.jsonl")
    info = run.info
    totals = (info["tokens_generated"], info["busy_s"]) if "busy_s" in info else None
    good = goodput(
        records,
        wall,
        samplers,
        info.get("tokens_lost", 0),
        info.get("tokens_unfinished", 0),
        totals,
    )
    summary = {
        "heldout_acc_start": acc_start if run.heldout else None,  # None: no held-out rows
        "heldout_acc_end": acc_end if run.heldout else None,
        "wall_s": wall,
        "steps": run.trainer.version,
        "skipped_steps": run.trainer.skipped_steps,
        "ledger": run.ledger.as_dict(),
        "prompts_skipped": dict(run.prompts_skipped),
        **run.info,
        **good,
    }
    write_atomic(run.dir / "summary.json", json.dumps(summary, indent=2))
    run.write_ledger()
    lost = (
        f", {run.ledger.lost} groups ({good['tokens_lost']} tokens) lost to failures"
        if run.ledger.lost
        else ""
    )
    held = (
        f"held-out accuracy {acc_start:.3f} -> {acc_end:.3f}" if run.heldout else "no held-out rows"
    )
    run.view.log(
        f"done: {summary['steps']} steps in {wall:.{1 if wall < 10 else 0}f}s; {held}; "
        f"goodput {good['goodput']:.0%}{lost}; ledger {run.ledger.as_dict()}"
    )
    return summary
