"""The comparison of a replay with the run it replays (`slipstream replay`, run.replay_run):
every value of every step record but the wall-clock timings, which a replay measures itself
(`TIMINGS`), and the final checkpoint's tensors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from slipstream.engine.stats import PASS_TIMINGS

# Wall-clock measurements: a replay measures its own, so they are not compared
TIMINGS = (
    "wall_s",
    "step_time_s",
    "runtime/sampler_busy",
    "runtime/sampler_blocked",
    "runtime/trainer_wait",
    "runtime/weight_sync_s",
    "runtime/weight_publish_s",
    "weights/publish_s",
    "weights/pause_s",
    "time/generate_s",
    "time/train_s",
    "time/eval_s",  # held-out evaluation (observe.clock)
    "time/eval_start_s",
    "engine/tokens_per_s",
    "train/tokens_per_s",
    *(f"engine/{k}" for k in PASS_TIMINGS),
    # the run's forecast of its own duration (sim.forecast), fitted to the timings above
    "forecast/remaining_s",
    "forecast/remaining_lo_s",
    "forecast/remaining_hi_s",
    "forecast/end_s",
)


def compare(original: Path, replayed: Path) -> dict[str, Any]:
    """Every step record's values but `TIMINGS`, and the final checkpoint's tensors."""
    from slipstream.run.summary import read_records

    a, b = read_records(original / "metrics.jsonl"), read_records(replayed / "metrics.jsonl")
    diffs: list[tuple[int, str, Any, Any]] = []
    compared: set[str] = set()
    for ra, rb in zip(a, b):
        for k in sorted((ra.keys() | rb.keys()) - set(TIMINGS)):
            compared.add(k)
            x, y = ra.get(k), rb.get(k)
            if x != y and not (
                isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
            ):
                diffs.append((int(rb.get("step", -1)), k, x, y))
    steps = min(len(a), len(b))
    return {
        "steps_compared": steps,
        "metrics_compared": sorted(compared),
        "timings_not_compared": list(TIMINGS),
        "metric_differences": len(diffs),
        "first_differences": [list(d) for d in diffs[:5]],
        **_weights_equal(original, replayed),
    }


def _weights_equal(original: Path, replayed: Path) -> dict[str, Any]:
    """`weights_equal`: the replay's final checkpoint and the original's of the same name hold
    equal tensors (torch.equal); None if one is missing, and then `weights_not_compared` says
    which. Named by the version count, which a rollback moves on by one (but at the last step):
    one at the step before the last ends the run past the step of its last record."""
    from safetensors.torch import load_file

    from slipstream.train.checkpoint import list_checkpoints

    ckpts = list_checkpoints(replayed)
    if not ckpts:
        return {"weights_equal": None, "weights_not_compared": "the replay kept no checkpoint"}
    name = ckpts[-1].name

    def tensors(run: Path) -> dict[str, torch.Tensor] | None:
        model = run / "checkpoints" / name / "model"
        master = model.parent / "master.safetensors"
        path = master if master.exists() else model / "model.safetensors"
        return load_file(path) if path.exists() else None

    x, y = tensors(original), tensors(replayed)
    if x is None or y is None:
        whose = "the original run" if x is None else "the replay"
        why = f"{whose} kept no checkpoint {name} (checkpoint.keep, checkpoint.every)"
        return {"weights_equal": None, "weights_not_compared": why}
    return {"weights_equal": x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)}
