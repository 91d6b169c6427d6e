"""`slipstream eval RUN_DIR`: evaluate a checkpoint of a run on its held-out split, afterwards.

A run evaluates itself every `eval.every` steps with its own `[eval]` settings, chosen to be
cheap enough to repeat (the built-in agentic bench: 256 prompts x 4 samples, docs/measurements.md
"Final accuracy at 32 samples a prompt"). Comparing two runs' final accuracies to a point needs
more samples than that; this command
evaluates a saved checkpoint again with more (`eval.samples_per_prompt=32`), in the run's own
config: the same task, held-out prompts, tool environment, sampling settings and engine as the
run's evaluations (its relative paths resolved in the folder it was started in, as on resume),
the checkpoint's weights (its float32 master copy where it has one). The
episodes' seeds are those of every evaluation (`i n + j` for sample j of prompt i), so two
checkpoints evaluated with the same settings are compared on the same random numbers.

Only settings of the evaluation itself may change (`CHANGEABLE`); the run's folder is read,
never written but for the result, `RUN_DIR/evals/step_NNNNNN.json` (`-2`, `-3`... beside an
earlier one, so nothing is lost) or `--out FILE`: the metrics (`heldout/mean@n`, `pass@1`,
`pass@n`) and the rewards of every prompt, by prompt id, for paired comparisons.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from slipstream.config import Config, ConfigError, load_config
from slipstream.files import write_atomic
from slipstream.run.folder import started_in
from slipstream.train.checkpoint import checkpoint_step, list_checkpoints, load_weights

# Settings an evaluation may change: what it samples and where it runs, not what was trained
CHANGEABLE = ("eval.", "run.threads", "env.workers", "trainer.device")


def eval_config(run_dir: Path, overrides: list[str], scratch: Path) -> Config:
    """The run's config with `overrides` (each checked against `CHANGEABLE`), built in the
    folder `scratch` (what setting a run up writes goes there, not into `run_dir`)."""
    path = run_dir / "config.toml"
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run folder (no config.toml)")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not any(key.startswith(c) for c in CHANGEABLE):
            allowed = ", ".join(c + "*" if c.endswith(".") else c for c in CHANGEABLE)
            raise ConfigError(f"{item!r}: an evaluation changes only {allowed} (KEY=VALUE)")
    mine = [f"run.dir={json.dumps(str(scratch))}", "run.sinks=[]", "run.quiet=true"]
    return load_config(path, [*overrides, *mine])


def pick_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint of `step` (None: the newest); ConfigError naming those there are."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise ConfigError(f"{run_dir}: no checkpoint to evaluate (checkpoint.every)")
    if step is None:
        return ckpts[-1]
    for c in ckpts:
        if checkpoint_step(c) == step:
            return c
    have = ", ".join(str(checkpoint_step(c)) for c in ckpts)
    raise ConfigError(f"{run_dir}: no checkpoint of step {step} (there are: {have})")


def out_path(run_dir: Path, step: int) -> Path:
    """`RUN_DIR/evals/step_NNNNNN.json`, or `-2`, `-3`... where one is already there."""
    folder = run_dir / "evals"
    path, n = folder / f"step_{step:06d}.json", 1
    while path.exists():
        n += 1
        path = folder / f"step_{step:06d}-{n}.json"
    return path


def evaluate_checkpoint(
    run_dir: Path, overrides: list[str], step: int | None = None
) -> dict[str, object]:
    """Evaluate one checkpoint of `run_dir` (module docstring); the result's dict."""
    from slipstream.run.setup import setup

    ckpt = pick_checkpoint(run_dir, step)
    with tempfile.TemporaryDirectory(prefix="slipstream-eval-") as scratch:
        cfg = eval_config(run_dir, overrides, Path(scratch))
        run = setup(cfg)
        try:
            load_weights(run.model, ckpt / "model")
            version = checkpoint_step(ckpt)
            run.engine.version = run.eval_engine.version = version
            t0 = time.perf_counter()
            acc = run.evaluate(version)
            took = time.perf_counter() - t0
        finally:
            run.close_workers()
            run.close_observers()
    e = cfg.eval
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(ckpt),
        "step": version,
        "eval": {
            "num_prompts": e.num_prompts,
            "samples_per_prompt": e.samples_per_prompt,
            "temperature": e.temperature,
            "pass_threshold": e.pass_threshold,
        },
        "heldout_acc": acc,
        "metrics": run.eval_metrics,
        "eval_s": took,
        "rewards": run.eval_rewards,  # (prompt id, [n]) pairs: JSON arrays
    }


def eval_main(argv: list[str]) -> int:
    """`slipstream eval RUN_DIR [--step N] [--out FILE] [key=value ...]`."""
    from slipstream.argv import OneLineParser

    parser = OneLineParser(
        prog="slipstream eval",
        description="Evaluate a checkpoint of a run on its held-out split again.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder")
    parser.add_argument(
        "items",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="evaluation settings (eval.samples_per_prompt=32, eval.temperature=..., run.threads)",
    )
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    parser.add_argument("--out", metavar="FILE", help="the result (RUN_DIR/evals/step_NNNNNN.json)")
    args = parser.parse_args(argv)
    given = Path(args.run_dir)
    out_given = Path(args.out).absolute() if args.out else None
    run_dir = given.absolute()
    # the run's relative paths (model.path, task.path) resolve where it was started, as on resume
    cwd = started_in(run_dir)
    if cwd is not None and cwd != Path.cwd():
        os.chdir(cwd)
    result = evaluate_checkpoint(run_dir, list(args.items), args.step)
    step = result["step"]
    assert isinstance(step, int)
    out = out_given or out_path(run_dir, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result))
    metrics = result["metrics"]
    assert isinstance(metrics, dict)
    shown = ", ".join(f"{k.removeprefix('heldout/')} {v:.4f}" for k, v in metrics.items())
    print(f"step {step} of {given}: {shown} ({result['eval_s']:.1f}s) -> {out}")
    return 0
