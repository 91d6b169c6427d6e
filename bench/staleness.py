"""Staleness and its correction on the built-in task: forced lag K x proximal policy x seeds.

Every run is the `pipeline` schedule with `schedule.min_lag = schedule.max_lag = K` and
`lag_policy = "drop"`, so from step K on every step trains the groups issued K versions
earlier (their tokens are at most K versions old, younger where the sampler had loaded newer
weights before generating them: the table's token lag says how old they were); the
trainer's proximal policy is `none` (ratios against the stale sampler, plain PPO), `recompute`
(AReaL's decoupled PPO) or `loglinear` (its version interpolation). Same budget for all: the
same steps, batch and seeds; runs are interleaved (seed, then K, then mode) so that a change
in the machine's load hits every configuration alike.

Reported per (K, mode): final held-out accuracy (mean and range over seeds), and means over
steps of the token ESS, `mismatch/kl`, the clip fraction, the correction's masked fraction,
and the trainer's time per step. A PNG plots accuracy against K for each mode.

Run: python bench/staleness.py [--lags 0,2,4,8] [--modes none,recompute,loglinear]
     [--seeds 0,1,2] [--steps 60] [--out bench_out/staleness] [key=value ...]
The last line is one JSON object: `acc_by_lag` (per mode, mean over seeds, by K),
`acc_range_by_lag`, `loglinear_step_time_ratio` (loglinear / recompute trainer time per step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.files import read_jsonl, write_atomic
from slipstream.observe.means import lag_tokens, weighted_mean

if TYPE_CHECKING:
    from slipstream.config import Config

METRICS = {
    "ess": "staleness/ess_token",
    "kl": "mismatch/kl",
    "clip": "train/clip_frac",
    "masked": "correction/masked_frac",
    "train_s": "time/train_s",
}


def run_config(k: int, mode: str, seed: int, steps: int, out: Path, extra: list[str]) -> Config:
    """The config of one run, trained into `out`/k{k}_{mode}_s{seed}."""
    from slipstream.config import load_config

    run_dir = out / f"k{k}_{mode}_s{seed}"
    return load_config(
        None,
        [
            f"run.steps={steps}",
            f"run.seed={seed}",
            f"eval.every={steps}",
            'schedule.name="pipeline"',
            f"schedule.max_lag={k}",
            f"schedule.min_lag={k}",
            'schedule.lag_policy="drop"',
            f'trainer.proximal="{mode}"',
            'runtime.kind="local"',
            "run.quiet=true",
            *extra,
            f'run.dir="{run_dir}"',
        ],
    )


def run_one(
    k: int, mode: str, seed: int, steps: int, out: Path, extra: list[str], resume: bool = False
) -> dict:
    """One training run; its final accuracy and step means of `METRICS`. With `resume`, a
    finished run of the same config in its folder is read back instead, never one matched by
    its K, mode and seed alone (run.bench.read_back_or_train)."""
    from slipstream.run.bench import read_back_or_train

    cfg = run_config(k, mode, seed, steps, out, extra)
    run_dir = Path(str(cfg.run.dir))
    summary = read_back_or_train(cfg, resume, "--resume")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    rows = [r for r in rows if "train/loss" in r]
    means = {
        name: statistics.fmean(r[key] for r in rows if key in r) if rows else float("nan")
        for name, key in METRICS.items()
    }
    # over the tokens those steps trained (each step's lag_mean is over its lag_hist counts),
    # not a plain mean of the steps' means
    lag = weighted_mean(
        [(r["staleness/lag_mean"], lag_tokens(r)) for r in rows[k:] if "staleness/lag_mean" in r]
    )
    return {
        "acc": summary["heldout_acc_end"],
        "acc_start": summary["heldout_acc_start"],
        "lag_mean_after_k": float("nan") if lag is None else lag,
        "stale": summary["ledger"]["stale"],
        "wall_s": summary["wall_s"],
        **means,
    }


def _cell(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def table(res: dict[tuple[int, str], list[dict]]) -> str:
    head = (
        "| K | proximal | final acc: mean (range) | token lag mean after step K | ESS token | mismatch/kl "
        "| clip frac | masked frac | train s/step | stale groups |"
    )
    lines = [head, "|" + " --- |" * 10]
    for (k, mode), runs in sorted(res.items()):
        m = {key: statistics.fmean(r[key] for r in runs) for key in runs[0] if key != "acc"}
        lines.append(
            f"| {k} | {mode} | {_cell([r['acc'] for r in runs])} | {m['lag_mean_after_k']:.2f} "
            f"| {m['ess']:.3f} | {m['kl']:.4f} | {m['clip']:.3f} | {m['masked']:.3f} "
            f"| {m['train_s']:.3f} | {m['stale']:.0f} |"
        )
    return "\n".join(lines)


def plot(res: dict[tuple[int, str], list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in sorted({m for _, m in res}):
        ks = sorted(k for k, m in res if m == mode)
        accs = [[r["acc"] for r in res[(k, mode)]] for k in ks]
        mean = [statistics.fmean(a) for a in accs]
        ax.errorbar(
            ks,
            mean,
            yerr=[
                [m - min(a) for m, a in zip(mean, accs)],
                [max(a) - m for m, a in zip(mean, accs)],
            ],
            marker="o",
            capsize=3,
            label=mode,
        )
    ax.set_xlabel("forced lag K (versions)")
    ax.set_ylabel("final held-out accuracy (mean, range over seeds)")
    ax.set_title("built-in task: staleness and the proximal policy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lags", default="0,2,4,8")
    ap.add_argument("--modes", default="none,recompute,loglinear")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="bench_out/staleness")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="read back the finished runs of the same config in OUT instead of training them; "
        "an unfinished one of the same settings is trained again, one of other settings refused",
    )
    args, extra = ap.parse_known_args(argv)
    lags = [int(x) for x in args.lags.split(",")]
    modes = args.modes.split(",")
    seeds = [int(x) for x in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for seed in seeds:
        for k in lags:
            for mode in modes:
                r = {**run_one(k, mode, seed, args.steps, out, extra, args.resume), "seed": seed}
                res.setdefault((k, mode), []).append(r)
                print(
                    f"staleness: K={k} {mode} seed={seed}: acc {r['acc']:.3f} "
                    f"(start {r['acc_start']:.3f}), {r['wall_s']:.0f}s",
                    flush=True,
                )
                done = {f"{k}/{m}": v for (k, m), v in res.items()}
                write_atomic(out / "results.json", json.dumps(done, indent=1))
    print(table(res))
    plot(res, out / "staleness.png")
    print(f"plot: {out / 'staleness.png'}")
    acc = {
        mode: {str(k): statistics.fmean(r["acc"] for r in res[(k, mode)]) for k in lags}
        for mode in modes
    }
    rng = {
        mode: {
            str(k): [min(r["acc"] for r in res[(k, mode)]), max(r["acc"] for r in res[(k, mode)])]
            for k in lags
        }
        for mode in modes
    }
    ratio = None
    if "loglinear" in modes and "recompute" in modes:
        t = {m: statistics.median(r["train_s"] for k in lags for r in res[(k, m)]) for m in modes}
        ratio = t["loglinear"] / t["recompute"]
    print(
        json.dumps(
            {
                "acc_by_lag": acc,
                "acc_range_by_lag": rng,
                "loglinear_step_time_ratio": ratio,
                "steps": args.steps,
                "seeds": seeds,
            }
        )
    )
    return 0


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
