"""Out-of-sample test of the simulator on this machine: calibrate on one configuration's runs,
predict other schedules and batch sizes, compare with what those runs measured.

Records four short runs of the built-in task on the local runtime (one trainer process, one
sampler process, each with the default threads), with the same seed and settings except:

    sync_b16       schedule sync,     batch_prompts 16   (the calibration run)
    pipeline_b16   schedule pipeline, batch_prompts 16   (another schedule)
    sync_b32       schedule sync,     batch_prompts 32   (another batch size)
    pipeline_b32   schedule pipeline, batch_prompts 32   (both)
    sync_b16_again the calibration run again, last   (the machine's noise floor: the same
                   run, same seed, a few minutes later)

then fits the CPU profile on `sync_b16` only (`slipstream.sim.calibrate.fit_profile`) and
predicts the mean step time and sampler busy fraction of the other three
(`calibrate.predict`: the discrete-event simulator runs the target's config with the fitted
profile and sync_b16's completion lengths). Steps after the first are compared.

Run (about a minute on this 2-core machine; a heavy job, so under the shared lock):

    flock /work/wt/notes/bench.lock timeout 900 python bench/sim_calibration.py \
        --out bench_out/simcal [--seeds 0,1,2] [--write-test-data]

With one seed (`--seeds 0`, the default) the runs go to out/NAME. One seed's 30 steps draw the
same prompts in every configuration, so a difference of its task (the share of groups the
filters keep, the lengths) repeats on every recording and reads as a model error; `--seeds
0,1,2` records the five runs once per seed, seed after seed (out/seed{S}/NAME), prints each
seed's comparison, and then the pooled one, which is the headline with several seeds (the rule
fixed before the first such recording, stop 41): the profile fitted on every seed's `sync_b16`
together (`sim.runs.pool_runs`: their steps in turn, their lengths together), each target's
prediction against the mean of its seeds' measured step time and sampler busy (the planner's
question: what a configuration costs on this task, not on one draw of its prompts).

`--write-test-data` copies the runs, trimmed to the keys the calibration reads, to
tests/data/simcal/ (one seed) or tests/data/simcal_seeds/seed{S}/ (several; what
tests/test_sim_out_of_sample.py checks). `--no-record` skips the
runs and predicts from the folders already in `--out`. Beside each prediction, `line`: the
calibration run's forward line (a + b rows + e keys, fitted on its forwards) applied to the
target's own forwards, predicted over measured seconds; it tells the cost line's error from
the simulation's; `train`: the same for its training line on the target's own trained tokens
(a trainer slowed by something the calibration run did not have). Ends with one JSON line:
`{"targets": {NAME: {step_time_err, sampler_busy_err, forward_line_err, train_line_err}},
"max_abs_err": X, "host_other_cores_max": Y}`; with several seeds `targets` and `max_abs_err`
are the pooled comparison's (its `line` and `train` checks are the pooled source's line on
every seed's target steps), and `per_seed` holds each seed's.

The runs time one trainer and one sampler process on a 2-core machine, so they need the whole
machine: a process of someone else's on one core does not change a sync run (its trainer and
sampler take turns on the other core) but slows a pipeline's training about 2x and its
forwards by a quarter to a third (measured with one `while True: pass` beside the bench, stop
32: the pipelines' step time -25 / -24 % against the prediction, `train` -47 %, `line` -26 /
-25 %; sync -4 %), which reads as a model error it is not. So before each run and after the
last, the bench measures for one second what the host's cores do while it sleeps
(/proc/stat: anything busy is another process), prints it (`host`, in cores), writes it to
out/host_load.json, and warns when any probe exceeds 0.15 of a core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from slipstream.files import read_jsonl, write_atomic
from slipstream.sim.calibrate import (
    computed_tokens,
    fit_passes,
    fit_profile,
    nonneg_lstsq,
    pass_sums,
    predict_runs,
    run_lengths,
)
from slipstream.sim.forecast import KEEP as FORECAST_KEYS
from slipstream.sim.runs import pool_runs, read_run

RUNS = {
    "sync_b16": ("sync", 16),
    "pipeline_b16": ("pipeline", 16),
    "sync_b32": ("sync", 32),
    "pipeline_b32": ("pipeline", 32),
    "sync_b16_again": ("sync", 16),
}
SOURCE = "sync_b16"
QUIET_CORES = 0.15
"""A probe above this many cores busy with other processes flags the recording."""
# what the forecast reads, and the sampler's busy and blocked shares (either name: sim.runs)
KEEP = (
    *FORECAST_KEYS,  # the engine's forward-pass sums among them
    "sampler_busy",
    "runtime/sampler_busy",
    "runtime/sampler_blocked",
)


def cpu_jiffies(stat: str = "/proc/stat") -> tuple[float, float]:
    """(busy, total) jiffies summed over the host's cores since boot: total counts user, nice,
    system, idle, iowait, irq, softirq and steal; busy is all but idle and iowait (a VM's
    steal, time the hypervisor gave to others, counts as busy)."""
    with open(stat) as f:
        v = [float(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def busy_cores(before: tuple[float, float], after: tuple[float, float], cores: int) -> float:
    """Cores busy on average between two `cpu_jiffies` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * cores if total > 0 else 0.0


