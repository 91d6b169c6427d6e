"""`slipstream replay RUN_DIR`: re-execute a recorded asynchronous run in one process.

(Not the experience replay buffer of `schedule.replay`.) The run's schedule record
(schedule.record) says in which order the trainer process did everything, and what each
sampler's engine did at each of its steps. `TrainerReplay` walks the trainer's events in
order with a fresh `Run` built from the run's config: draws, group sizes and seeds are asked
of the trainer in the same order (its counters follow); a message from a sampler advances
that sampler's `SamplerReplayer` to the point where it was sent (the engine re-executed step
by step, schedule.replay_sampler) and takes the group it produced; settling, the optimizer
step, the publish (into a `WeightStore` the replayers load from) and the step record follow
as the orchestrator did them. With the recorded config the result is the run again, bit for
bit on the same kind of machine (float32 on a CPU, the same torch build and thread counts,
which the record holds and the replay sets): every metric but wall-clock timings
(`replay_compare.TIMINGS`) and the values observed on live queues (`schedule.record.OBSERVED`, carried
over), and the final weights. Under `schedule.max_lag = "auto"` the K of each window is
carried over from the record too (`schedule.record.DECIDED`): the controller's decisions read
the trainer's measured wait, so they are part of the schedule, like the weight loads.

A replay may change settings that act on the trainer only (`EDITABLE`): the samplers then
generate with the new weights under the recorded schedule (each request admitted at its
recorded engine step if a slot is free, each weight version loaded at its recorded step), so
the run is the same schedule of staleness with one thing changed. `run.steps` may be lowered
to stop early (to bisect): the replay is still the recorded run (its learning-rate schedule over
the recorded steps, its evaluations, checked against the record when nothing else changed) and
stops after step `run.steps`, with a checkpoint of it. Anything that changes what is drawn, how
it is sampled, the engine or the schedule is refused: the record would not describe that run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from slipstream.config import Config, ConfigError, load_config
from slipstream.dicts import changed_keys
from slipstream.files import jsonl_lines, write_atomic
from slipstream.run.replay_compare import TIMINGS, compare
from slipstream.schedule.auto_lag import lag_control, tightened
from slipstream.schedule.record import DECIDED, FORMAT, FORMAT_VERSION, TIMING_FIELDS, rle
from slipstream.schedule.replay_sampler import Diverged, SamplerReplayer, WeightStore
from slipstream.schedule.step_stats import StepStats, discard, group_lag
from slipstream.text import read_lines
from slipstream.types import Group, Prompt

# Settings a replay may change: they act on the trainer's step, its evaluation or its output
EDITABLE = (
    "trainer.",
    "filters.overlong",
    "filters.overlong_cache",
    "filters.zero_variance",
    "replay.",
    "eval.",
    "checkpoint.",
    "wandb.",
    "run.steps",
    "run.quiet",
    "run.sinks",
    "run.rollouts_per_step",
)
FIXED = ("trainer.batch_prompts",)  # read by the orchestrator: the schedule's window size
Events = list[dict[str, Any]]  # one file of the schedule record, a dict per line


def read_meta(run_dir: Path) -> dict[str, Any]:
    """The record's meta.json, checked: ConfigError (one line) when it cannot be replayed."""
    path = run_dir / "schedule" / "meta.json"
    if not (run_dir / "config.toml").exists():
        raise ConfigError(f"{run_dir}: not a run folder (no config.toml)")
    if not path.exists():
        raise ConfigError(f"{path}: no schedule record; train with run.record_schedule=true")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise ConfigError(
            f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
            f"expected {FORMAT!r} version {FORMAT_VERSION}"
        )
    if not meta.get("complete"):
        why = "it did not finish"
        if meta.get("restarts"):
            why = f"{meta.get('restarts')} sampler restart(s)"
        if meta.get("resumed_from") is not None:  # run.resume.void_record
            why = f"the run was resumed from step {meta['resumed_from']}, which it does not record"
        raise ConfigError(f"{path}: the record is incomplete ({why}); only a complete run replays")
    return meta


