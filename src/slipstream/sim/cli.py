"""`slipstream sim` and `slipstream plan`: parse, build the simulator's objects, print.

Both entry points take argv without the program and subcommand names, return an exit code,
and turn a bad input into one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slipstream.argv import OneLineParser
from slipstream.schedule.presets import PRESETS, preset
from slipstream.sim.calibrate import (
    Calibration,
    check_fit_steps,
    fit_profile,
    load_calibration,
    predict_runs,
    save_calibration,
)
from slipstream.sim.cost import ModelShape, model_shape
from slipstream.sim.failures import RECOVERY, SOURCES, FailureModel
from slipstream.sim.forecast import MODEL_ERROR, Forecast, plan_forecast
from slipstream.sim.hardware import HARDWARE, Hardware, hardware
from slipstream.sim.lengths import DEFAULT_MAX_LEN, parse_lengths
from slipstream.sim.planner import (
    Candidate,
    PlanRequest,
    format_plan,
    plan,
    plot_plan,
    searched_split,
)
from slipstream.sim.runs import RunError, RunRecord, incomplete, pool_runs, read_run
from slipstream.sim.simulator import (
    Cluster,
    SimConfig,
    SimResult,
    Workload,
    min_steps,
    simulate,
    steady_warmup,
)

DEFAULT_LENGTHS = f"lognormal:median=2000,sigma=0.7,max={DEFAULT_MAX_LEN}"


def fmt_duration(seconds: float) -> str:
    """4h05m, 3m20s, 45s."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=128, help="GPUs in the cluster")
    p.add_argument("--hardware", default="h100", choices=sorted(HARDWARE), help="device preset")
    p.add_argument("--profile", type=Path, help="a calibration JSON (replaces --hardware)")
    p.add_argument(
        "--model",
        default="7b",
        help="model preset (0.5b, 1.5b, 7b, 8b, 32b, 30b-a3b), or a run folder (its "
        "model_info.json: the model a --profile was calibrated with)",
    )
    p.add_argument("--batch-prompts", type=int, default=512, help="B: prompts per step")
    p.add_argument("--group-size", type=int, default=16, help="G: samples per prompt")
    p.add_argument(
        "--prompt-len",
        type=float,
        help="prompt tokens (default: the --profile's calibration runs', else 512)",
    )
    p.add_argument(
        "--trained-frac",
        type=float,
        help="share of the completion tokens the trainer trains (the filters drop groups); "
        "default: the --profile's, measured with its per-trained-token line, else every "
        "sample's prompt and completion",
    )
    p.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        help="completion lengths, tokens: lognormal:median=M,sigma=S[,max=N,prompt_share=F], "
        "heavy:median=M,sigma=S[,max=N,tail=F,alpha=A,prompt_share=F], "
        f"straggler:p99=P,max=N[,sigma=S,tail=F] or empirical:RUN_DIR; max (the cut) "
        f"defaults to {DEFAULT_MAX_LEN} for lognormal and heavy (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--failures", choices=sorted(SOURCES), help="model failures, MTTF from this source"
    )
    p.add_argument("--recovery", default="automated", choices=sorted(RECOVERY))
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _calibration(args: argparse.Namespace) -> Calibration | None:
    """The `--profile`, read once for the hardware and the workload."""
    return load_calibration(args.profile) if args.profile else None


def _hardware(args: argparse.Namespace, cal: Calibration | None) -> Hardware:
    return cal.hardware if cal else hardware(args.hardware)


def _model(name: str) -> ModelShape:
    """A preset by name, or the model of a run folder (its `model_info.json`)."""
    info = Path(name) / "model_info.json"
    if info.is_file():
        return ModelShape.from_info(json.loads(info.read_text()), Path(name).name)
    if Path(name).is_dir():  # a folder, not a run's: say what it lacks, not "unknown model"
        raise ValueError(
            f"--model {name}: a folder without model_info.json (a run folder has one); "
            "or a preset name (qwen2.5-7b, 7b, ...)"
        )
    return model_shape(name)


