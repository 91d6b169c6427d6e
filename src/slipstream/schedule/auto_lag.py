"""The self-tuning staleness bound (`schedule.max_lag = "auto"`): a pure controller of K.

Called once per closed window with that window's measurements; it returns a new K or None.
The orchestrator applies a new K at the window boundary (admission control and the lag
policy read it from then on), so K never changes inside a window.

The rule (docs/algorithms.md, "Self-tuning staleness bound"), on exponential moving averages
over windows of the trained tokens' ESS, `mismatch/kl` and the trainer's wait share:

- **decrease** (multiplicative): ESS below `ess_target`, or `mismatch/kl` above `kl_limit`,
  on the average and in `patience` of the last `patience + 1` windows (one window's outlier,
  a single larger update, does not count): `K <- max(k_min, K // 2)`, and the *ceiling*
  becomes `K - 1`: the K that was too stale is not tried again.
- **increase**: the trainer waited for data (wait share >= `wait_min`) and ESS is at least
  `ess_target + margin` (and KL at most half its limit): up to the ceiling (initially
  `k_max`), `K <- max(K + 1, 2K)` until the first decrease (a slow start, as in TCP: a
  useful K in `log2 k_max` changes instead of `k_max`), `K <- K + 1` after it.
- **stale drops** (with `stale_share` > 0): when the samplers' groups dropped for the bound
  (ledger `stale`, and `aborted` by the lag policy) are at least `stale_share` of the groups
  generated, on the average and in `patience` of the last `patience + 1` windows, the bound
  is seen throwing the samplers' work away: the raise above needs no probe (reason
  `stale_drops`). Its gain is measured, not guessed: the share of generation a larger K
  would have kept. It is the evidence of the first raises (a bound too tight drops groups at
  once), so the slow start takes `patience` windows a step instead of `probe`.
- **no gain** (with `min_gain` > 0): a raise is a probe. After it, `probe` windows are
  measured under the new K and the share of its time the trainer spent training (not waiting
  for data) compared with the `probe` windows before it: if the raise did not speed the
  trainer by at least `min_gain`, the climb ends: the ceiling becomes the K probed, which
  holds. (A larger K only helps when the samplers are held back by the bound: where they are
  the bottleneck whatever K is, further raises buy staleness and no speed.) K never goes
  *down* for want of speed: only the ESS and the KL, which measure staleness, lower it.
  Raises need `probe` windows under the current K, so the comparison has its "before",
  unless the stale drops above show the gain.
- otherwise K holds. Every change needs `patience` windows measured under the current K, and
  resets the averages, so a decision rests only on data trained under the K it judges.

Why it does not oscillate: the band `[target, target + margin)` between the two thresholds
is hysteresis (an ESS inside it moves nothing), and the ceiling only ever goes down (a
`no_gain` sets it to the current K). With
constant conditions (ESS a non-increasing function of K, as staler data is further from the
policy), the slow start doubles K at most `log2 k_max` times, until the ceiling or a first
K whose ESS is below the target; from then on K climbs one step at a time to the largest K
whose ESS is above the band, or to the ceiling, and stays; a K whose ESS is below the target
is left once and never re-entered. Stale drops only shorten the wait before a raise: they
never lower K nor lift the ceiling, and under constant conditions they fall as K grows (a
looser bound drops fewer groups), so they add no change the argument does not count. So the
number of changes is finite (at most `k_max - k_min` decreases, each followed by at most
`k_max` increases), which rules out a limit cycle. tests/test_auto_lag.py drives it with a scripted ESS and scripted waits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slipstream.config import Config
    from slipstream.schedule.orchestrator import Orchestrator


@dataclass(frozen=True)
class AutoLagRule:
    """Settings of the controller (`schedule.*` of the config)."""

    k_min: int = 0
    k_max: int = 8
    ess_target: float = 0.8
    kl_limit: float = 0.0  # 0: the KL does not count
    margin: float = 0.03  # hysteresis band above the target
    wait_min: float = 0.05  # the trainer "waits for data" above this share of its step
    patience: int = 2  # windows under the current K before the next change
    smoothing: float = 0.5  # weight of the newest window in the averages
    min_gain: float = 0.1  # a raise must speed the trainer by this much; 0: no probe
    probe: int = 8  # windows each side of a raise that the gain compares
    stale_share: float = 0.05  # groups dropped for the bound that make a raise evident; 0: off

    def __post_init__(self) -> None:
        if not 0 <= self.k_min <= self.k_max:
            raise ValueError(f"need 0 <= k_min <= k_max, got {self.k_min}, {self.k_max}")
        if self.patience < 1 or not 0 < self.smoothing <= 1:
            raise ValueError("patience must be >= 1 and smoothing in (0, 1]")
        if self.min_gain < 0 or self.probe < 1:
            raise ValueError("min_gain must be >= 0 and probe >= 1")
        if not 0 <= self.stale_share <= 1:
            raise ValueError(f"stale_share must be in [0, 1], got {self.stale_share}")


@dataclass
class Decision:
    k: int
    # ess_low | kl_high | trainer_waits | stale_drops | no_gain (K holds, the ceiling falls to it)
    reason: str


RAISES = ("trainer_waits", "stale_drops")


@dataclass
class AutoLag:
    """State of the controller: the current K, its ceiling and the running averages."""

    rule: AutoLagRule
    k: int
    ceiling: int = -1  # set from rule.k_max on construction
    since_change: int = 0
    ess: float | None = None
    kl: float | None = None
    wait: float | None = None
    stale: float | None = None  # share of the generated groups dropped for the bound
    changes: list[tuple[int, int, str]] = field(default_factory=list)  # (window, K, reason)
    windows: int = 0
    # (wait_s, train_s) of the last `probe` windows under the current K
    trace: list[tuple[float, float]] = field(default_factory=list)
    before: float | None = None  # a raise on probation: the train share under the K before it
    # (ESS, KL, stale share) of the last `patience + 1` windows under the current K: a
    # decrease, or a raise on stale drops, needs `patience` of them past the limit
    recent: list[tuple[float, float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ceiling < 0:
            self.ceiling = self.rule.k_max
        self.k = min(max(self.k, self.rule.k_min), self.rule.k_max)

    @property
    def slow_start(self) -> bool:
        """Doubling increases: no decrease yet."""
        return all(reason in RAISES for _, _, reason in self.changes)

    def _avg(self, old: float | None, new: float) -> float:
        a = self.rule.smoothing
        return new if old is None else a * new + (1 - a) * old

    def observe(
        self,
        ess: float,
        kl: float,
        wait: float,
        wait_s: float = 0.0,
        train_s: float = 0.0,
        stale: float = 0.0,
    ) -> Decision | None:
        """One closed window: its token ESS, `mismatch/kl` and trainer wait share, the
        trainer's seconds waiting for data and training (the probe's measure; left at 0
        under `min_gain` > 0, every probe finds no gain), and the share of the groups the
        samplers generated that the bound dropped. Returns the new K and why, or None when K
        holds."""
        r = self.rule
        self.windows += 1
        self.since_change += 1
        self.ess, self.kl = self._avg(self.ess, ess), self._avg(self.kl, kl)
        self.wait, self.stale = self._avg(self.wait, wait), self._avg(self.stale, stale)
        self.trace = [*self.trace, (wait_s, train_s)][-r.probe :]
        self.recent = [*self.recent, (ess, kl, stale)][-(r.patience + 1) :]
        if self.since_change < r.patience:
            return None
        decision, evident = None, self._drops()
        reason = self._too_stale()
        if reason is not None and self.k > r.k_min:
            self.ceiling = max(r.k_min, self.k - 1)
            decision = Decision(max(r.k_min, self.k // 2), reason)
            self.before = None  # a decrease ends any probe
        elif self.before is not None and len(self.trace) >= r.probe:  # a probe's verdict
            share_old, self.before = self.before, None
            if train_share(self.trace) < (1 + r.min_gain) * share_old:
                self.ceiling = self.k  # the climb ends here; K itself holds
                decision = Decision(self.k, "no_gain")
        if decision is None and self._may_raise(evident):
            step = max(1, self.k) if self.slow_start else 1
            reason = "stale_drops" if evident else "trainer_waits"
            decision = Decision(min(self.ceiling, self.k + step), reason)
            self.before = None  # an evident raise ends a probe: its gain is shown
            if r.min_gain > 0 and not evident:
                self.before = train_share(self.trace)
        if decision is not None:
            self.k = decision.k
            self.since_change, self.ess, self.kl, self.wait = 0, None, None, None
            self.stale = None
            self.trace, self.recent = [], []
            self.changes.append((self.windows, decision.k, decision.reason))
        return decision

    def _too_stale(self) -> str | None:
        """`ess_low` or `kl_high` when the data is too stale for the current K: the average
        past the limit and `patience` of the last `patience + 1` windows too; else None."""
        r = self.rule
        assert self.ess is not None and self.kl is not None
        low = sum(e < r.ess_target for e, _, _ in self.recent)
        if self.ess < r.ess_target and low >= r.patience:
            return "ess_low"
        over = sum(k > r.kl_limit for _, k, _ in self.recent)
        if r.kl_limit > 0 and self.kl > r.kl_limit and over >= r.patience:
            return "kl_high"
        return None

    def _drops(self) -> bool:
        """The bound drops at least `stale_share` of the generated groups: on the average and
        in `patience` of the last `patience + 1` windows."""
        r = self.rule
        if r.stale_share <= 0 or self.stale is None or self.stale < r.stale_share:
            return False
        return sum(s >= r.stale_share for _, _, s in self.recent) >= r.patience

    def _may_raise(self, evident: bool) -> bool:
        """A raise is allowed now; `evident`: the stale drops show its gain (`_drops`)."""
        r = self.rule
        assert self.ess is not None and self.kl is not None and self.wait is not None
        return (
            self.k < self.ceiling
            and (self.before is None or evident)
            and (r.min_gain <= 0 or len(self.trace) >= r.probe or evident)
            and self.wait >= r.wait_min
            and self.ess >= r.ess_target + r.margin
            and (r.kl_limit <= 0 or self.kl <= r.kl_limit / 2)
        )

    def state_dict(self) -> dict[str, Any]:
        """All the controller's future depends on: K, the ceiling, the changes, and the
        windows under the current K with their running averages (patience and the next
        decision read them)."""
        return {
            "k": self.k,
            "ceiling": self.ceiling,
            "changes": [list(c) for c in self.changes],
            "since_change": self.since_change,
            "windows": self.windows,
            "averages": [self.ess, self.kl, self.wait, self.stale],
            "trace": [list(t) for t in self.trace],
            "recent": [list(t) for t in self.recent],
            "before": self.before,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore `state_dict()`; K and the ceiling within this rule's bounds (a run may be
        resumed with other `max_lag_min` / `max_lag_max`)."""
        lo, hi = self.rule.k_min, self.rule.k_max
        self.k = min(max(int(d["k"]), lo), hi)
        self.ceiling = min(max(int(d["ceiling"]), lo), hi)
        self.changes = [(int(w), int(k), str(r)) for w, k, r in d.get("changes", [])]
        self.since_change, self.windows = int(d.get("since_change", 0)), int(d.get("windows", 0))
        averages = [*d.get("averages", []), None, None, None, None]  # older: no stale share
        self.ess, self.kl, self.wait, self.stale = averages[:4]
        self.trace = [(float(w), float(t)) for w, t in d.get("trace", [])]
        self.recent = [
            (float(e), float(k), float(s[0]) if s else 0.0) for e, k, *s in d.get("recent", [])
        ]
        b = d.get("before")  # older checkpoints held [old K, share]
        self.before = None if b is None else float(b[1] if isinstance(b, list) else b)


