"""Reading a run folder for the report: metrics, summary, ledger, timeline, rollouts.

Only `metrics.jsonl` is required; a run still in progress has no `summary.json` or
`ledger.json` yet, and a run of the sync loop before it wrote timelines has no
`timeline.jsonl`. The figures show what is there and say what is missing.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slipstream.config import Config, load_config
from slipstream.dicts import changed_keys
from slipstream.files import read_run_records
from slipstream.observe.means import number
from slipstream.observe.rollouts import last_steps
from slipstream.observe.timeline import Interval, read_timeline

HELDOUT_KEYS = ("eval/heldout_acc", "heldout_acc")


class ReportError(ValueError):
    """A run folder is missing what the report needs, or holds a malformed file."""


@dataclass
class RunData:
    dir: Path
    label: str
    metrics: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None
    timeline: list[Interval] = field(default_factory=list)
    rollouts: str | None = None  # the last step's block of rollouts.txt

    @property
    def schedule(self) -> str:
        return str(self.config.get("schedule", {}).get("name", "?"))

    def values(self, *keys: str) -> list[tuple[dict[str, Any], float]]:
        """(row, value) of each step that recorded the first of `keys` it has as a number."""
        out = []
        for row in self.metrics:
            for k in keys:
                v = number(row.get(k))
                if v is not None:
                    out.append((row, v))
                    break
        return out

    def has(self, *keys: str) -> bool:
        return bool(self.values(*keys))

    def generated_tokens(self) -> list[float]:
        """Cumulative generated tokens at the end of each step (x axis of sample efficiency)."""
        total, out = 0.0, []
        for row in self.metrics:
            total += float(row.get("tokens/generated") or 0)
            out.append(total)
        return out

    def final_ledger(self) -> dict[str, Any] | None:
        """ledger.json, else the summary's, else the last step's `ledger/*` counters."""
        if self.ledger is not None:
            return self.ledger
        if self.summary is not None and isinstance(self.summary.get("ledger"), dict):
            return self.summary["ledger"]
        last = {
            k.removeprefix("ledger/"): v
            for k, v in self.metrics[-1].items()
            if k.startswith("ledger/")
        }
        if not last:
            return None
        last["filtered"] = {"all reasons": last.get("filtered", 0)}
        return last


def _json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl: a torn last line (a run killed mid-write, or still
    running) is left out, and the steps before it are shown; any other line that is not a JSON
    object raises ReportError naming the file and line."""
    rows = [row for _, row in read_run_records(path, ReportError)[0]]
    if not rows:
        raise ReportError(f"{path}: no steps recorded yet")
    return rows