def _workload(args: argparse.Namespace, cal: Calibration | None) -> Workload:
    """The step's work from the flags; with a profile `cal`, what its calibration runs
    measured (prompt length, prefills per group, trained share) where no flag says otherwise:
    the profile's training line is per trained token, so it needs the share it was fitted
    with."""
    frac = args.trained_frac
    if frac is None and cal is not None:
        frac = cal.trained_frac
    if frac is not None and not 0 < frac <= 1:
        raise ValueError(f"--trained-frac must be in (0, 1], got {frac}")
    if args.prompt_len is not None and not (
        math.isfinite(args.prompt_len) and args.prompt_len >= 0
    ):
        raise ValueError(f"--prompt-len must be a number of tokens >= 0, got {args.prompt_len}")
    return Workload(
        args.batch_prompts,
        args.group_size,
        parse_lengths(args.lengths),
        args.prompt_len if args.prompt_len is not None else cal.prompt_len if cal else 512.0,
        prefills_per_group=cal.prefills_per_group if cal else 1.0,
        trained_frac=frac,
    )


def check_counts(args: argparse.Namespace, min_steps: int) -> None:
    """The counts both commands take, each named with what it expects: a `ValueError` for
    `--gpus` below 1, `--steps` below `min_steps`, a negative `--seed`, or (`sim`) a
    `--samplers` that leaves no trainer GPU. The simulator's own checks name its fields
    (`warmup_steps`, which is no flag) or report a misread state ("no trainer GPUs: 0 GPUs,
    None sampling")."""
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    if args.steps < min_steps:
        raise ValueError(f"--steps must be >= {min_steps}, got {args.steps}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    samplers = getattr(args, "samplers", None)
    if samplers is not None and not 1 <= samplers < args.gpus:
        raise ValueError(
            f"--samplers must be from 1 to {args.gpus - 1} (--gpus {args.gpus} less at least "
            f"one trainer GPU), got {samplers}"
        )


def check_plot_path(path: str) -> None:
    """`--plot` names a file matplotlib can write, in a folder that exists: checked before the
    search, which otherwise ends in the OS's or matplotlib's message without the flag."""
    from matplotlib.figure import Figure

    target = Path(path)
    if not target.parent.is_dir():
        raise ValueError(f"--plot {path}: the folder {target.parent} does not exist")
    kinds = Figure().canvas.get_supported_filetypes()
    kind = target.suffix.lower().lstrip(".")
    if kind and kind not in kinds:
        raise ValueError(f"--plot {path}: expected an image file ({', '.join(sorted(kinds))})")


def _failures(args: argparse.Namespace) -> FailureModel | None:
    return FailureModel.from_source(args.failures, args.recovery) if args.failures else None


def _run_main(
    prog: str,
    build: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace], int],
    argv: list[str],
) -> int:
    try:
        args = build.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return body(args)
    except (ValueError, RunError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


# -- sim ----------------------------------------------------------------------------------


def _sim_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="slipstream sim",
        description="Simulate an RL run on a cluster, or calibrate the CPU profile.",
    )
    _common(p)
    p.add_argument("--schedule", default="pipeline", choices=list(PRESETS))
    p.add_argument("--max-lag", type=int, help="K for async and pipeline")
    p.add_argument(
        "--samplers",
        type=int,
        help="sampler GPUs (default: colocated for sync and tail_batching, else the split of "
        "highest simulated throughput, searched as `slipstream plan` does: a climb from the "
        "cost model's balanced split, 8 steps a simulation)",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument(
        "--lag-policy",
        default="drop",
        choices=["keep", "drop", "abort"],
        help="a group older than --max-lag: drop it (the trainer's default), keep it, or abort it",
    )
    p.add_argument(
        "--calibrate",
        type=Path,
        nargs="+",
        action="extend",
        metavar="RUN_DIR",
        help="fit the CPU profile from a local run, or from several runs of one configuration "
        "(seeds) pooled; with --predict, then predict those runs with it. A run with fewer "
        "steps than it set out to train is used, with a warning naming it",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="where --calibrate writes the profile (default: the first RUN_DIR/sim_profile.json)",
    )
    p.add_argument(
        "--predict",
        type=Path,
        nargs="+",
        action="extend",
        metavar="RUN_DIR",
        help="predict a local run with --profile, or with the profile --calibrate fits in the "
        "same command, and compare; several runs of one configuration (seeds): their means",
    )
    return p


# `sim` simulates with the simulator's default warm-up (`SimConfig.warmup_steps`)
SIM_MIN_STEPS = min_steps(SimConfig.warmup_steps)


def _sim(args: argparse.Namespace) -> int:
    check_counts(args, SIM_MIN_STEPS)
    if args.calibrate:
        return _calibrate(args)
    if args.predict:
        return _predict(args)
    cal = _calibration(args)
    hw, model, work = _hardware(args, cal), _model(args.model), _workload(args, cal)
    spec = preset(args.schedule, args.max_lag)
    samplers = args.samplers
    if samplers is None and not (spec.batching == "fixed" and spec.max_lag == 0):
        req = PlanRequest(args.gpus, hw, model, work, seed=args.seed, lag_policy=args.lag_policy)
        samplers = searched_split(req, args.schedule, spec.max_lag)
        if samplers is None:
            raise ValueError(f"no sampler/trainer split of {args.gpus} GPUs holds {model.name}")
    cfg = SimConfig(
        Cluster(hw, model, args.gpus, samplers),
        work,
        spec,
        args.steps,
        args.seed,
        lag_policy=args.lag_policy,
        failures=_failures(args),
    )
    res = simulate(cfg)
    if args.json:
        split = {"sampler_gpus": samplers, "trainer_gpus": cfg.cluster.trainer_gpus}
        extra = {"lag_counts": res.lag_counts, "groups": res.groups}
        print(json.dumps({**res.summary(), **split, **extra}))
    else:
        print(_format_result(res))
    return 0


def _format_result(res: SimResult) -> str:
    c = res.config.cluster
    where = (
        "colocated" if c.colocated else f"{c.sampler_gpus} sampler + {c.trainer_gpus} trainer GPUs"
    )
    lines = [
        f"{res.config.schedule.name} (max lag {res.config.schedule.max_lag}) on {c.n_gpus} x "
        f"{c.hardware.name}, {where}, {c.n_engines} engines x {res.engine_slots} slots",
        "",
    ]
    units = {"throughput_tokens_s": "tokens/s", "cost_per_mtok": "$ per million tokens"}
    for k, v in res.summary().items():
        unit = units.get(k, "s" if k.endswith("_s") else "")
        lines.append(f"  {k:22} {v:>14.4g} {unit}")
    lines.append(f"  {'lag histogram':22} {res.lag_counts}")
    lines.append(f"  {'groups':22} {res.groups}")
    if res.failures:
        lines.append(f"  {'failures':22} {res.failures}")
    return "\n".join(lines)


def read_runs(dirs: list[Path], flag: str) -> list[RunRecord]:
    """The run folders `flag` names, read. A folder named twice is a `ValueError` (pooled, its
    steps would count twice); one holding fewer steps than it set out to train (a run that
    crashed, or is still running: `runs.incomplete`) is used, and named in a warning line on
    stderr, so a profile or a comparison resting on part of a run says so."""
    seen: dict[Path, Path] = {}
    for d in dirs:
        first = seen.setdefault(d.resolve(), d)
        if first is not d:
            same = f"{d} is named twice" if first == d else f"{first} and {d} are one folder"
            raise ValueError(f"{flag}: {same}; its steps would count twice")
    runs = [read_run(d) for d in dirs]
    for r in runs:
        why = incomplete(r)
        if why is not None:
            print(f"slipstream sim: warning: {flag} {r.path}: {why}", file=sys.stderr)
    return runs


def _calibrate(args: argparse.Namespace) -> int:
    """Fit and write the profile; with --predict, predict those runs with it."""
    if args.predict and args.profile:
        raise ValueError(
            "--calibrate with --predict predicts with the profile it fits: drop --profile"
        )
    pooled = pool_runs(read_runs(args.calibrate, "--calibrate"))
    check_fit_steps(pooled)
    cal = fit_profile(pooled)
    out = args.out or args.calibrate[0] / "sim_profile.json"
    save_calibration(cal, out)
    hw = cal.hardware
    rows = {
        "decode s/pass": hw.decode_overhead_s,
        "decode s/token": hw.decode_seq_s,
        "decode s/context token": hw.decode_ctx_s,
        "train s/step": hw.train_overhead_s,
        "train s/token": hw.train_token_s,
        "sync latency s": hw.sync_latency_s,
        "fit error generate": cal.fit_error["generate"],
        "fit error train": cal.fit_error["train"],
    }
    cmp = predict_runs(cal, read_runs(args.predict, "--predict")) if args.predict else None
    if args.json:
        print(json.dumps({**rows, "profile": str(out), **({"predict": cmp} if cmp else {})}))
        return 0
    print("\n".join(f"  {k:24} {v:.4g}" for k, v in rows.items()))
    print(f"wrote {out}")
    if cmp is not None:
        print(_format_prediction(cmp, len(args.predict)))
    return 0


def _predict(args: argparse.Namespace) -> int:
    if not args.profile:
        raise ValueError("--predict needs --profile (or --calibrate)")
    cmp = predict_runs(load_calibration(args.profile), read_runs(args.predict, "--predict"))
    print(json.dumps(cmp) if args.json else _format_prediction(cmp, len(args.predict)))
    return 0


def _format_prediction(cmp: dict[str, float], n_runs: int) -> str:
    """`predict_runs`'s comparison of `n_runs` runs as a text table."""
    lines = [f"  {'':16} {'measured':>10} {'predicted':>10} {'error':>8}"]
    for k, err in (("step_time_s", "step_time_err"), ("sampler_busy", "sampler_busy_err")):
        lines.append(f"  {k:16} {cmp[k]:>10.4g} {cmp[k + '_pred']:>10.4g} {cmp[err]:>+8.1%}")
    if n_runs > 1:
        lines.append(f"  ({n_runs} runs: the means of what they measured and of their predictions)")
    return "\n".join(lines)


def sim_main(argv: list[str]) -> int:
    """`slipstream sim ...`: simulate, calibrate (--calibrate) or predict (--predict)."""
    return _run_main("slipstream sim", _sim_parser(), _sim, argv)


# -- plan ---------------------------------------------------------------------------------


def _plan_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="slipstream plan", description="Recommend the split, schedule and max lag for a run."
    )
    _common(p)
    p.add_argument(
        "--schedules", default=",".join(PRESETS), help="comma-separated presets to consider"
    )
    p.add_argument(
        "--lag-cap",
        type=int,
        default=8,
        help="largest max lag accepted: bounds and presets above it are not tried "
        "(double_buffer's is 1, sync's and tail_batching's 0)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=8,
        help="steps measured per candidate, after 2 + 2 x its max lag to reach its pace",
    )
    p.add_argument("--plot", default="plan.png", help="PNG to draw ('' for none)")
    p.add_argument(
        "--run-steps", type=int, default=1000, help="steps of the run whose duration to forecast"
    )
    p.add_argument(
        "--model-error",
        type=float,
        default=MODEL_ERROR,
        help="the simulator's relative error, widening the interval (default: as measured "
        "out of sample, bench/sim_calibration.py)",
    )
    return p


