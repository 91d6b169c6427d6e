"""Rollouts as readable text, and the timeline of busy and idle intervals."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from slipstream.observe.rollouts import RolloutWriter, last_steps, pick, versions_summary
from slipstream.observe.timeline import Interval, TimelineWriter, busy_fraction, read_timeline
from slipstream.types import FinishReason, Group, Prompt, Sample


def _group(pid: str, rewards: list[float], versions: list[int] | None = None) -> Group:
    samples = [
        Sample(
            pid,
            [1, 2],
            [5, 6, 7],
            [-0.1] * 3,
            versions or [3, 3, 4],
            FinishReason.STOP if r else FinishReason.LENGTH,
            completion_text=f"answer {i}",
            reward=r,
        )
        for i, r in enumerate(rewards)
    ]
    return Group(
        Prompt(pid, f"what is {pid}?", "42"),
        samples,
        [r - sum(rewards) / len(rewards) for r in rewards],
    )


def test_versions_summary_is_run_length() -> None:
    assert versions_summary([3, 3, 4, 4, 4, 3]) == "v3×2 v4×3 v3×1"
    assert versions_summary([]) == "no tokens"


def test_pick_takes_best_and_worst_of_groups_whose_rewards_differ_first() -> None:
    groups = [
        _group("a", [0.0, 0.0]),
        _group("b", [0.0, 1.0, 0.5]),
        _group("c", [1.0]),
        _group("d", [0.0, 1.0]),
    ]
    # b and d show a success next to a failure, so they come first; then a and c in order
    assert pick(groups, 5) == [(1, 1), (1, 0), (3, 1), (3, 0), (0, 0)]
    assert pick(groups, 7) == [(1, 1), (1, 0), (3, 1), (3, 0), (0, 0), (0, 1), (2, 0)]
    assert pick(groups, 0) == []


def test_rollout_writer_appends_readable_blocks(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path, per_step=2)
    w.write(1, [_group("a", [0.0, 1.0])])
    w.write(2, [_group("b", [1.0, 0.0])])
    text = (tmp_path / "rollouts.txt").read_text()
    assert text.count("##### step ") == 2
    assert (
        "reward 1.000 · advantage +0.500 · finish stop · 3 tokens · sampler 0 · versions v3×2 v4×1"
        in text
    )
    assert "[prompt]\nwhat is b?\n[completion]\nanswer 0\n[answer] 42\n" in text
    assert last_steps(text).startswith("##### step 2 #####") and "step 1" not in last_steps(text)


def test_rollout_writer_failure_warns_once(tmp_path: Path) -> None:
    w = RolloutWriter(tmp_path / "missing" / "dir")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            w.write(step, [_group("a", [1.0])])
    assert len(caught) == 1 and w.failed


def test_timeline_round_trip_and_span(tmp_path: Path) -> None:
    tl = TimelineWriter(tmp_path, origin=0.0)
    tl.interval("sampler0", "generate", 0.0, 1.5)
    tl.interval("trainer", "wait", 0.0, 1.5)
    with tl.span("trainer", "train"):
        pass
    tl.close()
    got = read_timeline(tmp_path / "timeline.jsonl")
    assert got[:2] == [
        Interval("sampler0", "generate", 0.0, 1.5),
        Interval("trainer", "wait", 0.0, 1.5),
    ]
    assert got[2].kind == "train" and got[2].t1 >= got[2].t0
    with pytest.raises(ValueError, match="timeline kind 'gen'"):
        tl.interval("sampler0", "gen", 0, 1)


def test_read_timeline_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    path.write_text(
        json.dumps({"actor": "a", "kind": "train", "t0": 0, "t1": 1}) + '\n{"actor": "a"}\n'
    )
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: expected \{actor, kind, t0, t1\}"):
        read_timeline(path)


def test_read_timeline_skips_a_torn_last_line_only(tmp_path: Path) -> None:
    # a live run, or one killed mid-write, leaves its last line torn: read what came before it
    path = tmp_path / "timeline.jsonl"
    whole = json.dumps({"actor": "a", "kind": "train", "t0": 0, "t1": 1}) + "\n"
    torn = '{"actor": "a", "kind": "tra'
    path.write_text(whole + torn)
    assert read_timeline(path) == [Interval("a", "train", 0.0, 1.0)]
    path.write_text(whole + torn + "\n" + whole)  # torn elsewhere: still an error
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: expected \{actor, kind, t0, t1\}"):
        read_timeline(path)


def test_busy_fraction_counts_overlaps_once_and_ignores_waits() -> None:
    ivs = [
        Interval("s", "generate", 0, 4),
        Interval("s", "weight_sync", 3, 5),
        Interval("s", "wait", 5, 10),
        Interval("t", "train", 0, 10),
    ]
    # s is busy over [0, 5] of [0, 10]
    assert busy_fraction(ivs, "s", 0, 10) == 0.5
    assert busy_fraction(ivs, "s", 2, 4) == 1.0