def other_load(seconds: float = 1.0) -> float:
    """Cores kept busy by other processes: the host's busy share over `seconds` while this
    process sleeps (it has no workers between runs), in cores."""
    before = cpu_jiffies()
    time.sleep(seconds)
    return busy_cores(before, cpu_jiffies(), os.cpu_count() or 1)


def record(out: Path, name: str, steps: int, seed: int) -> Path:
    """Train one run of `RUNS[name]` into out/name (the local runtime, evaluation deferred
    to after the run so that it takes no time from the steps)."""
    from slipstream.config import load_config
    from slipstream.run.launch import train_async

    schedule, batch = RUNS[name]
    shutil.rmtree(out / name, ignore_errors=True)
    cfg = load_config(
        None,
        [
            f'run.dir="{out / name}"',
            f"run.steps={steps}",
            f"run.seed={seed}",
            "run.quiet=true",
            f'schedule.name="{schedule}"',
            "schedule.max_lag=2" if schedule == "pipeline" else "schedule.max_lag=0",
            f"trainer.batch_prompts={batch}",
            "sampling.group_size=8",
            'runtime.kind="local"',
            "runtime.defer_eval=true",
            f"eval.every={steps}",
            "eval.num_prompts=64",
        ],
    )
    train_async(cfg)
    return out / name


