"""Sinks: JSONL takes floats and Metric values; a failing sink warns once, the run goes on."""

from __future__ import annotations

import json
import math
import re
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from slipstream.config import ConfigError, load_config
from slipstream.files import read_jsonl
from slipstream.observe.metrics import Max, Mean
from slipstream.observe.sinks import FanOut, JsonlSink, SafeSink, make_sinks


class Exploding:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, record: dict[str, Any]) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("still full")


def test_jsonl_writes_metric_values_and_plain_numbers(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write(
        {
            "step": 1,
            "train/loss": Mean(3.0, 2.0),
            "staleness/lag_max": Max(2),
            "reward_mean": 0.5,
            "completion_lens": [3, 4],
            "nan": math.nan,
            "inf": math.inf,
            "grad_norm": torch.tensor(2.5),
        }
    )
    sink.close()
    (row,) = read_jsonl(tmp_path / "m.jsonl")
    assert row == {
        "step": 1,
        "train/loss": 1.5,
        "staleness/lag_max": 2.0,
        "reward_mean": 0.5,
        "completion_lens": [3, 4],
        "nan": None,
        "inf": 1e308,
        "grad_norm": 2.5,
    }


def test_a_failing_sink_warns_exactly_once_and_the_run_goes_on(tmp_path: Path) -> None:
    bad = Exploding()
    sinks = FanOut([SafeSink(JsonlSink(tmp_path / "m.jsonl"), "jsonl"), SafeSink(bad, "exploding")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every warning, not Python's once-per-place
        for step in range(1, 6):  # the loop: write every step, close at the end
            sinks.write({"step": step, "reward_mean": 0.1 * step})
        sinks.close()
    messages = [str(w.message) for w in caught]
    assert (
        len(messages) == 1
        and "metrics sink exploding failed" in messages[0]
        and "disk full" in messages[0]
    )
    assert bad.calls == 5 and sinks.sinks[1].errors == 5 and sinks.sinks[1].failed
    # the healthy sink saw every step
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [1, 2, 3, 4, 5]


def test_make_sinks_rejects_unknown_names_and_always_has_jsonl_first(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="unknown metrics sink 'mlflow'; expected one of jsonl, tensorboard, wandb"
    ):
        make_sinks(tmp_path, ["tensorboard", "mlflow"])
    assert [s.name for s in make_sinks(tmp_path, [])] == ["jsonl"]
    assert [s.name for s in make_sinks(tmp_path, ["jsonl", "jsonl"])] == ["jsonl"]


def test_tensorboard_writes_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed: pip install tensorboard")
    jsonl, tb = make_sinks(tmp_path, ["tensorboard"])
    assert tb.name == "tensorboard" and not tb.failed
    for step in (1, 2):
        tb.write(
            {
                "step": step,
                "train/loss": Mean(1.0, 4.0),
                "reward_mean": 0.5,
                "completion_lens": [3, 5, 8],
            }
        )
    tb.close()
    jsonl.close()
    assert not tb.failed
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 100
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 0.25), (2, 0.25)]
    assert "completion_lens" in acc.Tags()["histograms"]


def test_tensorboard_draws_a_hist_list_as_counts_per_bin(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, tb = make_sinks(tmp_path, ["tensorboard"])
    # 900 tokens at lag 0, 100 at lag 1, none beyond: lags in [0, 1], token-weighted mean 0.1
    tb.write({"step": 1, "staleness/lag_hist": [900, 100, 0], "completion_lens": [3, 5]})
    tb.write({"step": 2, "staleness/lag_hist": [0, 0]})  # nothing counted: nothing drawn
    tb.close()
    assert not tb.failed
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"histograms": 0})
    acc.Reload()
    (event,) = acc.Histograms("staleness/lag_hist")
    h = event.histogram_value
    assert (event.step, h.min, h.max, h.num, h.sum) == (1, 0.0, 1.0, 1000.0, 100.0)
    assert acc.Histograms("completion_lens")[0].histogram_value.num == 2  # values, as before


def test_tensorboard_of_a_resumed_run_hides_the_steps_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard not installed: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def log(steps: tuple[int, ...], offset: float, resume_step: int | None) -> None:
        _, tb = make_sinks(tmp_path, ["tensorboard"], resume_step=resume_step)
        for step in steps:
            tb.write({"step": step, "train/loss": offset + step})
        tb.close()

    log((1, 2, 3, 4), 0.0, None)  # killed after step 4, its newest checkpoint at step 2
    time.sleep(1.1)  # a second event file (they are named by the second they open)
    log((3, 4, 5), 10.0, 2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0),
    ]  # fmt: skip


def test_wandb_missing_warns_once_and_is_disabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jsonl, wb = make_sinks(tmp_path, ["wandb"])
        for step in (1, 2, 3):
            jsonl.write({"step": step})
            wb.write({"step": step})
        wb.close()
    assert len(caught) == 1 and "metrics sink wandb could not be opened" in str(caught[0].message)
    assert wb.failed and len(read_jsonl(tmp_path / "metrics.jsonl")) == 3