def train_share(trace: list[tuple[float, float]]) -> float:
    """The share of the trainer's time in `trace` ((wait_s, train_s) per window) spent
    training, not waiting for data: its speed relative to a trainer that never waits."""
    wait = sum(w for w, _ in trace)
    train = sum(t for _, t in trace)
    return train / (wait + train) if wait + train > 0 else 1.0


class LagControl:
    """The orchestrator's hook: reads a step record, returns the K for the next window.

    Wraps an `AutoLag` (None: K fixed) and the watchdog's `tighten` override, which forces
    K = 0 for a number of windows whatever the controller says (those windows, trained
    under K = 0, are not the controller's measurements: it observes none of them). Writes
    `schedule/max_lag` into every record and `schedule/max_lag_reason` into those where K
    changed or, with `no_gain`, its climb ended."""

    def __init__(self, auto: AutoLag | None, fixed_k: int) -> None:
        self.auto = auto
        self.base_k = auto.k if auto is not None else fixed_k
        self.zero_for = 0  # windows left under the watchdog's K = 0
        self.current = self.base_k
        self.counts = (0, 0)  # the ledger's (generated, stale + aborted) at the last record

    def state_dict(self) -> dict[str, Any]:
        """For the checkpoint: a resumed run goes on with the same K and ceiling."""
        auto = self.auto.state_dict() if self.auto is not None else None
        return {
            "base_k": self.base_k,
            "zero_for": self.zero_for,
            "current": self.current,
            "counts": list(self.counts),
            "auto": auto,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore `state_dict()` under this run's config: the controller's K (within its
        bounds), or the configured fixed K, which a resumed run may have changed."""
        self.zero_for = int(d["zero_for"])
        generated, dropped = d.get("counts", [0, 0])
        self.counts = (int(generated), int(dropped))
        if self.auto is not None and d.get("auto") is not None:
            self.auto.load_state_dict(d["auto"])
            self.base_k = self.auto.k
        self.current = 0 if self.zero_for > 0 else self.base_k

    def tighten(self, windows: int, record: dict[str, Any]) -> None:
        """The watchdog's `tighten`, from the step `record` still open (this call already
        set its K for the next window): K = 0 from that next window on, for `windows`
        windows, as the learning rate is lowered from the next step (`tighten_hook` hands
        the new K to the orchestrator)."""
        self.zero_for = max(self.zero_for, windows)
        tightened(record, self.current)
        self.current = 0

    def __call__(self, record: dict[str, Any]) -> int:
        stale = self._stale_share(record)
        # a window the watchdog held at K = 0 says nothing of the controller's K: not observed
        if self.auto is not None and self.zero_for == 0:
            wait = float(record.get("runtime/trainer_wait", 0.0))
            d = self.auto.observe(
                float(record.get("staleness/ess_token", 1.0)),
                float(record.get("mismatch/kl", 0.0)),
                wait,
                wait * float(record.get("step_time_s", 0.0)),
                float(record.get("time/train_s", 0.0)),
                stale,
            )
            if d is not None:
                self.base_k = d.k
                record["schedule/max_lag_reason"] = d.reason
        if self.zero_for > 0:  # the window that closed ran under the watchdog's K = 0
            self.zero_for -= 1
        k = 0 if self.zero_for > 0 else self.base_k
        if k != self.current and "schedule/max_lag_reason" not in record:
            record["schedule/max_lag_reason"] = "tighten_over"
        self.current = k
        record["schedule/max_lag"] = k
        return k

    def _stale_share(self, record: dict[str, Any]) -> float:
        """The share of the groups generated since the last record that the bound dropped
        (ledger `stale`, and `aborted` by the lag policy), from the record's running ledger
        counts; 0 where none was generated."""
        generated = int(record.get("ledger/generated", self.counts[0]))
        dropped = int(record.get("ledger/stale", 0)) + int(record.get("ledger/aborted", 0))
        new, lost = generated - self.counts[0], dropped - self.counts[1]
        self.counts = (generated, dropped)
        return min(1.0, max(0.0, lost / new)) if new > 0 else 0.0


def tightened(record: dict[str, Any], k: int) -> None:
    """A tighten while the step `record` is open: the next window's K is 0, not `k`."""
    if k != 0:
        record["schedule/max_lag"] = 0
        record["schedule/max_lag_reason"] = "watchdog_tighten"