def read_record(record: Path, meta: dict[str, Any]) -> tuple[Events, list[Events]]:
    """The record's trainer.jsonl and each sampler's log (`meta`: its meta.json, `read_meta`),
    read whole before the replay builds anything: a count of meta.json that is not one, a file
    missing or a line that is not a JSON object (a record copied in part) is a ConfigError
    naming the file and line."""
    for key in ("samplers", "trainer_threads", "sampler_threads"):
        if not isinstance(meta.get(key), int) or meta[key] < 1:
            path = record / "meta.json"
            raise ConfigError(f"{path}: {key} is {meta.get(key)!r}, expected a count >= 1")
    return _events(record / "trainer.jsonl"), [
        _events(record / f"sampler{i}.jsonl") for i in range(meta["samplers"])
    ]


def _events(path: Path) -> Events:
    if not path.is_file():
        raise ConfigError(f"{path}: missing from the schedule record; only a complete run replays")
    out = []
    for n, line in jsonl_lines(read_lines(path, ConfigError)):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{n}: not JSON ({e.msg}); the record is damaged") from None
        if not isinstance(event, dict):
            raise ConfigError(f"{path}:{n}: expected a JSON object; the record is damaged")
        out.append(event)
    return out


def replay_config(run_dir: Path, overrides: list[str], out: Path) -> tuple[Config, list[str], int]:
    """The replay's config: the run's, with `overrides`; the keys they changed; the step to
    stop after. A lowered `run.steps` is that step only: the config keeps the recorded one,
    which the run computed with (the trainer's learning-rate schedule, its last evaluation
    and checkpoint), and it is no change. ConfigError names the first key a replay may not
    change."""
    path = run_dir / "config.toml"
    original = load_config(path, [])
    mine = [f"run.dir={json.dumps(str(out))}", "run.record_schedule=false"]
    cfg = load_config(path, [*overrides, *mine])
    changed = changed_keys(original.model_dump(), cfg.model_dump())
    changed = [k for k in changed if k not in ("run.dir", "run.record_schedule")]
    for k in changed:
        if k in FIXED or not any(k == e or (e.endswith(".") and k.startswith(e)) for e in EDITABLE):
            raise ConfigError(
                f"replay: {k} would change what the samplers generate or the schedule itself; "
                f"a replay may change only {', '.join(e + '*' if e.endswith('.') else e for e in EDITABLE)} "
                f"(not {', '.join(FIXED)})"
            )
    stop = cfg.run.steps
    if stop > original.run.steps:
        raise ConfigError(
            f"replay: run.steps = {stop}, but the record holds {original.run.steps} steps"
        )
    cfg.run.steps = original.run.steps
    return cfg, [k for k in changed if k != "run.steps"], stop