def with_deferred_heldout(
    rows: list[dict[str, Any]], summary: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """`rows` with the held-out accuracy of deferred evaluation (`runtime.defer_eval`) put in
    the step records it belongs to: such a run scores its snapshots after the run, so the
    accuracy is only in summary.json's `heldout_curve` ({step, wall_s, heldout_acc}), not in
    metrics.jsonl. A row that recorded an accuracy itself keeps it."""
    curve = (summary or {}).get("heldout_curve")
    if not isinstance(curve, list):
        return rows
    acc = {
        p["step"]: float(p["heldout_acc"])
        for p in curve
        if isinstance(p, dict) and isinstance(p.get("heldout_acc"), int | float)
    }
    out = []
    for row in rows:
        if row.get("step") in acc and not any(k in row for k in HELDOUT_KEYS):
            row = {**row, "heldout_acc": acc[row["step"]]}
        out.append(row)
    return out


def load_run(run_dir: str | Path, label: str | None = None) -> RunData:
    d = Path(run_dir)
    if not d.is_dir():
        raise ReportError(f"{d}: not a run folder (no such directory)")
    metrics_path = d / "metrics.jsonl"
    if not metrics_path.exists():
        raise ReportError(f"{d}: not a run folder (no metrics.jsonl)")
    config: dict[str, Any] = {}
    if (d / "config.toml").exists():
        try:
            config = tomllib.loads((d / "config.toml").read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ReportError(f"{d / 'config.toml'}: {e}") from None
    timeline: list[Interval] = []
    if (d / "timeline.jsonl").exists():
        try:
            timeline = read_timeline(d / "timeline.jsonl")
        except ValueError as e:
            raise ReportError(str(e)) from None
    rollouts = None
    if (d / "rollouts.txt").exists():
        rollouts = (
            last_steps((d / "rollouts.txt").read_text(encoding="utf-8", errors="replace")) or None
        )
    metrics, summary = read_metrics(metrics_path), _json(d / "summary.json")
    return RunData(
        dir=d,
        label=label or d.resolve().name,
        metrics=with_deferred_heldout(metrics, summary),
        config=config,
        summary=summary,
        ledger=_json(d / "ledger.json"),
        timeline=timeline,
        rollouts=rollouts,
    )


def load_runs(dirs: Sequence[str | Path]) -> list[RunData]:
    """Runs labelled by folder name, with their position added where two names are the same."""
    names = [Path(d).resolve().name for d in dirs]
    runs = []
    for i, d in enumerate(dirs):
        run = load_run(d)
        if names.count(names[i]) > 1:
            run.label = f"{names[i]} ({i + 1})"
        runs.append(run)
    return runs


# Settings that never change what a run measures: not reported as differences between runs
UNCOMPARED = ("run.dir", "run.quiet", "run.sinks", "wandb.")
# Settings that change what rewards and held-out accuracy measure (the prompts, the verifier,
# the environment, the held-out set and how it is scored): runs differing in one are not on
# one scale, though the report's figures overlay them on one axis
SCALE = (
    "task.",
    "env.",
    "eval.num_prompts",
    "eval.samples_per_prompt",
    "eval.temperature",
    "eval.pass_threshold",
    "eval.sets",
    "eval.split",
)
SHOWN_SETTINGS = 8  # differing settings a notice names; the summary table shows them all


def _among(key: str, names: Sequence[str]) -> bool:
    """`key` is one of `names`, lies in one of their tables (a name ending in "."), or is a
    whole table holding one (`changed_keys` names a table one side lacks by the table)."""
    return any(
        key == n or (n.endswith(".") and key.startswith(n)) or n.startswith(key + ".")
        for n in names
    )


def differing_settings(runs: Sequence[RunData]) -> list[str]:
    """The settings (dotted names) in which the runs' config.toml differ, sorted, those of
    `UNCOMPARED` aside; a run without a config.toml is compared with none."""
    configs = [r.config for r in runs if r.config]
    differ = {k for c in configs[1:] for k in changed_keys(configs[0], c)}
    return sorted(k for k in differ if not _among(k, UNCOMPARED))


def comparison_notice(runs: Sequence[RunData]) -> str | None:
    """One line naming the settings the runs differ in, or None when they differ in none: the
    report overlays every run on one axis and sets them side by side, as TensorBoard and W&B
    compare runs, so the reader must know what changed between them. A `warning` where a
    setting of `SCALE` differs: their rewards and accuracies are then not on one scale."""
    differ = differing_settings(runs)
    if not differ:
        return None
    names = ", ".join(differ[:SHOWN_SETTINGS])
    if len(differ) > SHOWN_SETTINGS:
        names += f" and {len(differ) - SHOWN_SETTINGS} more"
    scale = [k for k in differ if _among(k, SCALE)]
    if not scale:
        return f"note: the runs differ in {names} (side by side in the summary table)"
    return (
        f"warning: the runs differ in {names}; with different {', '.join(scale)} their "
        "rewards and held-out accuracies are not on one scale, though the figures overlay them"
    )


def setting(config: dict[str, Any], dotted: str) -> object:
    """The value of a dotted setting (`trainer.lr`) in a run's config; None where it has none."""
    value: object = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def saved_changes(folder: Path, cfg: Config) -> list[str] | None:
    """The settings (dotted names) where `cfg` differs from the config.toml saved in `folder`,
    `run.dir` aside (a folder named by a relative or an absolute path, or moved, is the same
    run); None without a config.toml."""
    path = folder / "config.toml"
    if not path.is_file():
        return None
    changed = changed_keys(load_config(path).model_dump(), cfg.model_dump())
    return [k for k in changed if k != "run.dir"]


def finished_summary(cfg: Config) -> dict[str, Any] | None:
    """The `summary.json` of a finished run in `cfg.run.dir` whose saved config equals `cfg`
    (`saved_changes`: none), else None: what a benchmark's `--reuse` reads back instead of
    training again. A summary.json that cannot be read as a JSON object (torn by a crash
    before summaries were written atomically) is not a finished run's: None."""
    folder = Path(cfg.run.dir or "")
    if not (folder / "summary.json").is_file() or saved_changes(folder, cfg) != []:
        return None
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None