def tighten_hook(control: LagControl, orch: Orchestrator) -> Callable[[int, dict[str, Any]], None]:
    """The watchdog's `tighten` on an orchestrated run: `control.tighten`, and the
    orchestrator's K follows at once (the window after the alarm's step is under K = 0)."""

    def go(windows: int, record: dict[str, Any]) -> None:
        control.tighten(windows, record)
        orch.spec = replace(orch.spec, max_lag=control.current)

    return go


def lag_control(cfg: Config, fixed_k: int) -> LagControl | None:
    """The orchestrator's K hook for `cfg`: a controller under `schedule.max_lag = "auto"`, a
    fixed K that the watchdog can tighten when any of its actions is `tighten`; else None."""
    sc, wd = cfg.schedule, cfg.watchdog
    auto = None
    if sc.max_lag == "auto":
        rule = AutoLagRule(
            sc.max_lag_min,
            sc.max_lag_max,
            sc.ess_target,
            sc.auto_kl_limit,
            sc.auto_margin,
            sc.auto_wait_min,
            sc.auto_patience,
            min_gain=sc.auto_min_gain,
            probe=sc.auto_probe_windows,
            stale_share=sc.auto_stale_share,
        )
        auto = AutoLag(rule, sc.auto_start)
    elif not (wd.enabled and "tighten" in wd.actions.values()):
        return None
    return LagControl(auto, fixed_k)