class TrainerReplay:
    """The trainer process of a recorded run, re-executed with its samplers (see module)."""

    def __init__(
        self,
        cfg: Config,
        meta: dict[str, Any],
        events: Events,
        logs: list[Events],
        exact: bool,
        stop: int | None = None,
    ) -> None:
        """`events`, `logs`: the record's trainer.jsonl and each sampler's log (`read_record`);
        `stop`: the step to stop after (None: the run's last, `run.steps`)."""
        from slipstream.run.learner import RunLearner
        from slipstream.run.rollback import Undone, make_watchdog
        from slipstream.run.sampler import SamplerFactory
        from slipstream.run.setup import setup
        from slipstream.schedule.presets import preset
        from slipstream.schedule.sampler import SamplerSpec
        from slipstream.train.precision import parse_dtype

        self.cfg, self.meta, self.exact = cfg, meta, exact
        self.stop = cfg.run.steps if stop is None else stop
        self.run = run = setup(cfg)
        self.threads = int(meta["trainer_threads"])
        torch.set_num_threads(self.threads)
        self.spec = preset(cfg.schedule.name, cfg.schedule.lag_bound)
        control = lag_control(cfg, self.spec.max_lag)  # K of the first window (auto: its start)
        self.k = control.current if control is not None else self.spec.max_lag
        self.learner = RunLearner(run, cfg.runtime.defer_eval, run.timeline)
        # the same alarms on the same metrics, and the learning-rate factors (spike, tighten)
        # they set; a tighten's K = 0 of the next window is redone here (the record's K of
        # that window was taken before the watchdog saw the step), the later ones are DECIDED
        self.learner.watchdog = make_watchdog(run, self._tighten)
        self.undone = Undone()  # a rollback's undone versions, redone here (`_rollback`)
        self.rolled_back: list[int] = []  # the groups the last one discarded from windows
        if self.learner.watchdog is not None and exact:  # (a what-if replay's only warns)
            self.learner.watchdog.rollback = self._rollback
        B, G, r = cfg.trainer.batch_prompts, cfg.sampling.group_size, cfg.schedule.redundant
        slots = cfg.runtime.sampler_slots or B * (G + r)
        dtype = parse_dtype(cfg.model.dtype)
        build = SamplerFactory(
            SamplerSpec(cfg, run.model.config, dtype, run.tok, self.spec, slots, run.engine.max_len)
        )
        n = int(meta["samplers"])
        self.store = WeightStore([SamplerReplayer.loads(ev) for ev in logs])
        self.store.publish(0, dict(run.model.named_parameters()))
        self.prompts: dict[str, Prompt] = {}
        sampler_threads = int(meta["sampler_threads"])
        self.samplers = [
            SamplerReplayer(build(i), logs[i], self.prompts, self.store, sampler_threads, exact)
            for i in range(n)
        ]
        torch.set_num_threads(self.threads)
        self.events = events
        self.stats = StepStats()
        self.window: dict[int, Group] = {}
        # taken out of the windows by settling, until their step's `after` names them; a
        # window that kept nothing reaches no `after`: the next one forgets its groups, as
        # the orchestrator does (they never again sit in a window a rollback searches)
        self.settled: dict[int, Group] = {}
        self.kept: list[Group] = []
        self.windows = self.extra = 0  # windows closed; dynamic sampling's extra draws
        self.started = False
        self.issued = self.popped = 0
        self.delivered: set[int] = set()  # ids of the groups whose message came back
        self._step: tuple[list[Group], dict[str, Any], dict[str, Any], float] | None = None
        self._publish_s = 0.0

    def _check(self, what: str, recorded: object, got: object) -> None:
        if recorded != got and self.exact:
            raise Diverged(f"{what}: recorded {recorded!r}, replayed {got!r}")

    def run_all(self) -> dict[str, Any]:
        """Every event up to the step `stop`; then the run's end (a checkpoint of that step if
        the run ended before its own last, deferred evaluation, summary). The summary's final
        accuracy is the last evaluation's the run made up to there (`heldout_acc_end_step`):
        none is added at `stop`, which would change its step record."""
        from slipstream.run.summary import finish

        t0 = time.perf_counter()
        self.learner.t_start = t0
        acc_start = self.learner.evaluate(0)
        handlers = {
            "msg": self._msg, "draw": self._draw, "sizes": self._sizes, "seeds": self._seeds,
            "aged": self._aged, "settle": self._settle, "train": self._train,
            "publish": self._publish, "after": self._after, "rollback": self._rolled_back,
        }  # fmt: skip
        for e in self.events:
            handlers[e["e"]](e)
            if e["e"] == "after" and self.learner.version >= self.stop:
                break
        self._checkpoint_stop()
        self._end()
        self.learner.evaluate_deferred()
        curve = sorted(self.learner.curve, key=lambda c: c["step"])
        self.run.info.update(
            replay_of=str(self.meta.get("run_dir", "")),
            exact=self.exact,
            heldout_acc_end_step=curve[-1]["step"],
            heldout_curve=curve,
            **self._execution(),
        )
        acc_start = curve[0]["heldout_acc"] if acc_start is None else acc_start
        summary = finish(self.run, acc_start, curve[-1]["heldout_acc"], time.perf_counter() - t0)
        self.learner.drop_snapshots()
        return summary

    def _end(self) -> None:
        """The run's end, as the orchestrated run settles it (`Orchestrator.settle_unfinished`
        and `summary`, and the sampler count `run.launch` adds), so that the replay's ledger and
        goodput are the run's: groups back and not trained are `in_flight`; requests a sampler
        had started (the first `started` of its last report, of the requests it took, in
        order) and not sent back are `unfinished`, generated, their tokens and those of the
        groups in flight `tokens_unfinished`. Computed from the re-execution, not copied from
        the record; a replay stopped early ends as a run ending there would."""
        led = self.learner.ledger
        received = [*self.window.values(), *self.kept]
        led.in_flight = len(received)
        for i, sampler in enumerate(self.samplers):
            report = self.stats.reports.get(i)
            started = sampler.taken[: report.started if report else 0]
            led.unfinished += sum(g not in self.delivered for g in started)
        led.generated += led.unfinished
        held = sum(self.stats.undelivered_tokens(i) for i in self.stats.reports)
        self.run.info.update(
            schedule=self.spec.name,
            **self.stats.summary(),
            groups_issued=self.issued,
            groups_unfinished=self.issued - self.popped,
            windows=self.windows,
            samplers=len(self.samplers),
            tokens_unfinished=held + sum(g.num_tokens for g in received),
        )

    def _execution(self) -> dict[str, Any]:
        """Where the replay ran, in the keys `run.launch` gives the run's summary: `runtime`
        "replay" (this one process; `replayed_runtime` the record's), the devices it placed
        the trainer and each sampler's engine on, the weight channel between them (the
        in-process store). No `sampler_pids`: no sampler had a process of its own."""
        return {
            "runtime": "replay",
            "replayed_runtime": self.cfg.runtime_kind,
            "weight_channel": type(self.store).__name__,
            "placement": {
                "trainer": self.run.placement.trainer,
                "samplers": [
                    str(next(r.w.engine.model.parameters()).device) for r in self.samplers
                ],
            },
        }

    def _checkpoint_stop(self) -> None:
        """A replay stopped before the run's last step ends with a checkpoint of where it
        stopped (the run's own checkpoints are every `checkpoint.every` steps and the last)."""
        from slipstream.run.resume import checkpoint
        from slipstream.train.checkpoint import list_checkpoints

        name = f"step_{self.learner.version:06d}"
        if self.stop < self.cfg.run.steps and name not in {
            p.name for p in list_checkpoints(self.run.dir)
        }:
            checkpoint(self.run)

    # ---- messages from samplers ---------------------------------------------------------
    def _msg(self, e: dict[str, Any]) -> None:
        r, kind = self.samplers[e["s"]], e["k"]
        msg = None
        if kind in ("group", "aborted"):
            msg = r.group(e["g"])
            if msg.kind != kind:
                raise Diverged(f"group {e['g']}: recorded {kind}, replayed {msg.kind}")
            assert msg.report is not None
            rep = msg.report
        else:
            rep = r.report_at(e["n"])
        torch.set_num_threads(self.threads)
        if "rep" in e:
            rep = replace(rep, **dict(zip(TIMING_FIELDS, e["rep"])))
            self._check(f"sampler {e['s']} tokens generated", e["tok"], rep.tokens_generated)
        self.stats.add_report(rep)
        if msg is None:
            return
        self._group(e, msg.group)

    def _group(self, e: dict[str, Any], group: Group | None) -> None:
        """What the orchestrator did with a group's message (its recorded verdict)."""
        assert group is not None
        led, verdict = self.learner.ledger, e["v"]
        self.delivered.add(e["g"])  # the router forgets its owner, a late copy's too
        if verdict == "late":
            self.stats.late_groups += 1
            return
        self.popped += 1
        self.stats.delivered_group(e["s"], group)
        led.generated += 1
        led.count_episodes(group)
        if e["k"] == "aborted":
            led.aborted += 1
            return
        self._check(
            f"group {e['g']} token versions", e["ver"], [rle(s.versions_T) for s in group.samples]
        )
        rejected = self.undone.rejects(group)  # of a version a rollback undid
        self._check(f"group {e['g']} discarded", verdict == "discarded", rejected)
        if verdict == "discarded":
            discard(led, self.stats, [group])
            return
        if verdict == "stale":
            led.stale += 1
            self.stats.stale_tokens += group.num_tokens
            return
        self.window[e["g"]] = group

    def _aged(self, e: dict[str, Any]) -> None:
        group = self.window.pop(e["g"])
        self.learner.ledger.stale += 1
        self.stats.stale_tokens += group.num_tokens

    def _rollback(self, ckpt: Path, last_bad: int) -> None:
        """The replay's watchdog rolls back where the run's did (the same alarms on the same
        metrics): as `rollback.orchestrated_rollback`, into the replay's windows and store."""
        if self.undone.undo(self.run, ckpt, last_bad):
            self.store.publish(self.learner.version, dict(self.run.model.named_parameters()))
        self.rolled_back = [g for g, group in self.window.items() if self.undone.rejects(group)]
        discard(self.learner.ledger, self.stats, [self.window.pop(g) for g in self.rolled_back])

    def _tighten(self, windows: int, record: dict[str, Any]) -> None:
        """The watchdog's `tighten` in the step `record` still open, as `LagControl.tighten`:
        the next window's K is 0."""
        tightened(record, self.k)
        self.k = 0

    def _rolled_back(self, e: dict[str, Any]) -> None:
        self._check("groups a rollback discarded", sorted(e["g"]), sorted(self.rolled_back))

    # ---- calls into the trainer -----------------------------------------------------------
    def _draw(self, e: dict[str, Any]) -> None:
        if not self.started:  # the orchestrator's clocks start just before its first issue
            self.stats.start()
            self.started = True
        prompts = self.learner.draw(e["n"])
        self._check("draw", e["ids"], [p.id for p in prompts])
        self.prompts.update((p.id, p) for p in prompts)

    def _sizes(self, e: dict[str, Any]) -> None:
        out = self.learner.group_sizes([self.prompts[i] for i in e["ids"]])
        self._check("group sizes", e["out"], out)

    def _seeds(self, e: dict[str, Any]) -> None:
        out = self.learner.seeds(self.prompts[e["id"]], e["n"])
        self._check(f"seeds of {e['id']!r}", e["out"], out)
        self.issued += 1

    def _settle(self, e: dict[str, Any]) -> None:
        groups = [self.window.pop(g) for g in e["g"]]
        self.settled.update(zip(e["g"], groups))
        self.kept += self.learner.settle(groups)
        self._close_window()

    def _close_window(self) -> None:
        """Count the window a settle closes, as `Orchestrator.close_window` does: not while
        dynamic sampling waits for replacements of its filtered groups. (A fixed batch none of
        whose groups came back to settle closes a window the record does not show: not
        counted.)"""
        f, B = self.cfg.filters, self.cfg.trainer.batch_prompts
        if f.dynamic_sampling and len(self.kept) < B and self.extra < f.max_extra_draws:
            self.extra += min(B - len(self.kept), f.max_extra_draws - self.extra)
            return
        self.extra = 0
        self.windows += 1

    def _train(self, e: dict[str, Any]) -> None:
        kept, self.kept = self.kept, []
        step = self.learner.version + 1
        if self.exact and len(kept) != e["n"]:
            raise Diverged(f"step {step}: {len(kept)} groups kept, recorded {e['n']}")
        if not kept:  # (a what-if replay: its filters dropped every group of the window)
            raise Diverged(f"step {step}: no group left to train on; the record has {e['n']}")
        self.stats.trained_keys(kept)
        lag = group_lag(kept, self.learner.version, self.k)
        t0 = time.perf_counter()
        metrics = self.learner.train(kept)
        self.learner.ledger.count_step(kept, metrics)
        self._step = (kept, metrics, lag, time.perf_counter() - t0)

    def _publish(self, e: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self.store.publish(self.learner.version, dict(self.run.model.named_parameters()))
        self._publish_s = time.perf_counter() - t0

    def _after(self, e: dict[str, Any]) -> None:
        assert self._step is not None
        kept, metrics, lag, t_train = self._step
        groups = [self.settled.pop(g) for g in e["g"]]
        self.settled.clear()  # those of windows that kept nothing since the last step
        v = self.learner.version
        record = {
            "step": v,
            "version": v,
            **self.stats.record(groups, kept, metrics, lag, t_train, self._publish_s),
            "queue/depth": e["obs"].get("queue/depth"),
            "queue/in_flight": self.issued - self.popped,
            "filters/extra_draws": e["obs"].get("filters/extra_draws", 0),
            **self.learner.ledger.flat(),
            **{k: e["obs"][k] for k in DECIDED if k in e["obs"]},  # K as the run set it
        }
        self.k = int(e["obs"].get("schedule/max_lag", self.k))
        self.learner.after_step(record, groups)
        self.stats.step_begins()


def _out_dir(run_dir: Path, out: str | None) -> Path:
    if out is not None:
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"replay: --out {path} is a file; expected a new or empty folder")
        if path.exists() and any(path.iterdir()):
            raise ConfigError(f"replay: --out {path} exists and is not empty")
        return path
    n, path = 1, run_dir / "replay"
    while path.exists():
        n += 1
        path = run_dir / f"replay-{n}"
    return path