def trim(src: Path, dst: Path) -> None:
    """Copy a run folder's config, model info and metrics, keeping only the KEEP keys."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("config.toml", "model_info.json"):
        shutil.copy(src / f, dst / f)
    rows = read_jsonl(src / "metrics.jsonl")
    text = "".join(json.dumps({k: r[k] for k in KEEP if k in r}) + "\n" for r in rows)
    write_atomic(dst / "metrics.jsonl", text)


def forward_line_err(source: list[dict], target: list[dict]) -> float | None:
    """The calibration run's forward line (`fit_passes`: a + b rows + e keys) on the target's
    own forwards, their summed seconds predicted over measured, less 1: the cost line's share
    of a prediction's error, with no simulation (the target's passes, rows and keys as they
    were). None when either run lacks the forward-pass sums."""
    coef, sums = fit_passes(source), pass_sums(target)
    if coef is None or sums is None:
        return None
    n, rows, keys, seconds = sums[:4]
    return float(coef @ [n, rows, keys]) / seconds - 1


def train_line_err(source: list[dict], target: list[dict]) -> float:
    """The calibration run's training line (`time/train_s = c + d * tokens/computed`, the form
    `fit_profile` fits, here on the steps after the first, as compared) on the target's own
    steps after the first, their summed seconds predicted over measured, less 1: how much
    slower the target's trainer ran than the calibration run's (about 2x on a pipeline with
    another process on one of two cores; 5-15 % slower on a quiet host)."""
    return train_rows_err(source[1:] or source, target[1:] or target)


def train_rows_err(src: list[dict], tgt: list[dict]) -> float:
    """`train_line_err` on the steps given, every one of them (no warm-up left out)."""
    T = np.array([[1.0, computed_tokens(m)] for m in src])
    c, d = nonneg_lstsq(T, np.array([float(m["time/train_s"]) for m in src]))
    pred = sum(c + d * computed_tokens(m) for m in tgt)
    return pred / sum(float(m["time/train_s"]) for m in tgt) - 1


def compare(folder: Path) -> dict[str, dict[str, float | None]]:
    """Fit on folder/SOURCE, predict every other run in RUNS (`compare_pooled` of one folder)."""
    return compare_pooled([folder])


def compare_pooled(folders: list[Path]) -> dict[str, dict[str, float | None]]:
    """Fit on every folder's SOURCE pooled (`pool_runs`), predict every other run of RUNS in
    each folder, and compare the mean prediction with the mean measured over the folders
    (`predict_runs`: each folder's run weighs alike). `forward_line_err` and
    `train_line_err`: the pooled source's lines on every folder's target steps (training: each
    run's steps after its first)."""
    sources = [read_run(f / SOURCE) for f in folders]
    pooled = pool_runs(sources)
    cal = fit_profile(pooled)
    lengths = run_lengths(pooled)  # once, from the runs in hand: every target uses the same
    src_rows = [m for r in sources for m in r.metrics]
    src_after = [m for r in sources for m in r.metrics[1:]]
    out: dict[str, dict[str, float | None]] = {}
    for n in RUNS:
        if n == SOURCE:
            continue
        runs = [read_run(f / n) for f in folders]
        res: dict[str, float | None] = {**predict_runs(cal, runs, lengths)}
        rows = [m for r in runs for m in r.metrics]
        res["forward_line_err"] = forward_line_err(src_rows, rows)
        res["train_line_err"] = train_rows_err(src_after, [m for r in runs for m in r.metrics[1:]])
        out[n] = res
    return out


def seed_folders(out: Path, seeds: list[int]) -> dict[int, Path]:
    """Where each seed's runs go: `out` itself for one seed (the layout before --seeds),
    out/seed{S} for several."""
    return {s: out if len(seeds) == 1 else out / f"seed{s}" for s in seeds}


def print_table(title: str, results: dict[str, dict[str, float | None]]) -> None:
    print(title)
    print(
        f"{'target':14} {'step s':>8} {'pred':>8} {'err':>7} {'busy':>6} {'pred':>6} {'err':>7}"
        f" {'line':>7} {'train':>7}"
    )
    for n, r in results.items():
        fl, tl = r["forward_line_err"], r["train_line_err"]
        print(
            f"{n:14} {r['step_time_s']:8.3f} {r['step_time_s_pred']:8.3f} "
            f"{r['step_time_err']:+7.1%} {r['sampler_busy']:6.1%} {r['sampler_busy_pred']:6.1%} "
            f"{r['sampler_busy_err']:+7.1%} {'-' if fl is None else f'{fl:+.1%}':>7}"
            f" {'-' if tl is None else f'{tl:+.1%}':>7}"
        )


def headline(results: dict[str, dict[str, float | None]]) -> dict[str, object]:
    """The JSON's figures of one comparison: each target's errors, the largest of the step
    time and sampler busy errors (`max_abs_err`), and the same over the other configurations
    only (`targets_max_abs_err`: the calibration run's rerun is the noise floor, not a
    target)."""

    def largest(names: list[str]) -> float:
        errs = [
            abs(v)
            for n in names
            for k in ("step_time_err", "sampler_busy_err")
            if (v := results[n][k]) is not None
        ]
        return round(max(errs), 4)

    keys = ("step_time_err", "sampler_busy_err", "forward_line_err", "train_line_err")
    return {
        "targets": {
            n: {k: None if (v := r[k]) is None else round(v, 4) for k in keys}
            for n, r in results.items()
        },
        "max_abs_err": largest(list(results)),
        "targets_max_abs_err": largest([n for n in results if RUNS[n] != RUNS[SOURCE]]),
    }


def record_all(folders: dict[int, Path], names: list[str], steps: int) -> None:
    """Record `names` for each seed in turn into its folder, probing the host before each run
    and after the last (folder/host_load.json)."""
    for seed, folder in folders.items():
        load: dict[str, float] = {}
        for name in names:
            load[f"before {name}"] = cores = other_load()
            tag = f" seed {seed}" if len(folders) > 1 else ""
            print(f"recording {name}{tag} (host: {cores:.2f} cores busy) ...", flush=True)
            record(folder, name, steps, seed)
        load["after"] = other_load()
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "host_load.json", json.dumps(load, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/simcal")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds, the five runs recorded for each (several: the pooled "
        "comparison is the headline)",
    )
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--names", default=",".join(RUNS), help="the runs to record (default all)")
    p.add_argument("--write-test-data", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    seeds = [int(x) for x in args.seeds.split(",")]
    folders = seed_folders(out, seeds)
    if not args.no_record:
        record_all(folders, args.names.split(","), args.steps)
    host: dict[str, float] = {}
    for seed, folder in folders.items():
        if (folder / "host_load.json").exists():
            tag = f"seed {seed} " if len(seeds) > 1 else ""
            load = json.loads((folder / "host_load.json").read_text())
            host |= {tag + k: v for k, v in load.items()}
    if args.write_test_data:
        data = Path(__file__).resolve().parents[1] / "tests" / "data"
        for seed, folder in folders.items():
            dst = data / "simcal" if len(seeds) == 1 else data / "simcal_seeds" / f"seed{seed}"
            for name in RUNS:
                trim(folder / name, dst / name)
    per_seed = {seed: compare(folder) for seed, folder in folders.items()}
    for seed, results in per_seed.items():
        tag = f", seed {seed}" if len(seeds) > 1 else ""
        print_table(
            f"calibrated on {SOURCE}{tag} ({args.steps} steps each, steps after the first compared)",
            results,
        )
    if len(seeds) == 1:
        line = headline(per_seed[seeds[0]])
    else:
        pooled = compare_pooled(list(folders.values()))
        print()
        print_table(
            f"pooled over seeds {args.seeds} (the headline): calibrated on the {len(seeds)} "
            f"{SOURCE} runs together; measured and predicted: the mean over the seeds",
            pooled,
        )
        print("each seed's own step time error (calibrated on its own sync_b16): min .. max")
        for n in pooled:
            e = [per_seed[s][n]["step_time_err"] or 0.0 for s in seeds]
            b = [per_seed[s][n]["sampler_busy_err"] or 0.0 for s in seeds]
            print(
                f"  {n:14} step {min(e):+.1%} .. {max(e):+.1%}   busy {min(b):+.1%} .. {max(b):+.1%}"
            )
        line = {
            **headline(pooled),
            "seeds": seeds,
            "per_seed": {str(s): headline(r) for s, r in per_seed.items()},
        }
    print(
        "(line, train: the calibration run's forward line on the target's own forwards, its"
        " training line on the target's own trained tokens; predicted over measured seconds, no"
        " simulation)"
    )
    line["host_other_cores_max"] = round(max(host.values()), 3) if host else None
    busy = {k: v for k, v in host.items() if v > QUIET_CORES}
    print(
        f"host: other processes kept at most {max(host.values()):.2f} cores busy"
        if host
        else "host: not probed (no host_load.json: recorded before the probe existed)"
    )
    if busy:
        print(
            f"WARNING: the host was not quiet ({', '.join(f'{k}: {v:.2f}' for k, v in busy.items())}"
            " cores busy with other processes): the overlapping schedules' timings are not this"
            " machine's alone, and their errors not the model's"
        )
    print(json.dumps(line))


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    main()
