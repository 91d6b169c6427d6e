"""A few rollouts of every step as readable text, to see what the model actually writes.

`run_dir/rollouts.txt` grows by one block per step:

    ##### step 12 #####
    --- group 3/16 (prompt p123) · sample 2/8 ---
    reward 1.000 · advantage +0.875 · finish stop · 14 tokens · sampler 0 · versions v11×10 v12×4
    [prompt]
    ...
    [completion]
    ...
    [answer] 42

Per step it keeps the best and the worst sample of a few groups, preferring groups whose rewards
differ, so a success and a failure sit side by side; the choice is deterministic.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from pathlib import Path

from slipstream.types import Group, Sample

STEP_MARK = "##### step "


def versions_summary(versions_T: Sequence[int]) -> str:
    """Run-length summary of per-token versions: `v3×12 v4×5` (in flight swaps show as runs)."""
    if not versions_T:
        return "no tokens"
    return " ".join(f"v{v}×{len(list(run))}" for v, run in itertools.groupby(versions_T))


def pick(groups: Sequence[Group], n: int) -> list[tuple[int, int]]:
    """(group index, sample index) of up to n samples: best and worst of each group, groups
    whose rewards differ first (they show a success next to a failure), then in order."""
    order = sorted(range(len(groups)), key=lambda gi: len(set(groups[gi].rewards_G)) < 2)
    out: list[tuple[int, int]] = []
    for gi in order:
        g = groups[gi]
        if not g.samples:
            continue
        by_reward = sorted(range(len(g.samples)), key=lambda i: -g.samples[i].reward)
        for si in dict.fromkeys([by_reward[0], by_reward[-1]]):  # one sample when G = 1
            if len(out) == n:
                return out
            out.append((gi, si))
    return out


def format_sample(groups: Sequence[Group], gi: int, si: int) -> str:
    g = groups[gi]
    s: Sample = g.samples[si]
    adv = f"{g.advantages_G[si]:+.3f}" if g.advantages_G is not None else "-"
    head = (
        f"--- group {gi + 1}/{len(groups)} (prompt {g.prompt.id}) · sample {si + 1}/{len(g.samples)} ---\n"
        f"reward {s.reward:.3f} · advantage {adv} · finish {s.finish_reason} · {s.num_tokens} tokens"
        f" · sampler {s.sampler_id} · versions {versions_summary(s.versions_T)}\n"
    )
    return f"{head}[prompt]\n{g.prompt.text}\n[completion]\n{s.completion_text}\n[answer] {g.prompt.answer}\n"


class RolloutWriter:
    """Appends `per_step` samples of each step to `run_dir/rollouts.txt`.

    Observation only: a write failure warns once and the run goes on.
    """

    def __init__(self, run_dir: str | Path, per_step: int = 4) -> None:
        if per_step < 0:
            raise ValueError(f"per_step: expected >= 0, got {per_step}")
        self.path = Path(run_dir) / "rollouts.txt"
        self.per_step = per_step
        self.failed = False

    def write(self, step: int, groups: Sequence[Group]) -> None:
        if self.per_step == 0:
            return
        try:
            text = "".join(format_sample(groups, gi, si) for gi, si in pick(groups, self.per_step))
            with self.path.open("a", encoding="utf-8", errors="replace") as f:
                f.write(f"{STEP_MARK}{step} #####\n{text}\n")
        except Exception as e:  # deliberate fault tolerance: logging text never stops a run
            if not self.failed:
                warnings.warn(
                    f"rollout log {self.path} failed ({e!r}); continuing without it",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.failed = True


def last_steps(text: str, n: int = 1) -> str:
    """The last n step blocks of a rollouts.txt (for the report)."""
    blocks = text.split(STEP_MARK)[1:]
    return "".join(STEP_MARK + b for b in blocks[-n:])