def test_wandb_runs_offline_with_the_run_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, Any] = {"log": []}

    class FakeRun:
        def log(self, data: dict[str, Any], step: int) -> None:
            calls["log"].append((step, data))

        def finish(self) -> None:
            calls["finished"] = True

    def init(**kwargs: Any) -> FakeRun:
        calls["init"] = kwargs
        return FakeRun()

    def histogram(
        sequence: list[float] | None = None,
        np_histogram: tuple[list[float], list[float]] | None = None,
    ) -> tuple[Any, ...]:  # wandb.Histogram's two ways in
        if np_histogram is not None:
            return ("binned", tuple(np_histogram[0]), tuple(np_histogram[1]))
        return ("hist", tuple(sequence or ()))

    fake = types.SimpleNamespace(init=init, Histogram=histogram)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "config.toml").write_text("[run]\nseed = 3\n")
    _, wb = make_sinks(tmp_path, ["wandb"])
    wb.write({"step": 7, "reward_mean": Mean(1.0, 2.0), "completion_lens": [1, 2], "name": "x"})
    wb.close()
    assert calls["init"]["mode"] == "offline"  # no network, no account
    assert calls["init"]["dir"] == str(tmp_path) and calls["init"]["config"] == {"run": {"seed": 3}}
    assert calls["log"] == [(7, {"reward_mean": 0.5, "completion_lens": ("hist", (1.0, 2.0))})]
    # a `_hist` list counts per lag 0, 1, 2: bins centred on the lags, weighted by the counts
    _, wb = make_sinks(tmp_path, ["wandb"])
    wb.write({"step": 8, "staleness/lag_hist": [900, 100, 0]})
    wb.close()
    assert not wb.failed
    assert calls["log"][-1] == (
        8, {"staleness/lag_hist": ("binned", (900.0, 100.0, 0.0), (-0.5, 0.5, 1.5, 2.5))},
    )  # fmt: skip
    assert calls["finished"]
    # the [wandb] section: project, entity, name, tags, mode, as people use them
    cfg = load_config(None, ["wandb.project=p", "wandb.entity=team", "wandb.name=exp1",
                             'wandb.tags=["a", "b"]', "wandb.mode=online"])  # fmt: skip
    make_sinks(tmp_path, ["wandb"], cfg.wandb.model_dump())[1].close()
    init = calls["init"]
    assert (init["project"], init["entity"], init["name"], init["tags"], init["mode"]) == (
        "p", "team", "exp1", ["a", "b"], "online",
    )  # fmt: skip
    assert init["config"] == {"run": {"seed": 3}}  # the resolved config is the run config
    # given (run.setup gives it: a resumed run's config.toml is written after its sinks open)
    make_sinks(tmp_path, ["wandb"], {"config": {"run": {"seed": 4}}})[1].close()
    assert calls["init"]["config"] == {"run": {"seed": 4}}
    with pytest.raises(ConfigError, match=r"wandb\.mode"):
        load_config(None, ["wandb.mode=sometimes"])


def test_jsonl_lines_are_complete_after_each_write(tmp_path: Path) -> None:
    # Flushed per write: a crash after step 2 still leaves two readable lines.
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write({"step": 1})
    sink.write({"step": 2})
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    sink.close()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # what a strict reader (jq, JavaScript) refuses


def test_jsonl_lists_and_arrays_stay_valid_json(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "m.jsonl")
    # a list holding NaN/inf, a numpy array and a 1-d tensor: each a whole, valid line
    np = pytest.importorskip("numpy")
    sink.write(
        {
            "step": 1,
            "x": [1.0, math.nan, -math.inf],
            "arr": np.array([0.5, np.nan]),
            "t": torch.tensor([1.0, 2.0]),
        }
    )
    sink.close()
    line = (tmp_path / "m.jsonl").read_text()
    row = json.loads(line, parse_constant=_no_constants)
    assert row == {"step": 1, "x": [1.0, None, -1e308], "arr": [0.5, None], "t": [1.0, 2.0]}


def test_wandb_resumed_run_logs_to_the_same_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[dict[str, Any]] = []

    class FakeRun:
        def log(self, data: dict[str, Any], step: int) -> None:
            pass

        def finish(self) -> None:
            pass

    def init(**kwargs: Any) -> FakeRun:
        inits.append(kwargs)
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    make_sinks(tmp_path, ["wandb"])[1].close()  # a fresh run
    make_sinks(tmp_path, ["wandb"], resume_step=4)[1].close()  # its resume (setup passes the step)
    make_sinks(tmp_path, ["wandb"])[1].close()  # a fresh run started again in the same folder
    first, resumed, again = (i["id"] for i in inits)
    assert all(i["resume"] == "allow" for i in inits)
    assert re.fullmatch("[a-z0-9]{8}", first)  # W&B's own shape of id
    assert resumed == first  # one W&B run across the resume
    assert again != first  # a new run is a new W&B run
    assert (tmp_path / "wandb_id").read_text().strip() == again
    (tmp_path / "wandb_id").write_text("not an id!\n")  # damaged: a new id, not a W&B error
    make_sinks(tmp_path, ["wandb"], resume_step=4)[1].close()
    assert inits[-1]["id"].isalnum() and inits[-1]["id"] != again


def test_jsonl_lines_end_at_newline_only(tmp_path: Path) -> None:
    """A JSON string may hold U+2028, U+0085 and the like unescaped (the sinks escape them, a
    hand-edited or another tool's file may not): `read_jsonl` keeps such a line whole, where
    str.splitlines() would cut it in two."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": "x\u2028y\u0085z"}\n\n{"step": 2}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"a": "x\u2028y\u0085z"}, {"step": 2}]
    sink = JsonlSink(tmp_path / "w.jsonl")
    sink.write({"step": 1, "text": "x\u2028y"})
    sink.close()
    assert read_jsonl(tmp_path / "w.jsonl") == [{"step": 1, "text": "x\u2028y"}]
