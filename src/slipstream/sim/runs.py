"""Reading a run folder: the resolved `config.toml`, `model_info.json` and `metrics.jsonl`.

The simulator needs only a few keys; each is looked up under the names the orchestrator writes
(`[sampling] group_size`, `max_new_tokens`, `[trainer] batch_prompts`, `micro_batch_size`,
`[schedule] name`, `max_lag`) with optional ones for the local runtime: the number of sampler
processes (`[runtime] num_samplers`, default 1) and the most sequences an engine decodes at
once (`[runtime] sampler_slots` or `[engine] max_batch`, default: the whole batch at once).
The local runtime's `runtime/sampler_busy` is read as `sampler_busy`. Errors name the file and, for
metrics, the line; a last line a run killed mid-write cut short is left out, and `incomplete`
says so, or that the run recorded fewer steps than its `[run] steps`. `pool_runs` reads several
runs of one configuration (seeds) as one record.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from slipstream.dicts import changed_keys
from slipstream.files import read_run_records
from slipstream.schedule.presets import preset
from slipstream.sim.simulator import LagPolicy

# Per-step metrics the calibration fits on (see calibrate.py).
REQUIRED_METRICS = (
    "step",
    "step_time_s",
    "time/generate_s",
    "time/train_s",
    "tokens/generated",
    "tokens/trained",
    "engine/decode_steps",
    "engine/prefill_tokens",
    "sampler_busy",
)
# The local and Ray runtimes name a metric of the sync loop differently: read either.
ALIASES = {"sampler_busy": "runtime/sampler_busy"}


class RunError(ValueError):
    """A run folder is missing something or holds a malformed value."""


@dataclass
class RunRecord:
    """What the simulator reads from one run folder."""

    path: Path
    config: dict[str, Any]
    model_info: dict[str, Any]
    metrics: list[dict[str, Any]]
    pooled: tuple[Path, ...] = ()
    """Further run folders whose steps follow this one's in `metrics` (`pool_runs`)."""
    torn: bool = False
    """metrics.jsonl's last line was cut short (the run stopped mid-write) and left out."""

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every folder whose steps `metrics` holds, this one first."""
        return (self.path, *self.pooled)

    def _get(self, section: str, key: str, default: Any = None) -> Any:
        value = self.config.get(section, {}).get(key, default)
        if value is None:
            raise RunError(f"{self.path / 'config.toml'}: missing [{section}] {key}")
        return value

    @property
    def group_size(self) -> int:
        return int(self._get("sampling", "group_size"))

    @property
    def max_new_tokens(self) -> int:
        return int(self._get("sampling", "max_new_tokens"))

    @property
    def batch_prompts(self) -> int:
        return int(self._get("trainer", "batch_prompts"))

    @property
    def micro_batch_size(self) -> int:
        return int(self._get("trainer", "micro_batch_size", 0))

    @property
    def schedule(self) -> str:
        return str(self._get("schedule", "name"))

    @property
    def max_lag(self) -> int:
        """`[schedule] max_lag`, or the preset's own K when unset (as the orchestrator does);
        under `max_lag = "auto"`, the largest K the run reached (its `schedule/max_lag`)."""
        value = self.config.get("schedule", {}).get("max_lag")
        if value == "auto":
            ks = [r["schedule/max_lag"] for r in self.metrics if "schedule/max_lag" in r]
            return max(ks) if ks else int(self.config["schedule"].get("max_lag_max", 8))
        return int(value) if value is not None else preset(self.schedule).max_lag

    @property
    def lag_policy(self) -> LagPolicy:
        """`[schedule] lag_policy`: what the run did with a group older than its bound
        (the trainer's default, "drop", when the config does not say)."""
        value = str(self.config.get("schedule", {}).get("lag_policy", "drop"))
        if value not in ("keep", "drop", "abort"):
            raise RunError(f"{self.path / 'config.toml'}: unknown [schedule] lag_policy {value!r}")
        return cast(LagPolicy, value)

    @property
    def num_samplers(self) -> int:
        runtime = self.config.get("runtime", {})
        return int(runtime.get("num_samplers", runtime.get("samplers", 1)))

    @property
    def max_batch(self) -> int:
        """Most sequences one engine decodes at once (`[runtime] sampler_slots` of the local
        runtime, or `[engine] max_batch`); the whole step's batch when unset."""
        engine = self.config.get("engine", {})
        slots = self.config.get("runtime", {}).get("sampler_slots")
        value = slots or engine.get("max_batch", engine.get("max_num_seqs"))
        return int(value) if value else self.batch_prompts * self.group_size

    @property
    def prompt_len(self) -> float:
        """Mean prompt tokens of a sample: the `prompt_len_mean` metric when logged, else
        prefilled tokens / samples (an engine that prefills every sample)."""
        logged = [float(m["prompt_len_mean"]) for m in self.metrics if "prompt_len_mean" in m]
        if logged:
            return sum(logged) / len(logged)
        samples = len(self.metrics) * self.batch_prompts * self.group_size
        return sum(float(m["engine/prefill_tokens"]) for m in self.metrics) / samples

    @property
    def prefills_per_group(self) -> float:
        """Prompt prefills per group: 1 with a shared prefix, G when every sample prefills."""
        per_group = sum(float(m["engine/prefill_tokens"]) for m in self.metrics) / (
            len(self.metrics) * self.batch_prompts
        )
        return per_group / self.prompt_len if self.prompt_len > 0 else 1.0

    def completion_lens(self) -> list[list[int]]:
        """Each step's completion lengths, group by group."""
        out = [m["completion_lens"] for m in self.metrics if m.get("completion_lens")]
        if not out:
            raise RunError(f"{self.path / 'metrics.jsonl'}: no step has completion_lens")
        return out


def read_metrics(path: Path, require: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], bool]:
    """One dict per line of a JSONL file, and whether its last line was torn: a last line
    without its newline that is not JSON, what a run killed mid-write leaves, is left out
    (the steps before it are whole). Any other bad line or a missing `require`d key raises,
    naming the file and line."""
    records, torn = read_run_records(path, RunError)
    for i, row in records:
        for name, alias in ALIASES.items():
            if name not in row and alias in row:
                row[name] = row[alias]
        missing = [k for k in require if k not in row]
        if missing:
            raise RunError(f"{path}:{i}: missing {', '.join(missing)}")
    return [row for _, row in records], torn


