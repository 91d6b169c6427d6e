"""Exact replay of an asynchronous run (`run.record_schedule`, `slipstream replay`).

A `pipeline` run with 2 sampler processes, a self-tuned K and a watchdog that rolls back after
an injected learning-rate spike is recorded, then re-executed in this process from
its record: every step metric but the wall-clock timings, and the final weights, must come
out identical. Then: a replay with a trainer setting changed runs the same schedule to other
weights; a record whose weight load is moved no longer replays; and the CLI's one-line
errors for what cannot be replayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slipstream.cli import main
from slipstream.config import ConfigError, load_config
from slipstream.config.load import dump_config
from slipstream.run.replay_run import TIMINGS, replay
from slipstream.schedule.record import SamplerLog, rle
from slipstream.schedule.replay_sampler import Diverged
from tiny import write_assets

REWARD = "def odd(prompt, completion):\n    return float(len(completion) % 2)\n"


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    return write_assets(tmp_path_factory.mktemp("assets"), REWARD)


def _overrides(assets: Path, run_dir: Path) -> list[str]:
    return [
        f'run.dir="{run_dir}"',
        "run.steps=5",
        "run.quiet=true",
        "run.threads=1",
        "run.record_schedule=true",
        f'model.path="{assets / "model"}"',
        'task.kind="jsonl"',
        f'task.path="{assets / "rows.jsonl"}"',
        f'task.reward="{assets / "reward.py"}:odd"',
        "sampling.max_new_tokens=16",
        "trainer.lr=6e-4",  # the built-in model's (a model.path run defaults to TRL's 1e-6)
        "trainer.batch_prompts=4",
        "sampling.group_size=4",
        "eval.every=2",
        "eval.num_prompts=8",
        "checkpoint.every=2",
        'runtime.kind="local"',
        "runtime.num_samplers=2",
        "runtime.trainer_threads=1",
        "runtime.threads_per_sampler=1",
        'schedule.name="pipeline"',
        # K tuned at window boundaries, from 1 to 2 at the second window (no wait needed, and
        # the ESS of this run is far above 0.5): the K changes are in the record too
        'schedule.max_lag="auto"',
        "schedule.auto_start=1",
        "schedule.max_lag_max=2",
        "schedule.auto_wait_min=0",
        "schedule.ess_target=0.5",
        "schedule.auto_min_gain=0",  # no throughput probe: K moves on the ESS alone
        'schedule.lag_policy="keep"',
        # and the watchdog: a 30x learning-rate spike at step 3 sets off `step_kl` (2.7 to 4,
        # against 0.02-0.06 on the other steps; limit 0.5), whose rollback restores step 2's
        # checkpoint as version 4 (groups of version 3 are discarded) and halves the rate
        "watchdog.enabled=true",
        "watchdog.inject_lr_spike_at=3",
        "watchdog.inject_lr_spike_steps=1",
        'watchdog.actions={step_kl="rollback"}',
        # only `step_kl` watched: the other alarms read the batch the trainer happened to get
        # (which group arrives first is timing), and a `warn` of theirs before the spike opens
        # an alarm episode that holds step 2's checkpoint back and leaves nothing to restore
        "watchdog.entropy_drop_rate=0",
        "watchdog.grad_spike_factor=0",
        "watchdog.reward_constant_steps=0",
    ]


@pytest.fixture(scope="module")
def recorded(assets, tmp_path_factory) -> Path:
    from slipstream.run.launch import train_async

    run_dir = tmp_path_factory.mktemp("run") / "pipeline"
    train_async(load_config(None, _overrides(assets, run_dir)))
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    """The last step's weights: step 5 (the rollback made version 4)."""
    return load_file(run_dir / "checkpoints" / "step_000005" / "model" / "model.safetensors")


