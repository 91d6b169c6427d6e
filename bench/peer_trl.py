"""slipstream against TRL's `GRPOTrainer`, side by side, on TRL's kind of small-model harness.

Run:
    python bench/peer_trl.py --setup          # once: TRL into OUT/trl-venv (python3 -m venv;
                                              # torch==2.13.0 first, the CPU wheel; then trl)
    python bench/peer_trl.py [--seeds 0 1 2] [--steps 300] [--snapshot 30] [--threads 1]

trl is never a dependency of slipstream or of its CI: it lives in its own virtual environment,
and TRL's side runs there as a subprocess (bench/peer_trl_worker.py); slipstream's side runs as
`python -m slipstream.cli train` with this interpreter. The harness (bench/peer_harness.py) is
built once under OUT/harness: a character tokenizer whose post-processor prepends `<bos>`, a
`LlamaForCausalLM` of hidden 128, 4 layers, 4 heads, MLP 512, untied (1.05M parameters),
warm-started by a plain supervised loop to `--warm-acc` held-out accuracy, and "A+B=" addition
rows. Both systems train from that folder on the same rows, seeds interleaved (slipstream, TRL,
slipstream, TRL, ...), with the same settings:

| | TRL `GRPOConfig` | slipstream |
| --- | --- | --- |
| batch | 8 prompts x 8 completions (`per_device_train_batch_size=64`, `num_generations=8`) | `trainer.batch_prompts=8 sampling.group_size=8` |
| length | `max_completion_length=8` | `sampling.max_new_tokens=8` |
| sampling | temperature 1.0, top-p 1, top-k 0 (its defaults) | the same |
| optimizer | AdamW lr 5e-5 constant, no warm-up, betas (0.9, 0.999), eps 1e-8, no decay, clip 1.0 | `trainer.lr=5e-5 lr_schedule=constant warmup_steps=0 betas=[0.9,0.999] grad_clip=1.0` |
| loss | `loss_type="dapo"` (token mean over the batch), clip 0.2, `beta=0`, `num_iterations=1` | `loss=ppo agg=token-mean` (clip 0.2), no KL, one update a step |
| advantages | `scale_rewards="group"`: (r - mean) / (std + 1e-4) | `advantage=grpo`: (r - mean) / (std + 1e-6), std with ddof 1 both |
| filters | none (zero-variance groups train with advantage 0) | `filters.zero_variance=false` |
| precision | fp32, `bf16=False`, `gradient_checkpointing=False`, CPU | float32, CPU |
| threads | `torch.set_num_threads(--threads)` | `run.threads=--threads` |

Timing: steady seconds per step is the mean wall time between the ends of consecutive steps
from step 2 on, leaving out the step after a snapshot (a model save, on both sides; slipstream
checkpoints every `--snapshot` steps, and each step after one is left out) and, for
slipstream, its last step (its loop evaluates the held-out set there). For TRL the ends of
steps are taken by a `TrainerCallback` (`on_step_end`), for slipstream from the `wall_s` of
each metrics.jsonl record (written at the end of each step): both include everything either
loop does per step (generation, scoring, training, its logging). Completions per second are
64 / (seconds per step). Held-out accuracy: greedy, 8 new tokens, on the 500 held-out rows,
scored by one evaluator (`transformers` generate, bench/peer_harness.py) for the starting
model and both systems' snapshots at `--snapshot` and `--steps` steps.

The last line is one JSON object: `slipstream_s_per_step`, `trl_s_per_step`, `speedup`,
`heldout_gain_slipstream`, `heldout_gain_trl` (means over seeds, each with `_range`), and the
same figures over the first `--snapshot` steps (`_30` suffixes for the default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_harness as harness
from slipstream.files import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "peer_trl_worker.py"


def setup_venv(venv: Path) -> None:
    """TRL in its own virtual environment; torch==2.13.0 first (the CPU wheel), then trl."""
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [sys.executable.replace("python", "python3"), "-m", "venv", str(venv)], check=False
        )
        if not (venv / "bin" / "python").exists():
            subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "trl", "transformers"], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import trl; print('trl', trl.__version__)"],
        check=True,
    )


def build(out: Path, warm_acc: float) -> tuple[Path, Path, Path, dict]:
    """The harness folder (cached: rebuilt only when the warm-start target changed)."""
    model = out / "harness" / "model"
    train, held = harness.write_data(out / "harness")
    info_file = model / "warmstart.json"
    if info_file.exists() and json.loads(info_file.read_text()).get("target") == warm_acc:
        return model, train, held, json.loads(info_file.read_text())
    print(f"building the harness model (warm start to held-out {warm_acc})...")
    return model, train, held, harness.warm_start(model, warm_acc)


def slipstream_cmd(model: Path, train: Path, held: Path, run: Path, a, seed: int) -> list[str]:
    sets = [
        f"model.path={model}",
        f"task.path={train}",
        f"task.heldout_path={held}",
        "task.reward=exact",
        f"run.dir={run}",
        f"run.seed={seed}",
        f"run.steps={a.steps}",
        f"run.threads={a.threads}",
        "run.quiet=true",
        "trainer.batch_prompts=8",
        "sampling.group_size=8",
        "sampling.max_new_tokens=8",
        "sampling.temperature=1.0",
        "trainer.lr=5e-5",
        "trainer.lr_schedule=constant",
        "trainer.warmup_steps=0",
        "trainer.betas=[0.9,0.999]",
        "trainer.loss=ppo",
        "trainer.agg=token-mean",
        "trainer.advantage=grpo",
        "trainer.micro_batch_size=64",
        "filters.zero_variance=false",
        f"eval.every={a.steps}",
        f"eval.num_prompts={harness.HELDOUT}",
        f"checkpoint.every={a.snapshot}",
        "checkpoint.keep=1000",
    ]
    return [sys.executable, "-m", "slipstream.cli", "train", *sets]


def steady(ends: list[float], skip: set[int], upto: int) -> float:
    """Mean of `ends[k] - ends[k - 1]` (step k + 1's time) for steps 2..upto not in `skip`."""
    gaps = [ends[k] - ends[k - 1] for k in range(1, upto) if k + 1 not in skip]
    return statistics.fmean(gaps)


def run_slipstream(model, train, held, out: Path, a, seed: int) -> dict:
    run = out / f"slipstream_s{seed}"
    cmd = slipstream_cmd(model, train, held, run, a, seed)
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    t0 = time.perf_counter()
    with (out / f"slipstream_s{seed}.log").open("w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    recs = read_jsonl(run / "metrics.jsonl")
    ends = [r["wall_s"] for r in recs if "wall_s" in r and "step" in r]
    assert len(ends) == a.steps, (len(ends), a.steps)
    summary = json.loads((run / "summary.json").read_text())
    folder = lambda s: run / "checkpoints" / f"step_{s:06d}" / "model"  # noqa: E731
    mid = [r for r in recs if 2 <= r["step"] < a.steps and r["step"] != a.snapshot + 1]
    split = {k: statistics.fmean(r[k] for r in mid) for k in ("time/generate_s", "time/train_s")}
    return {
        "ends": ends,
        "split": split,
        "wall_s": wall,
        "own_heldout_start": summary["heldout_acc_start"],
        "folders": {s: folder(s) for s in (a.snapshot, a.steps)},
        # checkpoints every `snapshot` steps (the step after each holds one) and the final
        # evaluation (in the last step)
        "skip": {k + 1 for k in range(a.snapshot, a.steps, a.snapshot)} | {a.steps},
    }


def run_trl(model, train, out: Path, a, seed: int, venv: Path) -> dict:
    run = out / f"trl_s{seed}"
    cmd = [str(venv / "bin" / "python"), str(WORKER), str(model), str(train), str(run)]
    cmd += ["--seed", str(seed), "--steps", str(a.steps), "--threads", str(a.threads)]
    cmd += ["--save-at", str(a.snapshot), str(a.steps)]
    t0 = time.perf_counter()
    run.mkdir(parents=True, exist_ok=True)
    with (out / f"trl_s{seed}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    info = json.loads((run / "trl.json").read_text())
    assert len(info["step_end_s"]) == a.steps
    return {
        "ends": info["step_end_s"],
        "wall_s": wall,
        "info": info,
        "folders": {s: run / f"step_{s:06d}" for s in (a.snapshot, a.steps)},
        "skip": {a.snapshot + 1},
    }


def cell(xs: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.fmean(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "peer_trl"))
    ap.add_argument("--venv", default=str(ROOT / "bench_out" / "trl-venv"))
    ap.add_argument("--setup", action="store_true", help="install trl into --venv, then exit")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--snapshot", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm-acc", type=float, default=0.5)
    ap.add_argument("--model", help="an existing model folder instead of the harness's (a check)")
    a = ap.parse_args(argv)
    out, venv = Path(a.out), Path(a.venv)
    if a.setup:
        setup_venv(venv)
        return 0
    if not (venv / "bin" / "python").exists():
        print(f"no TRL environment at {venv}: run python bench/peer_trl.py --setup first")
        return 2
    import torch

    torch.set_num_threads(a.threads)
    out.mkdir(parents=True, exist_ok=True)
    model, train, held, warm = (
        build(out, a.warm_acc)
        if a.model is None
        else (Path(a.model), *harness.write_data(out), {"model": a.model})
    )
    held_rows = read_jsonl(held)
    acc0 = harness.evaluate_folder(model, held_rows)
    print(f"harness: {warm}; held-out greedy accuracy (transformers) {acc0:.3f}")
    res: dict[str, list[dict]] = {"slipstream": [], "trl": []}
    for i, seed in enumerate(a.seeds):
        order = ["slipstream", "trl"] if i % 2 == 0 else ["trl", "slipstream"]
        for name in order:
            r = (
                run_slipstream(model, train, held, out, a, seed)
                if name == "slipstream"
                else run_trl(model, train, out, a, seed, venv)
            )
            r["acc"] = {s: harness.evaluate_folder(f, held_rows) for s, f in r["folders"].items()}
            r["s_per_step"] = {n: steady(r["ends"], r["skip"], n) for n in (a.snapshot, a.steps)}
            res[name].append(r)
            keep = {k: v for k, v in r.items() if k not in ("folders", "skip", "info")}
            with (out / "results.jsonl").open("a") as f:
                f.write(json.dumps({"name": name, "seed": seed, **keep}) + "\n")
            print(
                f"   seed {seed} {name:10s} {r['s_per_step'][a.steps]:.4f} s/step, held-out "
                f"{acc0:.3f} -> {r['acc'][a.snapshot]:.3f} ({a.snapshot}) -> "
                f"{r['acc'][a.steps]:.3f} ({a.steps}); wall {r['wall_s']:.1f} s"
            )
    return report(res, a, acc0, warm)


def report(res: dict[str, list[dict]], a, acc0: float, warm: dict) -> int:
    S, N = a.snapshot, a.steps
    trl_info = res["trl"][0]["info"]
    print()
    print(
        f"slipstream vs TRL {trl_info['versions']['trl']} GRPOTrainer: 8 prompts x 8 completions, "
        f"<= 8 new tokens, {len(a.seeds)} seeds (mean, range), {a.threads} CPU thread(s); "
        f"start held-out {acc0:.3f}"
    )
    print(f"{'':12s}{'steps':>6s}{'s/step':>24s}{'completions/s':>24s}{'held-out after':>24s}")
    summary: dict[str, float | list[float]] = {}
    for n in (S, N):
        for name in ("slipstream", "trl"):
            rs = res[name]
            sps = [r["s_per_step"][n] for r in rs]
            gains = [r["acc"][n] - acc0 for r in rs]
            accs = [r["acc"][n] for r in rs]
            print(
                f"{name:12s}{n:6d}{cell(sps, '{:.4f}'):>24s}"
                f"{cell([64 / x for x in sps], '{:.0f}'):>24s}{cell(accs):>24s}"
            )
            sfx = "" if n == N else f"_{n}"
            summary[f"{name}_s_per_step{sfx}"] = statistics.fmean(sps)
            summary[f"{name}_s_per_step{sfx}_range"] = [min(sps), max(sps)]
            summary[f"heldout_gain_{name}{sfx}"] = statistics.fmean(gains)
            summary[f"heldout_gain_{name}{sfx}_range"] = [min(gains), max(gains)]
        ratios = [
            t["s_per_step"][n] / s["s_per_step"][n] for s, t in zip(res["slipstream"], res["trl"])
        ]
        sfx = "" if n == N else f"_{n}"
        # the mean of the seed pairs' ratios, as the table prints it beside their range (the
        # ratio of the mean step times is another figure, between the same bounds)
        summary[f"speedup{sfx}"] = statistics.fmean(ratios)
        summary[f"speedup{sfx}_range"] = [min(ratios), max(ratios)]
        print(f"{'speedup':12s}{n:6d}{cell(ratios, '{:.2f}x'):>24s}  (per seed pair)")
    gen = [r["split"]["time/generate_s"] for r in res["slipstream"]]
    trn = [r["split"]["time/train_s"] for r in res["slipstream"]]
    tot = [r["s_per_step"][N] for r in res["slipstream"]]
    print(
        f"slipstream's step: generate {cell(gen, '{:.4f}')} s, train {cell(trn, '{:.4f}')} s, "
        f"the rest (scoring, records, logging) "
        f"{cell([t - g - x for t, g, x in zip(tot, gen, trn)], '{:.4f}')} s"
    )
    summary["slipstream_generate_s"] = statistics.fmean(gen)
    summary["slipstream_train_s"] = statistics.fmean(trn)
    own = [r["own_heldout_start"] for r in res["slipstream"]]
    print(
        f"slipstream's own held-out accuracy at start: {own[0]:.3f} (the evaluator above: "
        f"{acc0:.3f}; no prompt_template: the <bos> comes from the tokenizer's post-processor)"
    )
    print(f"TRL settings: {json.dumps(trl_info['settings'])}")
    summary.update(
        heldout_start=acc0,
        seeds=a.seeds,
        steps=N,
        snapshot=S,
        threads=a.threads,
        trl_version=trl_info["versions"]["trl"],
        warm_start=warm,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