def replay(run_dir: Path, overrides: list[str], out: str | None = None) -> dict[str, Any]:
    """Re-execute `run_dir` into a new run folder (default RUN_DIR/replay); the comparison with
    the original (`compare`), also written to `<out>/replay.json`. Raises ConfigError for a
    record that cannot be replayed or a setting a replay may not change, Diverged when an exact
    replay leaves the record."""
    meta = read_meta(run_dir)
    path = _out_dir(run_dir, out)
    cfg, changed, stop = replay_config(run_dir, overrides, path)
    events, logs = read_record(run_dir / "schedule", meta)
    rollbacks = [e["bad"] for e in events if e["e"] == "rollback" and e["bad"] <= stop]
    if changed and rollbacks:
        raise ConfigError(
            f"replay: the record holds a watchdog rollback at step {rollbacks[0]}, which a replay "
            f"with {', '.join(changed)} changed would not follow; stop before it "
            f"(run.steps={rollbacks[0] - 1}) or replay exactly"
        )
    meta["run_dir"] = str(run_dir)
    t0 = time.perf_counter()
    TrainerReplay(cfg, meta, events, logs, not changed, stop).run_all()
    wall = time.perf_counter() - t0
    result = {
        "out": str(path),
        "changed": changed,
        "stopped_after": stop,
        "replay_wall_s": wall,
        **compare(run_dir, path),
    }
    summary = run_dir / "summary.json"
    if summary.exists():
        result["original_wall_s"] = json.loads(summary.read_text()).get("wall_s")
    write_atomic(path / "replay.json", json.dumps(result, indent=2))
    return result


