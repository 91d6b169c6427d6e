"""Running pass rate of every prompt, and the draw decision of the pass-rate band filter.

The tracker consumes finished groups' rewards (`update`) and answers, when prompts are drawn,
whether a prompt is still worth generating for (`should_draw`). Mastered prompts (pass rate at
or above `high`) and hopeless ones (at or below `low`) are skipped, which saves generation, not
only gradient (docs/algorithms.md, Filters). With `skip_prob < 1` the skip is probabilistic, as in
GRESO's selective rollouts (Zheng et al. 2025, "Act Only When It Pays"): a prompt whose last z
groups all fell outside the band is skipped with probability `1 - (1 - skip_prob)^z`, so a
prompt excluded by one unlucky group, or since learned, keeps coming back. Its only state is
its own table; it is checkpointed with `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slipstream.algo import filters


@dataclass
class PromptRecord:
    """What the tracker knows of one prompt."""

    passes: int = 0
    attempts: int = 0
    ema: float | None = None  # exponential moving average of per-group pass rates
    skips: int = 0  # band skips since the last group (the skip hash and re-admission read it)
    streak: int = 0  # z: the latest groups in a row whose own pass rate was outside the band

    def rate(self, decay: float | None) -> float:
        if decay is not None and self.ema is not None:
            return self.ema
        return self.passes / self.attempts


class PassRateTracker:
    """Pass rate per prompt id, by counts (default) or by an exponential moving average.

    Counts give the all-time pass rate `passes / attempts`, the right estimate while the policy
    changes slowly relative to an epoch. With `ema_decay=a`, each new group's pass rate `q`
    moves the estimate `p <- a * p + (1 - a) * q`, so a prompt that the policy has since learned
    leaves the band sooner. A sample passes when its reward is at least `success_threshold`.
    A prompt needs `min_attempts` scored samples before the band can exclude it. With
    `retry_after=N > 0`, an excluded prompt is drawn again after N skips since its last group.
    With `skip_prob=s < 1`, an excluded prompt is skipped only with probability
    `1 - (1 - s)^z`, z its streak of groups outside the band (0 after a group inside it: always
    drawn), and drawn otherwise (reason `"explore"`); the uniform number behind each decision
    is a hash of `(seed, prompt id, attempts, skips)`, so decisions are reproducible and need
    no random state in a checkpoint (the skips are in it). `s = 1` is the hard band.
    """

    def __init__(
        self,
        low: float = 0.05,
        high: float = 0.9,
        *,
        success_threshold: float = 1.0,
        ema_decay: float | None = None,
        min_attempts: int = 1,
        retry_after: int = 0,
        skip_prob: float = 1.0,
        seed: int = 0,
    ) -> None:
        filters.in_pass_rate_band(0.5 * (low + high), low, high)  # validates the band
        if ema_decay is not None and not 0 <= ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        if min_attempts < 1:
            raise ValueError(f"min_attempts must be >= 1, got {min_attempts}")
        self.low, self.high = low, high
        self.success_threshold = success_threshold
        self.ema_decay = ema_decay
        if retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, got {retry_after}")
        if not 0 <= skip_prob <= 1:
            raise ValueError(f"skip_prob must be in [0, 1], got {skip_prob}")
        self.min_attempts = min_attempts
        self.retry_after = retry_after
        self.skip_prob = skip_prob
        self.seed = seed
        self._records: dict[str, PromptRecord] = {}

    def update(self, prompt_id: str, rewards_G: Sequence[float]) -> None:
        """Record one finished group of `prompt_id` (its G rewards)."""
        if not rewards_G:
            return
        passes = sum(r >= self.success_threshold for r in rewards_G)
        rec = self._records.setdefault(prompt_id, PromptRecord())
        rec.passes += passes
        rec.attempts += len(rewards_G)
        rec.skips = 0
        q = passes / len(rewards_G)
        rec.streak = 0 if filters.in_pass_rate_band(q, self.low, self.high) else rec.streak + 1
        if self.ema_decay is not None:
            rec.ema = q if rec.ema is None else self.ema_decay * rec.ema + (1 - self.ema_decay) * q

    def pass_rate(self, prompt_id: str, default: float | None = None) -> float | None:
        """The running pass rate of `prompt_id`, or `default` if it was never scored."""
        rec = self._records.get(prompt_id)
        return default if rec is None or rec.attempts == 0 else rec.rate(self.ema_decay)

    def smoothed(self, prompt_id: str, prior: float = 0.5, strength: float = 2.0) -> float:
        """`(passes + prior * strength) / (attempts + strength)`: the count estimate pulled
        toward `prior` (Beta(1, 1) with the defaults), so an unseen prompt is at `prior` and
        one with 0 of 8 is at 0.1, not 0. Adaptive group sizes need this: at a raw 0 a
        group can never be informative and would get the fewest samples, the opposite of
        what a hard prompt needs. Counts only, whatever `ema_decay` is."""
        rec = self._records.get(prompt_id)
        passes, attempts = (rec.passes, rec.attempts) if rec is not None else (0, 0)
        return (passes + prior * strength) / (attempts + strength)

    def should_draw(self, prompt_id: str) -> tuple[bool, str]:
        """`(draw, reason)`: unseen or under-sampled prompts are always drawn (`"unseen"`),
        prompts in the band are drawn (`"in_band"`), others are skipped with reason
        `filters.PASS_RATE_BAND`; with `retry_after=N`, a prompt skipped N times since its last
        group is drawn (`"retry"`); with `skip_prob < 1`, an excluded prompt escapes the skip
        with probability `(1 - skip_prob)^streak` (`"explore"`). A skip is counted here, so
        call it once per draw."""
        rec = self._records.get(prompt_id)
        if rec is None or rec.attempts < self.min_attempts:
            return True, "unseen"
        ok, reason = filters.should_draw(rec.rate(self.ema_decay), self.low, self.high)
        if ok:
            return ok, reason
        if self.retry_after and rec.skips >= self.retry_after:
            rec.skips = 0
            return True, "retry"
        if (
            self.skip_prob < 1
            and self._uniform(prompt_id, rec) < (1 - self.skip_prob) ** rec.streak
        ):
            return True, "explore"
        rec.skips += 1
        return ok, reason

    def skip_probability(self, prompt_id: str) -> float:
        """The probability that `should_draw` skips `prompt_id` now (retries aside)."""
        rec = self._records.get(prompt_id)
        if rec is None or rec.attempts < self.min_attempts:
            return 0.0
        if filters.in_pass_rate_band(rec.rate(self.ema_decay), self.low, self.high):
            return 0.0
        return 1.0 - (1.0 - self.skip_prob) ** rec.streak if self.skip_prob < 1 else 1.0

    def _uniform(self, prompt_id: str, rec: PromptRecord) -> float:
        """A uniform number in [0, 1) fixed by the seed, the prompt and its counts: a new one
        after every skip and every group. `random.Random` seeds a string through SHA-512, so
        the value does not depend on PYTHONHASHSEED."""
        return random.Random(f"{self.seed}:{prompt_id}:{rec.attempts}:{rec.skips}").random()

    def __len__(self) -> int:
        return len(self._records)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the table: `{prompt_id: [passes, attempts, ema,
        streak, skips]}` (snapshots without the streak or the skips load them as 0). The
        skips are saved because the next decision hashes them: a resumed run decides as the
        uninterrupted one.

        Settings are not saved: they come from the config, which may change on resume.
        """
        return {
            "records": {
                pid: [r.passes, r.attempts, r.ema, r.streak, r.skips]
                for pid, r in self._records.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` snapshot, replacing the current table."""
        self._records = {
            pid: PromptRecord(
                int(v[0]),
                int(v[1]),
                None if v[2] is None else float(v[2]),
                skips=int(v[4]) if len(v) > 4 else 0,
                streak=int(v[3]) if len(v) > 3 else 0,
            )
            for pid, v in state["records"].items()
        }