@pytest.mark.slow
def test_pipeline_with_two_samplers_replays_bit_for_bit(recorded, tmp_path):
    a = _records(recorded)
    # an asynchronous schedule for real: tokens trained at a lag, both samplers used, K tuned
    assert max(r["staleness/lag_max"] for r in a) >= 1
    assert [r["schedule/max_lag"] for r in a][:3] == [1, 2, 2]
    assert a[1]["schedule/max_lag_reason"] == "trainer_waits"
    # the spike, the alarm, the rollback (version 4 is step 2's weights), the halved rate
    assert [r["step"] for r in a] == [1, 2, 3, 5]
    assert a[2]["watchdog/action"] == "rollback" and a[2]["watchdog/lr_scale"] == 30.0
    assert a[3]["watchdog/rollbacks"] == 1 and a[3]["watchdog/lr_scale"] == 0.5
    groups = [
        json.loads(x) for x in (recorded / "schedule" / "trainer.jsonl").read_text().splitlines()
    ]
    assert {e["s"] for e in groups if e["e"] == "msg" and e["k"] == "group"} == {0, 1}
    result = replay(recorded, [], str(tmp_path / "replay"))
    b = _records(tmp_path / "replay")
    assert len(a) == len(b) == 4
    for ra, rb in zip(a, b):
        keys = ra.keys() - set(TIMINGS)
        assert keys == rb.keys() - set(TIMINGS)
        for k in keys:
            same = ra[k] == rb[k] or (ra[k] != ra[k] and rb[k] != rb[k])  # NaN
            assert same, (ra["step"], k, ra[k], rb[k])
    assert {"train/loss", "reward_mean", "heldout_acc", "tokens/generated"} <= set(
        result["metrics_compared"]
    )
    x, y = _final(recorded), _final(tmp_path / "replay")
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert result["metric_differences"] == 0 and result["weights_equal"] is True


@pytest.mark.slow
def test_a_replay_ends_with_the_runs_ledger_and_goodput_figures(recorded, tmp_path):
    """The per-step records were equal, but the replay's summary.json was another run's: no
    end-of-run settling (requests the samplers had started when the run ended were not counted
    `unfinished`, nor generated, nor their tokens wasted) and no sampler count (goodput was
    taken as the in-process loop's, one actor). Now every figure goodput is computed from is
    the run's but the wall time and the trainer's seconds, which the replay measures itself
    (and `trainer_wait`, the trainer's measured wait)."""
    replay(recorded, [], str(tmp_path / "replay"))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (recorded, tmp_path / "replay"))
    assert b["ledger"] == a["ledger"] and a["ledger"]["balanced"]  # (the run's: unfinished 2-4)
    ledger = [json.loads((d / "ledger.json").read_text()) for d in (recorded, tmp_path / "replay")]
    assert ledger[0] == ledger[1]
    for key in (
        "samplers",
        "tokens_generated",  # and the samplers' generating seconds, which the record holds
        "busy_s",
        "tokens_unfinished",
        "tokens_lost",
        "tokens_wasted",
        "groups_issued",
        "groups_unfinished",
        "windows",  # recounted by the replay (missing before)
        "sampler_busy",
        "lag_mean",
        "lag_max",
        "ess_token",
        "ess_seq",
    ):
        assert b[key] == a[key], key
    # goodput = (train_s + gen_s * useful share) / (wall_s * actors): the same actors, and
    # the same generation part; only the trainer's seconds and the wall time are the replay's
    assert b["actor_s"] / b["wall_s"] == pytest.approx(a["actor_s"] / a["wall_s"]) == 3
    gen = [
        s["useful_s"] - sum(r["time/train_s"] for r in _records(d))
        for s, d in ((a, recorded), (b, tmp_path / "replay"))
    ]
    assert gen[1] == pytest.approx(gen[0], rel=1e-9)
    # the rest of the run's summary that a replay has (missing before): the held-out curve
    # (where `slipstream report` finds deferred evaluations) is the run's but its clock; the
    # runtime, placement and weight channel are the replay's own, in this one process
    curves = [[(c["step"], c["heldout_acc"]) for c in s["heldout_curve"]] for s in (a, b)]
    assert curves[1] == curves[0] and len(curves[0]) == 3  # steps 0, 2, 5 (eval.every=2)
    assert b["runtime"] == "replay" and b["replayed_runtime"] == a["runtime"] == "local"
    assert b["placement"] == a["placement"] == {"trainer": "cpu", "samplers": ["cpu", "cpu"]}
    assert b["weight_channel"] == "WeightStore" and "sampler_pids" not in b


@pytest.mark.slow
def test_a_changed_trainer_setting_replays_the_schedule_to_other_weights(recorded, tmp_path):
    """Up to the recorded rollback: a what-if replay could not follow it (its watchdog would
    act on other metrics), so one that reaches it is refused with one line."""
    result = replay(recorded, ["trainer.lr=3e-3", "run.steps=2"], str(tmp_path / "lr"))
    assert result["changed"] == ["trainer.lr"] and result["stopped_after"] == 2
    assert result["steps_compared"] == 2 and result["weights_equal"] is False
    assert result["metric_differences"] > 0
    with pytest.raises(ConfigError, match=r"watchdog rollback at step 3.*run\.steps=2"):
        replay(recorded, ["trainer.lr=3e-3"], str(tmp_path / "lr-all"))