def read_run(run_dir: Path, require: tuple[str, ...] = REQUIRED_METRICS) -> RunRecord:
    """Read a run folder; raise `RunError` naming what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: not a run folder")
    config_path, metrics_path = run_dir / "config.toml", run_dir / "metrics.jsonl"
    for p in (config_path, metrics_path):
        if not p.is_file():  # (the folder of a run `slipstream train` made has both)
            raise RunError(f"{run_dir}: not a run folder (no {p.name})")
    try:
        config = tomllib.loads(config_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise RunError(f"{config_path}: {e}") from None
    info_path = run_dir / "model_info.json"
    model_info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    model_info = model_info or config.get("model", {})
    metrics, torn = read_metrics(metrics_path, require)
    if not metrics:
        raise RunError(f"{metrics_path}: no steps")
    return RunRecord(run_dir, config, model_info, metrics, torn=torn)


def incomplete(run: RunRecord) -> str | None:
    """Why `run` holds fewer steps than it set out to train, in words; None when it holds them
    all (or its config does not say how many). Its recorded steps still measure its
    configuration, so they are used; the caller says which folder is partial."""
    planned = run.config.get("run", {}).get("steps")
    short = isinstance(planned, int) and len(run.metrics) < planned
    if not (short or run.torn):
        return None
    what = f"{len(run.metrics)} of its {planned} steps" if short else f"{len(run.metrics)} steps"
    why = "its last line cut short, " if run.torn else ""
    return f"{what} recorded ({why}a run that stopped or is still running); using those"


def check_one_configuration(runs: Sequence[RunRecord]) -> None:
    """Raise `RunError` unless `runs` are runs of one configuration: their configs agree
    outside `[run]` (seed, folder, steps) and their model infos are equal; the error names
    the settings that differ."""
    if not runs:
        raise RunError("no runs to pool")
    first = runs[0]

    def shape(r: RunRecord) -> dict[str, Any]:
        return {k: v for k, v in r.config.items() if k != "run"}

    for r in runs[1:]:
        differ = changed_keys(shape(first), shape(r))
        if r.model_info != first.model_info:
            differ.append("model_info")
        if differ:
            raise RunError(
                f"{r.path}: not the configuration of {first.path} (differs in {', '.join(differ)})"
            )


def pool_runs(runs: Sequence[RunRecord]) -> RunRecord:
    """Several runs of one configuration (seeds, repeats) as one record: their steps one run
    after another, so that a fit weighs each run's steps alike and the lengths of every run
    make the length distribution (`check_one_configuration` first)."""
    check_one_configuration(runs)
    first = runs[0]
    paths = [p for r in runs for p in r.paths]
    metrics = [m for r in runs for m in r.metrics]
    return RunRecord(first.path, first.config, first.model_info, metrics, tuple(paths[1:]))
