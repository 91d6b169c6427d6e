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
        --out bench_out/simcal [--write-test-data]

`--write-test-data` copies the runs, trimmed to the keys the calibration reads, to
tests/data/simcal/ (what tests/test_sim_out_of_sample.py checks). `--no-record` skips the
runs and predicts from the folders already in `--out`. Beside each prediction, `line`: the
calibration run's forward line (a + b rows + e keys, fitted on its forwards) applied to the
target's own forwards, predicted over measured seconds; it tells the cost line's error from
the simulation's; `train`: the same for its training line on the target's own trained tokens
(a trainer slowed by something the calibration run did not have). Ends with one JSON line:
`{"targets": {NAME: {step_time_err, sampler_busy_err, forward_line_err, train_line_err}},
"max_abs_err": X, "host_other_cores_max": Y}`.

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

from slipstream.sim.calibrate import fit_passes, fit_profile, nonneg_lstsq, pass_sums, predict
from slipstream.sim.forecast import KEEP as FORECAST_KEYS
from slipstream.sim.runs import read_run

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
    rows = [json.loads(line) for line in (src / "metrics.jsonl").read_text().splitlines() if line]
    text = "".join(json.dumps({k: r[k] for k in KEEP if k in r}) + "\n" for r in rows)
    (dst / "metrics.jsonl").write_text(text)


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
    """The calibration run's training line (`time/train_s = c + d * tokens/trained`, the form
    `fit_profile` fits, here on the steps after the first, as compared) on the target's own
    steps after the first, their summed seconds predicted over measured, less 1: how much slower the target's
    trainer ran than the calibration run's (about 2x on a pipeline with another process on one
    of two cores; 5-15 % slower on a quiet host)."""
    src, tgt = source[1:] or source, target[1:] or target
    T = np.array([[1.0, float(m["tokens/trained"])] for m in src])
    c, d = nonneg_lstsq(T, np.array([float(m["time/train_s"]) for m in src]))
    pred = sum(c + d * float(m["tokens/trained"]) for m in tgt)
    return pred / sum(float(m["time/train_s"]) for m in tgt) - 1


def compare(folder: Path) -> dict[str, dict[str, float | None]]:
    """Fit on folder/SOURCE, predict every other run in RUNS."""
    source = read_run(folder / SOURCE)
    cal = fit_profile(source)
    out: dict[str, dict[str, float | None]] = {}
    for n in RUNS:
        if n != SOURCE:
            run = read_run(folder / n)
            line = forward_line_err(source.metrics, run.metrics)
            train = train_line_err(source.metrics, run.metrics)
            out[n] = {**predict(cal, run), "forward_line_err": line, "train_line_err": train}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/simcal")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--names", default=",".join(RUNS), help="the runs to record (default all)")
    p.add_argument("--write-test-data", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    if not args.no_record:
        load: dict[str, float] = {}
        for name in args.names.split(","):
            load[f"before {name}"] = cores = other_load()
            print(f"recording {name} (host: {cores:.2f} cores busy) ...", flush=True)
            record(out, name, args.steps, args.seed)
        load["after"] = other_load()
        out.mkdir(parents=True, exist_ok=True)
        (out / "host_load.json").write_text(json.dumps(load, indent=1) + "\n")
    load_file = out / "host_load.json"
    host = json.loads(load_file.read_text()) if load_file.exists() else {}
    if args.write_test_data:
        data = Path(__file__).resolve().parents[1] / "tests" / "data" / "simcal"
        for name in RUNS:
            trim(out / name, data / name)
    results = compare(out)
    print(f"calibrated on {SOURCE} ({args.steps} steps each, steps after the first compared)")
    print(
        f"{'target':14} {'step s':>8} {'pred':>8} {'err':>7} {'busy':>6} {'pred':>6} {'err':>7}"
        f" {'line':>7} {'train':>7}"
    )
    for n, r in results.items():
        fl = r["forward_line_err"]
        line_txt = "-" if fl is None else f"{fl:+.1%}"
        print(
            f"{n:14} {r['step_time_s']:8.3f} {r['step_time_s_pred']:8.3f} "
            f"{r['step_time_err']:+7.1%} {r['sampler_busy']:6.1%} {r['sampler_busy_pred']:6.1%} "
            f"{r['sampler_busy_err']:+7.1%} {line_txt:>7} {r['train_line_err']:+7.1%}"
        )
    print(
        "(line, train: the calibration run's forward line on the target's own forwards, its"
        " training line on the target's own trained tokens; predicted over measured seconds, no"
        " simulation)"
    )
    errs = [
        abs(v)
        for r in results.values()
        for k in ("step_time_err", "sampler_busy_err")
        if (v := r[k]) is not None
    ]
    line = {
        "targets": {
            n: {
                k: None if (v := r[k]) is None else round(v, 4)
                for k in ("step_time_err", "sampler_busy_err", "forward_line_err", "train_line_err")
            }
            for n, r in results.items()
        },
        "max_abs_err": round(max(errs), 4),
        "host_other_cores_max": round(max(host.values()), 3) if host else None,
    }
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