@pytest.mark.slow
def test_a_moved_weight_load_does_not_replay(recorded, tmp_path):
    """The record decides: a weight load moved two engine steps later does not replay. Which
    sampler loads which version when depends on the original run's timing, and a load moved
    across steps in which its sampler decoded nothing changes nothing; so the loads of versions
    >= 1 are tried in turn (at most 4) and one of them must make the replay diverge."""
    import shutil

    candidates = [
        (name, i)
        for name in ("sampler0.jsonl", "sampler1.jsonl")
        for i, e in enumerate(
            json.loads(x) for x in (recorded / "schedule" / name).read_text().splitlines()
        )
        if e.get("load", 0) >= 1
    ][:4]
    assert candidates, "the recorded run loaded no new weights"
    for n, (name, at) in enumerate(candidates):
        copy = tmp_path / f"run{n}"
        shutil.copytree(recorded, copy)
        path = copy / "schedule" / name
        events = [json.loads(x) for x in path.read_text().splitlines()]
        e = events[at]
        events[at] = {k: v for k, v in e.items() if k != "load"}
        events.insert(at + 1, {"c": e["c"] + 2, "load": e["load"]})
        events = [e for e in events if set(e) != {"c"}]
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        try:
            replay(copy, [], str(tmp_path / f"replay{n}"))
        except Diverged:
            return
    pytest.fail(f"no moved load of {candidates} made the replay diverge")


@pytest.mark.slow
def test_a_replay_stopped_early_is_the_recorded_run_up_to_there(assets, tmp_path):
    """`run.steps=N` below the recorded steps bisects: the replay is the recorded run (its
    cosine learning rate over all 4 steps, past a 1-step warm-up; no evaluation at N that the
    run did not make), checked against the record (exact), and ends with a checkpoint of N.
    It used to rebuild the trainer over N steps (another learning rate from step 1), count
    run.steps as a change (no divergence checks) and evaluate at N."""
    from slipstream.run.launch import train_async

    run_dir = tmp_path / "run"
    train_async(load_config(None, [*_overrides(assets, run_dir), *BISECT]))
    result = replay(run_dir, ["run.steps=2"], str(tmp_path / "bisect"))
    a, b = _records(run_dir), _records(tmp_path / "bisect")
    assert [r["train/lr"] for r in b] == [r["train/lr"] for r in a[:2]]
    assert "heldout_acc" not in b[-1]  # eval.every = 100: the run evaluated at 0 and 4 only
    assert result["changed"] == [] and result["stopped_after"] == 2
    assert result["steps_compared"] == 2 and result["metric_differences"] == 0
    assert result["weights_equal"] is True  # both have step 2's checkpoint
    summary = json.loads((tmp_path / "bisect" / "summary.json").read_text())
    assert summary["exact"] is True and summary["heldout_acc_end_step"] == 0
    assert summary["windows"] == 2  # as the run had closed when it trained step 2


# `_overrides` made a 1-sampler pipeline run of 4 steps (K = 1, no watchdog) whose learning
# rate depends on its length (cosine after a 1-step warm-up), evaluated at the start and the
# end only, checkpointed at steps 2 and 4
BISECT = [
    "run.steps=4",
    "runtime.num_samplers=1",
    "schedule.max_lag=1",
    "watchdog.enabled=false",
    "trainer.warmup_steps=1",
    'trainer.lr_schedule="cosine"',
    "eval.every=100",
    "checkpoint.every=2",
]


def test_sampler_log_positions_and_rle():
    log = SamplerLog(4, 32)
    log.on_step(0, [])  # the first weights (the engine held -1), nothing admitted
    log.on_step(0, [(7, 0), (7, 1)])
    log.stale_check(1)
    log.on_step(0, [])  # nothing happened: no line
    out = log.flush()
    assert out["n"] == 3
    assert out["ev"] == [
        {"c": 0, "engine": [4, 32]},
        {"c": 0, "load": 0},
        {"c": 1, "admit": [[7, 0], [7, 1]]},
        {"c": 2, "stale": 1},
    ]
    assert log.flush() == {"n": 3, "ev": []}
    assert rle([3, 3, 4, 3]) == [[3, 2], [4, 1], [3, 1]] and rle([]) == []


