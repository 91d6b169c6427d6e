"""The live view shows every field the record holds; quiet mode prints a line per evaluation."""

from __future__ import annotations

import pytest

from slipstream.observe.metrics import Max, Mean
from slipstream.observe.progress import ProgressView, fields, fmt_duration

ASYNC_RECORD = {
    "step": 7,
    "version": 7,
    "reward_mean": 0.4321,
    "eval/heldout_acc": 0.25,
    "engine/tokens_per_s": 12345.6,
    "train/tokens_per_s": 2345.6,
    "staleness/lag_mean": Mean(3.0, 2.0),
    "staleness/lag_max": Max(3),
    "staleness/ess_token": 0.912,
    "staleness/ess_seq": 0.8,
    "runtime/sampler_busy": 0.97,
    "runtime/trainer_wait": 0.125,
    "queue/depth": 3,
    "ledger/generated": 40,
    "ledger/trained": 30,
    "ledger/filtered": 8,
    "ledger/stale": 2,
    "ledger/aborted": 0,
    "ledger/lost": 0,
}


def test_fields_show_every_quantity_of_the_async_runtime() -> None:
    from slipstream.observe.metrics import resolve

    got = dict(fields(resolve(ASYNC_RECORD), eta_s=125))
    assert got == {
        "version": "v7",
        "reward": "0.432",
        "held-out acc": "0.250",
        "gen tok/s": "12,346",
        "train tok/s": "2,346",
        "lag mean/max": "1.50 / 3",
        "ESS tok/seq": "0.912 / 0.800",
        "sampler busy": "97%",
        "trainer wait": "12%",
        "queue": "3",
        "ledger": "40 gen · 30 trained · 8 filtered · 2 stale",
        "ETA": "2m05s",
    }


def test_fields_read_the_sync_loop_names_and_skip_what_is_absent() -> None:
    sync = {
        "version": 2,
        "reward_mean": 0.5,
        "heldout_acc": 0.1,
        "sampler_busy": 0.5,
        "engine/tokens_per_s": 100.0,
        "ledger/generated": 4,
        "ledger/trained": 1,
        "ledger/filtered": 3,
    }
    assert [label for label, _ in fields(sync)] == [
        "version",
        "reward",
        "held-out acc",
        "gen tok/s",
        "sampler busy",
        "ledger",
    ]


def test_fmt_duration() -> None:
    assert [fmt_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]
    # a non-finite value (a NaN forecast) is shown as unknown; round() would raise on it
    assert [fmt_duration(x) for x in (float("nan"), float("inf"))] == ["?", "?"]


def test_eta_runs_at_the_pace_since_the_first_update() -> None:
    view = ProgressView(total=10, title="t", quiet=True)
    assert view.eta(2, now=100.0) is None  # one point gives no pace
    # 3 steps in 30 s -> 10 s a step, 5 steps left -> 50 s
    assert view.eta(5, now=130.0) == pytest.approx(50.0)


def test_quiet_prints_one_line_per_evaluation_and_at_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = ProgressView(total=3, title="t", quiet=True)
    view.update(1, {"version": 1, "reward_mean": 0.1})
    view.update(2, {"version": 2, "reward_mean": 0.2, "heldout_acc": 0.5, "queue/depth": 2})
    view.update(3, {"version": 3, "reward_mean": 0.3})
    view.log("done [1]")  # brackets are text, not rich markup
    view.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3  # no line per training step, and no wrapping
    assert lines[0].startswith(
        "step 2/3 · version v2 · reward 0.200 · held-out acc 0.500 · queue 2"
    )
    assert lines[1].startswith(
        "step 3/3 · version v3 · reward 0.300 · held-out acc 0.500"
    )  # the last known
    assert "ETA" in lines[1] and lines[2] == "done [1]"


def test_without_a_terminal_the_view_prints_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """stderr is captured here (not a terminal), as in a cluster job's log: plain lines, not
    a live display's last frame."""
    view = ProgressView(total=2, title="train", quiet=False)
    assert view.quiet
    view.log("run folder runs/x")
    view.update(1, ASYNC_RECORD)
    view.update(2, ASYNC_RECORD)
    view.close()
    view.close()  # idempotent: the loop may close twice on an error path
    view.log("done: 2 steps")
    err = capsys.readouterr().err
    assert "run folder runs/x" in err and "trainer wait" in err
    assert "\nstep 2/2 · " in err and "━" not in err  # a plain line, no progress bar
    assert "\ndone: 2 steps" in err


def test_on_a_terminal_the_view_is_live(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: treat stderr as a terminal
    view = ProgressView(total=2, title="train", quiet=False)
    assert not view.quiet
    view.update(1, ASYNC_RECORD)
    view.update(2, ASYNC_RECORD)
    view.close()
    err = capsys.readouterr().err
    assert "2/2" in err and "trainer wait" in err and "step 2/2 · " not in err


def test_the_ledger_line_shows_groups_a_rollback_discarded() -> None:
    # every counter of the step record's ledger (Ledger.flat) shows once it is not 0: here
    # 40 = 30 + 6 + 4, where the line left the discarded 4 out
    record = {"ledger/generated": 40, "ledger/trained": 30, "ledger/filtered": 6}
    record |= {"ledger/stale": 0, "ledger/discarded": 4}
    assert dict(fields(record))["ledger"] == "40 gen · 30 trained · 6 filtered · 4 discarded"
