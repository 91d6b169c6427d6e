"""The `slipstream` command: parse, build the config, call the run. Nothing imports this."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

# Before torch loads its OpenMP runtime (the imports below), which reads this once: waiting
# threads sleep instead of spinning. With spinning threads, a run whose cores are shared with
# any other busy process waits at every one of the thousands of small parallel regions of a
# step for a descheduled thread: measured here, 2 threads beside other jobs took 32-41 s a
# step of the built-in task, against 4.2 s sleeping and 5.0 s with one thread (README,
# "Threads"). A value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from slipstream.argv import OneLineParser
from slipstream.config import Config, ConfigError, load_config
from slipstream.tasks import TaskError

USAGE = """slipstream COMMAND ...

commands:
  train [CONFIG.toml|.yaml] [key=value ...]   train (no arguments: the built-in task on CPU)
  train --resume RUN_DIR [key=value ...]       continue a run from its newest checkpoint
  sim ...                                      simulate a cluster run (slipstream sim -h)
  plan ...                                     recommend a GPU split and schedule (slipstream plan -h)
  report RUN_DIR [RUN_DIR ...] --out DIR       figures and an HTML page from run folders
  replay RUN_DIR [key=value ...] [--out DIR]   re-execute a run recorded with run.record_schedule=true
  eval RUN_DIR [--step N] [key=value ...]      evaluate a checkpoint on the held-out split again
  bench schedules [--out DIR] ...              the schedules vs the best sync, over seeds
