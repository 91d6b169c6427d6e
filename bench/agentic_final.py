"""Final accuracy of bench/agentic.py's runs, evaluated again with more samples, paired by seed.

bench/agentic.py judges a run's final accuracy by its last in-run evaluation (256 held-out
prompts x 4 samples, `eval.samples_per_prompt` of the bench's command), whose sampling noise
alone puts a 90 % half-width of 1.2-1.7 points on the gap between a pipeline run and its seed's
sync run (computed, docs/measurements.md), close to the 2 points issue 21 allows. This script
evaluates each run's final checkpoint again with `slipstream eval` at `--samples` (default 32)
samples a prompt (same prompts, temperature and
episode seeds as the runs' own evaluations: the pairs share their random numbers), and
reports, seed by seed, the pipeline's gap to sync with two 90 % half-widths: over prompts (the
paired standard error, bench/agentic_paired.py: other prompts of the kind, and the samples'
noise) and over samples alone (this held-out set's figure). Neither is the spread between
training runs of one seed, which only more runs measure.

Checkpoints with equal weights (bench/agentic.py --reuse copies sync's runs into a new folder)
are evaluated once. A result already in RUN_DIR/evals/final-n{samples}.json is read back.

Run: python bench/agentic_final.py BENCH_DIR [BENCH_DIR ...] [--samples 32] [--compare pipeline]
Ends with one JSON line: `final_acc_gap_by_seed` ({bench_dir/seed: gap}), `final_acc_gap_mean`
and `final_acc_gap_median` (over the pairs), `final_acc` ({run: accuracy}).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from agentic_paired import paired

Z90 = 1.645  # a two-sided 90 % interval of a normal mean
NAME = re.compile(r"tail(?P<tail>[0-9.]+)-seed(?P<seed>\d+)-(?P<schedule>\w+)$")


def final_checkpoint(run_dir: Path) -> Path:
    """The newest step_NNNNNN checkpoint folder of a run."""
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit())
    if not ckpts:
        raise SystemExit(f"{run_dir}: no checkpoint")
    return ckpts[-1]


def weights_hash(ckpt: Path) -> str:
    digest = hashlib.sha256()
    for name in ("model/model.safetensors", "master.safetensors"):
        path = ckpt / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def evaluate(run_dir: Path, samples: int, done: dict[str, Path]) -> dict[str, object]:
    """The run's final checkpoint evaluated at `samples` a prompt (read back where it was)."""
    out = run_dir / "evals" / f"final-n{samples}.json"
    if not out.exists():
        key = weights_hash(final_checkpoint(run_dir))
        if key in done:  # the same weights in another folder
            out.parent.mkdir(exist_ok=True)
            shutil.copyfile(done[key], out)
        else:
            cmd = [
                sys.executable, "-m", "slipstream.cli", "eval", str(run_dir),
                f"eval.samples_per_prompt={samples}", "--out", str(out),
            ]  # fmt: skip
            print(" ".join(cmd[2:]), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
        done[key] = out
    else:
        done.setdefault(weights_hash(final_checkpoint(run_dir)), out)
    return json.loads(out.read_text())


def per_prompt(result: dict[str, object]) -> dict[str, list[float]]:
    """The rewards of each held-out prompt, by prompt id."""
    rewards = result["rewards"]
    assert isinstance(rewards, dict)
    return dict(rewards[""])


def paired_gap(a: dict[str, list[float]], b: dict[str, list[float]]) -> tuple[float, float, float]:
    """Mean over prompts of b - a (each prompt's mean reward), and the half-widths of its 90 %
    interval: over prompts (1.645 paired standard errors: other prompts of the same kind, and
    the samples' noise) and over samples alone (computed: 1.645 x sqrt(sum over prompts of
    each run's sample variance / n) / P, the noise of this fixed held-out set's figure)."""
    if sorted(b) != sorted(a):
        raise SystemExit("the two runs were evaluated on different prompts")
    ids = sorted(a)
    out = paired([statistics.fmean(a[i]) for i in ids], [statistics.fmean(b[i]) for i in ids])
    var = sum(_var(a[i]) / len(a[i]) + _var(b[i]) / len(b[i]) for i in ids)
    return out["diff"], Z90 * out["paired_se"], Z90 * var**0.5 / len(ids)


def _var(x: list[float]) -> float:
    """Sample variance (n - 1; 0 for one sample, a greedy evaluation)."""
    return statistics.variance(x) if len(x) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="bench/agentic.py --out folders")
    ap.add_argument("--samples", type=int, default=32, help="samples a held-out prompt")
    ap.add_argument("--compare", default="pipeline", help="the schedule compared with sync")
    args = ap.parse_args()
    done: dict[str, Path] = {}
    gaps: dict[str, float] = {}
    accs: dict[str, float] = {}
    rows = []
    for folder in args.dirs:
        runs: dict[tuple[str, int], dict[str, Path]] = {}
        for d in sorted(folder.iterdir()):
            m = NAME.match(d.name)
            if m and d.is_dir():
                runs.setdefault((m["tail"], int(m["seed"])), {})[m["schedule"]] = d
        for (tail, seed), by in sorted(runs.items()):
            if "sync" not in by or args.compare not in by:
                continue
            res = {s: evaluate(by[s], args.samples, done) for s in ("sync", args.compare)}
            for s, r in res.items():
                acc = r["heldout_acc"]
                assert isinstance(acc, float)
                accs[f"{folder.name}/{tail}/{seed}/{s}"] = acc
            gap, prompts, samples = paired_gap(
                per_prompt(res["sync"]), per_prompt(res[args.compare])
            )
            key = f"{folder.name}/tail{tail}/seed{seed}"
            gaps[key] = gap
            a, b = res["sync"]["heldout_acc"], res[args.compare]["heldout_acc"]
            rows.append((key, a, b, gap, prompts, samples))
    if not rows:
        raise SystemExit("no seed with both a sync and a compared run in these folders")
    print(f"\nfinal accuracy at {args.samples} samples x held-out prompt, {args.compare} - sync")
    print("(points; 90 % half-widths over prompts, and over samples alone, computed)")
    print(
        f"{'run':40s} {'sync':>7s} {args.compare:>9s} {'gap':>7s} {'prompts':>8s} {'samples':>8s}"
    )
    for key, a, b, gap, prompts, samples in rows:
        print(
            f"{key:40s} {a:7.4f} {b:9.4f} {100 * gap:+7.2f} {100 * prompts:8.2f} "
            f"{100 * samples:8.2f}"
        )
    mean = statistics.fmean(gaps.values())
    median = statistics.median(gaps.values())
    print(f"over {len(gaps)} pairs: mean gap {100 * mean:+.2f}, median {100 * median:+.2f} points")
    out = {
        "final_acc_gap_by_seed": gaps,
        "final_acc_gap_mean": mean,
        "final_acc_gap_median": median,
        "final_acc": accs,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