def _fake_run(tmp_path: Path, meta: dict | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(None, ['runtime.kind="local"', 'schedule.name="pipeline"'])
    (run / "config.toml").write_text(dump_config(cfg))
    if meta is not None:
        (run / "schedule").mkdir()
        (run / "schedule" / "meta.json").write_text(json.dumps(meta))
    return run


META = {"format": "slipstream-schedule", "version": 1, "complete": True, "samplers": 1}


@pytest.mark.parametrize(
    "meta, args, says",
    [
        (None, [], "no schedule record; train with run.record_schedule=true"),
        ({**META, "version": 99}, [], "expected 'slipstream-schedule' version 1"),
        ({**META, "complete": False, "restarts": 1}, [], "incomplete (1 sampler restart(s))"),
        (META, ["sampling.temperature=0.5"], "replay: sampling.temperature would change"),
        (META, ["trainer.batch_prompts=2"], "replay: trainer.batch_prompts would change"),
        (META, ["run.steps=500"], "but the record holds 200 steps"),
    ],
)
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, meta, args, says):
    run = _fake_run(tmp_path, meta)
    assert main(["replay", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_cli_error_for_a_folder_that_is_no_run(tmp_path, capsys):
    assert main(["replay", str(tmp_path)]) == 2
    assert "not a run folder (no config.toml)" in capsys.readouterr().err


def test_the_recorder_forgets_the_groups_of_windows_that_kept_nothing(tmp_path):
    """A window that keeps nothing never reaches `after_step`; its groups must not stay in
    the recorder's map for the rest of the run (they are never named again): the next step
    forgets them with its own."""
    from slipstream.schedule.record import RecordingLearner, ScheduleRecorder
    from slipstream.types import Group, Prompt

    class Inner:
        ledger = None

        def settle(self, groups):
            return [g for g in groups if g.prompt.id == "kept"]

        def after_step(self, record, groups):
            pass

    rec = ScheduleRecorder(tmp_path, {})
    empty = [Group(Prompt(id=f"p{i}", text="", answer=""), []) for i in range(3)]
    step = [Group(Prompt(id="kept", text="", answer=""), [])]
    for i, g in enumerate([*empty, *step]):
        rec._groups[id(g)] = (i, g)  # as `message` registers an accepted group
    learner = RecordingLearner(Inner(), rec)
    assert learner.settle(empty) == []  # a window that keeps nothing: no step follows
    assert learner.settle(step) == step
    learner.after_step({"step": 1}, step)
    assert rec._groups == {}
    rec.close(True)


def _group_of_versions(pid: str, versions: list[int]):
    from slipstream.types import FinishReason, Group, Prompt, Sample

    n = len(versions)
    sample = Sample(pid, [1], [2] * n, [0.0] * n, versions, FinishReason.STOP, reward=1.0)
    return Group(Prompt(id=pid, text="", answer=""), [sample])


def test_the_record_and_the_replay_discard_the_same_groups_after_a_rollback(tmp_path):
    """After a rollback undoing versions 3-4, a group holding a token of version 3 is
    discarded on arrival, `discarded` in the record; the replay discards it too (ledger), and
    an exact replay that would keep a group the record discarded (or the reverse) diverges.
    The rollback event names the groups taken out of the windows."""
    from slipstream.run.replay_run import TrainerReplay
    from slipstream.run.rollback import Undone
    from slipstream.runtime.channels import PromptRequest, SamplerMessage
    from slipstream.schedule.ledger import Ledger
    from slipstream.schedule.record import ScheduleRecorder
    from slipstream.schedule.step_stats import StepStats

    undone = Undone()
    undone.ranges.append((3, 4))
    old, bad = _group_of_versions("a", [2, 2]), _group_of_versions("b", [2, 3])
    assert not undone.rejects(old) and undone.rejects(bad)

    rec = ScheduleRecorder(tmp_path, {})
    waiting = _group_of_versions("c", [4])
    rec._groups[id(waiting)] = (7, waiting)  # in a window when the rollback came
    rec.rollback(2, 4, [waiting])
    req = PromptRequest(8, bad.prompt, (1,), 1, issue_version=2)
    rec.message(SamplerMessage("group", 0, request=req, group=bad), "discarded")
    rec.close(True)
    events = [
        json.loads(x) for x in (tmp_path / "schedule" / "trainer.jsonl").read_text().splitlines()
    ]
    assert events[0] == {"e": "rollback", "ckpt": 2, "bad": 4, "g": [7]}
    assert events[1]["v"] == "discarded" and events[1]["g"] == 8 and rec._groups == {}

    r = TrainerReplay.__new__(TrainerReplay)  # the message half only: no run, no samplers
    r.exact, r.undone, r.window, r.popped, r.stats = True, undone, {}, 0, StepStats()
    r.delivered = set()
    r.learner = type("L", (), {"ledger": Ledger()})()  # type: ignore[assignment]
    r._group(events[1], bad)
    assert r.learner.ledger.discarded == 1 and r.learner.ledger.generated == 1 and not r.window
    assert r.stats.discarded_tokens == bad.num_tokens == 2  # tokens/wasted, as the run's
    with pytest.raises(Diverged, match="group 9 discarded"):  # recorded as kept
        r._group({**events[1], "g": 9, "v": "window"}, bad)
    with pytest.raises(Diverged, match="group 10 discarded"):  # recorded as discarded
        r._group({**events[1], "g": 10, "ver": [[[2, 2]]]}, old)


def test_a_rollback_in_the_replay_does_not_discard_the_groups_of_a_window_that_kept_nothing():
    """A window whose groups the filters all dropped closes without a step: the orchestrator
    forgets its groups, so a later rollback cannot discard them. The replay did keep them in
    its windows: a rollback then counted them `discarded` as well (ledger off by their
    number) and an exact replay raised Diverged on the rollback event."""
    from types import SimpleNamespace

    from slipstream.run.replay_run import TrainerReplay
    from slipstream.run.rollback import Undone
    from slipstream.schedule.ledger import Ledger
    from slipstream.schedule.step_stats import StepStats

    class Rollback(Undone):
        def undo(self, run, ckpt, last_bad):  # the trainer's side is not under test here
            self.ranges.append((3, last_bad))

    r = TrainerReplay.__new__(TrainerReplay)
    r.stats = StepStats()
    filtered = {5: _group_of_versions("a", [3]), 6: _group_of_versions("b", [3])}
    waiting = _group_of_versions("c", [4])
    r.window, r.settled, r.kept, r.undone = dict(filtered), {}, [], Rollback()
    r.learner = SimpleNamespace(ledger=Ledger(), version=4, settle=lambda groups: [])
    r.cfg, r.windows, r.extra = load_config(None, []), 0, 0
    r.run = SimpleNamespace(model=torch.nn.Linear(1, 1))
    r.store = SimpleNamespace(publish=lambda version, params: None)
    r._settle({"e": "settle", "g": [5, 6]})  # kept nothing: no train, no after
    r.window[7] = waiting
    r._rollback(Path("step_000002"), 4)
    assert r.rolled_back == [7] and r.learner.ledger.discarded == 1
    assert r.stats.discarded_tokens == waiting.num_tokens == 1
    r._rolled_back({"e": "rollback", "ckpt": 2, "bad": 4, "g": [7]})  # as recorded: no raise


@pytest.mark.parametrize(
    ("dynamic", "windows"),
    [
        # B = 2, at most 1 extra draw: {drop, drop} waits for a replacement (1 extra), which
        # keeps 1 and closes it (extras spent); {keep, keep} closes one; {drop, drop} waits,
        # {drop} closes one that kept nothing
        (True, [0, 1, 2, 2, 3]),
        (False, [1, 2, 3, 4, 5]),  # every settle closes its window
    ],
)
def test_the_replay_counts_the_windows_the_run_closed(dynamic, windows):
    """A replay's summary.json lacked `windows`, the orchestrator's count of windows closed
    (with a step or having kept nothing). The replay counts a window at each settle, as
    `Orchestrator.close_window` closes one, except while dynamic sampling waits for
    replacements of filtered groups (golden counts derived by hand in the cases)."""
    from types import SimpleNamespace

    from slipstream.run.replay_run import TrainerReplay

    r = TrainerReplay.__new__(TrainerReplay)
    r.cfg = load_config(
        None,
        [
            "trainer.batch_prompts=2",
            f"filters.dynamic_sampling={str(dynamic).lower()}",
            "filters.max_extra_draws=1",
        ],
    )
    r.settled, r.kept, r.windows, r.extra = {}, [], 0, 0
    keep = {"k1", "k2", "k3"}
    r.learner = SimpleNamespace(settle=lambda gs: [g for g in gs if g.prompt.id in keep])
    settles = [["d1", "d2"], ["k1"], ["k2", "k3"], ["d3", "d4"], ["d5"]]
    got = []
    for ids in settles:
        r.window = {i: _group_of_versions(pid, [0]) for i, pid in enumerate(ids)}
        closed = r.windows
        r._settle({"e": "settle", "g": list(r.window)})
        if r.windows > closed:
            r.kept = []  # a closed window's kept groups are trained (`_train`)
        got.append(r.windows)
    assert got == windows


def test_a_rollback_counts_the_tokens_of_the_groups_it_discards_as_wasted(monkeypatch):
    """The orchestrated rollback takes the groups of undone versions out of the windows
    (ledger `discarded`): their tokens are wasted generation (`tokens/wasted`,
    `tokens/discarded` in the open step's record), not useful work in goodput."""
    from types import SimpleNamespace

    from slipstream.run import rollback
    from slipstream.schedule.ledger import Ledger
    from slipstream.schedule.step_stats import StepStats

    def undo(self, run, ckpt, last_bad):  # the trainer's side is not under test here
        self.ranges.append((3, last_bad))
        return False

    monkeypatch.setattr(rollback.Undone, "undo", undo)
    waiting, kept = _group_of_versions("c", [2, 4, 4]), _group_of_versions("d", [2])
    state = SimpleNamespace(window=[(7, waiting), (8, kept)], batches={}, out_of_bound=0)
    orch = SimpleNamespace(
        state=state, stats=StepStats(), recorder=None, fixed=False, issue=lambda: None
    )
    run = SimpleNamespace(ledger=Ledger())
    rollback.orchestrated_rollback(run, None, orch)(Path("step_000002"), 4)  # type: ignore[arg-type]
    assert run.ledger.discarded == 1 and state.window == [(8, kept)] and state.out_of_bound == 1
    assert orch.stats.discarded_tokens == waiting.num_tokens == 3
    rec = orch.stats.record([], [], {}, {"lag_mean": 0.0, "lag_max": 0, "lag_hist": []}, 0.0, 0.0)
    assert rec["tokens/discarded"] == rec["tokens/wasted"] == 3
    assert orch.stats.discarded_tokens == 0  # the next step's count starts again


def test_the_replay_redoes_a_tighten_as_the_run_did():
    """The record's K for the next window is taken before the watchdog sees the step; a
    tighten then sets it to 0 in the run (`LagControl.tighten`), and the replay's watchdog
    must do the same to the same record (else its lag histograms of that window differ)."""
    from slipstream.run.replay_run import TrainerReplay
    from slipstream.schedule.auto_lag import LagControl

    ctl = LagControl(None, fixed_k=2)
    live = {"step": 4}
    ctl(live)
    replayed = {"step": 4, "schedule/max_lag": live["schedule/max_lag"]}  # as `after` carries it
    r = TrainerReplay.__new__(TrainerReplay)
    r.k = replayed["schedule/max_lag"]
    ctl.tighten(3, live)
    r._tighten(3, replayed)
    assert live == replayed and r.k == ctl.current == 0


def test_the_final_weights_are_compared_when_a_rollback_ended_the_run(tmp_path):
    """A rollback at the step before the last (4 of 5) publishes the restored weights as the
    last version, so the final checkpoint is `step_000005` after the record of step 4. The comparison
    looked for the checkpoint of the last record's step, found none, and an exact replay
    reported its final weights as differing (exit 1)."""
    from safetensors.torch import save_file

    from slipstream.run.replay_run import compare

    w = {"w": torch.arange(4.0)}
    for run in ("run", "replay"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "train/loss": 0.5}) + "\n" for s in (1, 2, 3, 4))
        )
        ckpt = tmp_path / run / "checkpoints" / "step_000005"
        (ckpt / "model").mkdir(parents=True)
        (ckpt / "state.json").write_text("{}")
        save_file(w, str(ckpt / "model" / "model.safetensors"))
    result = compare(tmp_path / "run", tmp_path / "replay")
    assert result["metric_differences"] == 0 and result["weights_equal"] is True