"""


COMMANDS = ("train", "sim", "plan", "report", "replay", "eval", "bench")


def _train(argv: list[str]) -> int:
    parser = OneLineParser(
        prog="slipstream train", description="Train with RL on verifiable rewards."
    )
    parser.add_argument(
        "items", nargs="*", help="an optional config file, then key=value overrides"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML or YAML config file (the same as giving it first among the items)",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint with RUN_DIR/config.toml (key=value overrides "
        "still apply, e.g. a larger run.steps)",
    )
    args = parser.parse_args(argv)
    path = None
    overrides = list(args.items)
    if args.config and (args.resume or (overrides and "=" not in overrides[0])):
        other = "--resume (its run's config.toml)" if args.resume else repr(overrides[0])
        raise ConfigError(f"--config {args.config}: one config file a run, and {other} is another")
    if args.resume:
        args.resume = _in_started_folder(Path(args.resume))
    if args.config:
        path = args.config
    elif args.resume:
        path = Path(args.resume) / "config.toml"
        if not path.exists():
            raise ConfigError(f"{args.resume}: no config.toml to resume from")
        overrides.append(f"run.dir={json.dumps(str(args.resume))}")
    elif overrides and "=" not in overrides[0]:
        path = overrides.pop(0)
    cfg = load_config(path, overrides)
    if args.resume:
        _warn_changed(args.resume, cfg)
    from slipstream.run.preflight import preflight

    # a missing model folder or library, a run.dir holding another run: one line, exit 2,
    # before any work
    preflight(cfg, resume=bool(args.resume))
    resume = bool(args.resume)  # checked, and what it changes said, above (`_warn_changed`)
    try:
        if cfg.runtime_kind == "inprocess":
            from slipstream.run.sync import train_sync

            train_sync(cfg, resume=resume, checked=True)
        else:  # every other schedule runs samplers and the trainer in separate processes
            from slipstream.run.launch import train_async

            train_async(cfg, resume=resume, checked=True)
    except ConfigError:
        raise
    except TaskError as e:  # a bad row, a reward failing under task.reward_errors = 'fail'
        hint = _resume_hint(cfg)
        if hint is None:  # nothing to resume from: main's one line
            raise
        print(f"{parser.prog}: error: {e}\nslipstream: {hint}", file=sys.stderr)
        return 2
    except BaseException as e:
        _where_to_resume(cfg, e)
        if isinstance(e, KeyboardInterrupt):
            raise
        return 1
    return 0


def _in_started_folder(run_dir: Path) -> str:
    """A resumed run works in the folder it was started in (run.folder.started_in), where its
    relative paths resolve; `run_dir` as an absolute path from there."""
    from slipstream.run.folder import started_in

    run_dir = run_dir.absolute()
    cwd = started_in(run_dir)
    if cwd is not None and cwd != Path.cwd():
        os.chdir(cwd)
        print(f"slipstream: resuming in {cwd}, where the run was started", file=sys.stderr)
    return str(run_dir)


def _warn_changed(run_dir: str, cfg: Config) -> None:
    """The checks of a resume (`run.resume.check_resume`, which the run then skips): one with
    settings other than the run's own (`run.resume.resume_changes`) goes on with them, but
    says so in one line: the run is then not the unbroken one."""
    from slipstream.run.resume import changed_settings_notice, resume_changes

    changed = resume_changes(Path(run_dir), cfg)
    if changed:
        notice = changed_settings_notice(Path(run_dir), cfg, changed)
        print(f"slipstream: warning: {notice}", file=sys.stderr)


def _where_to_resume(cfg: Config, e: BaseException) -> None:
    """The trainer stopped (an error, Ctrl-C): the traceback, then where to resume from."""
    if not isinstance(e, KeyboardInterrupt):
        traceback.print_exc()
    what = "interrupted" if isinstance(e, KeyboardInterrupt) else f"failed: {type(e).__name__}: {e}"
    hint = _resume_hint(cfg) or "no checkpoint was written yet (checkpoint.every); start again"
    print(f"slipstream: training {what}\nslipstream: {hint}", file=sys.stderr)


def _resume_hint(cfg: Config) -> str | None:
    """Where the run can go on from: its newest checkpoint and the command; None without one."""
    from slipstream.train.checkpoint import list_checkpoints

    run_dir = cfg.run.dir
    ckpts = list_checkpoints(run_dir) if run_dir else []
    if not ckpts:
        return None
    return f"newest checkpoint {ckpts[-1]}; continue with: slipstream train --resume {run_dir}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        if not argv:
            argv = ["train"]
        else:
            print(USAGE)
            return 0
    cmd, rest = argv[0], argv[1:]
    prog = _prog(cmd, rest)
    try:
        if cmd == "train":
            return _train(rest)
        if cmd == "sim":
            from slipstream.sim.cli import sim_main

            return sim_main(rest)
        if cmd == "bench":
            if not rest or rest[0] != "schedules":
                print(
                    f"{prog}: error: usage: slipstream bench schedules [options]", file=sys.stderr
                )
                return 2
            from slipstream.run.bench import bench_schedules_main

            return bench_schedules_main(rest[1:])
        if cmd == "report":
            from slipstream.observe.report import report_main

            return report_main(rest)
        if cmd == "replay":
            from slipstream.run.replay_run import replay_main

            return replay_main(rest)
        if cmd == "eval":
            from slipstream.run.eval_run import eval_main

            return eval_main(rest)
        if cmd == "plan":
            from slipstream.sim.cli import plan_main

            return plan_main(rest)
    except (ConfigError, TaskError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slipstream: interrupted", file=sys.stderr)
        return 130
    print(f"{prog}: error: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def _prog(cmd: str, rest: list[str]) -> str:
    """What an error of the command line `slipstream CMD REST` starts with: the subcommand as
    its usage names it (`slipstream train`, `slipstream bench schedules`), as argparse starts
    its usage errors (`argv.OneLineParser`), so that every error of one subcommand reads
    `slipstream CMD: error: ...`; `slipstream` alone for a command it does not know."""
    if cmd not in COMMANDS:
        return "slipstream"
    return (
        f"slipstream {cmd} schedules"
        if cmd == "bench" and rest[:1] == ["schedules"]
        else f"slipstream {cmd}"
    )


if __name__ == "__main__":
    sys.exit(main())