def replay_main(argv: list[str]) -> int:
    """`slipstream replay RUN_DIR [key=value ...] [--out DIR]`."""
    import sys

    from slipstream.argv import OneLineParser

    parser = OneLineParser(
        prog="slipstream replay",
        description="Re-execute a run recorded with run.record_schedule=true, in one process.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the recorded run's folder")
    # (a default, or argparse names these among the required arguments when RUN_DIR is missing)
    parser.add_argument(
        "items",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="trainer-side settings to change (trainer.*, eval.*, run.steps lowered, ...)",
    )
    parser.add_argument("--out", metavar="DIR", help="the replay's run folder (RUN_DIR/replay)")
    args = parser.parse_args(argv)
    try:
        r = replay(Path(args.run_dir), list(args.items), args.out)
    except Diverged as e:
        print(f"{parser.prog}: error: the replay diverged from the record: {e}", file=sys.stderr)
        return 1
    # differs: a metric, or final weights both runs kept (not compared is said, not failed)
    same = r["metric_differences"] == 0 and r["weights_equal"] is not False
    what = f"with {', '.join(r['changed'])} changed" if r["changed"] else "exactly"
    weights = {True: "equal", False: "differ"}.get(r["weights_equal"])
    if weights is None:
        weights = f"not compared ({r.get('weights_not_compared', 'no checkpoint to compare')})"
    print(
        f"replayed {r['steps_compared']} steps {what} in {r['replay_wall_s']:.1f}s -> {r['out']}: "
        f"{r['metric_differences']} metric values differ (timings not compared: "
        f"{', '.join(TIMINGS)}), final weights {weights}"
    )
    for step, key, x, y in r["first_differences"]:
        print(f"  step {step}: {key}: {x!r} -> {y!r}")
    return 0 if same or r["changed"] else 1