def _run_forecast(req: PlanRequest, r: Candidate, args: argparse.Namespace) -> Forecast:
    """The recommended configuration's duration for --run-steps steps, with its interval."""
    cluster = Cluster(req.hardware, req.model, req.n_gpus, r.sampler_gpus)
    w = steady_warmup(r.max_lag)  # (plan_forecast simulates past it)
    cfg = SimConfig(
        cluster, req.workload, preset(r.schedule, r.max_lag), min_steps(w), req.seed, warmup_steps=w
    )
    f = plan_forecast(cfg, args.run_steps, args.model_error)
    if req.failures is None:
        return f
    # the simulated steps hold no failure: the run's wall time is its work over the
    # long-run goodput of its recovery at MTTF = c / N (sim.failures), the factor the
    # planner discounts every candidate's throughput by (planner.with_failures)
    g = req.failures.goodput(req.n_gpus)
    return replace(f, remaining_s=f.remaining_s / g, lo_s=f.lo_s / g, hi_s=f.hi_s / g)


def _plan(args: argparse.Namespace) -> int:
    schedules = tuple(s for s in args.schedules.split(",") if s)
    if not schedules:
        raise ValueError(f"--schedules names no schedule: {args.schedules!r}")
    for s in schedules:
        preset(s)  # raises naming the valid presets
    if args.lag_cap < 0:
        raise ValueError(f"--lag-cap must be >= 0, got {args.lag_cap}")
    if args.run_steps < 1:
        raise ValueError(f"--run-steps must be >= 1, got {args.run_steps}")
    if not (math.isfinite(args.model_error) and args.model_error >= 0):
        # the interval is [lo / (1 + e), hi x (1 + e)]: -1 divided by zero, below 0 it shrank
        raise ValueError(f"--model-error must be a number >= 0, got {args.model_error}")
    check_counts(args, 1)  # steps measured after each candidate's warm-up
    if args.plot:
        check_plot_path(args.plot)
    cal = _calibration(args)
    req = PlanRequest(
        args.gpus,
        _hardware(args, cal),
        _model(args.model),
        _workload(args, cal),
        schedules=schedules,
        lag_cap=args.lag_cap,
        steps=args.steps,
        seed=args.seed,
        failures=_failures(args),
    )
    p = plan(req)
    if args.plot:
        plot_plan(p, args.plot)
    r = p.recommended
    assert r is not None
    f = _run_forecast(req, r, args)
    duration = {"expected_s": f.remaining_s, "lo_s": f.lo_s, "hi_s": f.hi_s}
    if args.json:
        rows = [
            {
                "schedule": c.schedule,
                "max_lag": c.max_lag,
                "sampler_gpus": c.sampler_gpus,
                "trainer_gpus": c.trainer_gpus,
                **c.metrics,
            }
            for c in p.best
        ]
        best = rows[p.best.index(r)]
        print(json.dumps({"recommended": best, "run_duration": duration, "candidates": rows}))
        return 0
    print(format_plan(p))
    where = (
        "colocated"
        if r.sampler_gpus is None
        else f"{r.sampler_gpus} sampler / {r.trainer_gpus} trainer GPUs"
    )
    print(
        f"\nrecommended: {r.schedule}, max lag {r.max_lag}, {where}: {r.throughput:,.0f} trained tokens/s"
    )
    print(
        f"a run of {args.run_steps} steps: {fmt_duration(f.remaining_s)} expected, 90 % interval "
        f"{fmt_duration(f.lo_s)} to {fmt_duration(f.hi_s)} (length draws, and the simulator's "
        f"{args.model_error:.0%} error measured out of sample"
        + (f"; failures from {args.failures}, {args.recovery} recovery)" if args.failures else ")")
    )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def plan_main(argv: list[str]) -> int:
    """`slipstream plan ...`: table and plot of the best configurations, and a recommendation."""
    return _run_main("slipstream plan", _plan_parser(), _plan, argv)
