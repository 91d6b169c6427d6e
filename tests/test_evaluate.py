"""Held-out metrics users can compare: mean@n, pass@1 and the unbiased pass@k of Chen et al."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.config import ConfigError, load_config
from slipstream.engine import Completion, Request
from slipstream.engine.stats import EngineStats
from slipstream.run.evaluate import pass_at_k, summarize
from slipstream.types import FinishReason, Prompt


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # pass@1 is c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 3, 1 - 35 / 120),  # 1 - C(7,3)/C(10,3) = 1 - 35/120
        (5, 2, 5, 1.0),  # n - c = 3 < k: every 5-subset holds a pass
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
    ],
)
def test_pass_at_k_golden(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(n=st.integers(1, 8), data=st.data())
def test_pass_at_k_is_the_share_of_k_subsets_with_a_pass(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(pass_at_k(n, c, k), brute, abs_tol=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_summarize_golden():
    # prompt 0: 2 of 4 pass, prompt 1: none. mean@4 = 2/8; pass@1 = (2/4 + 0)/2; pass@4 = (1 + 0)/2
    got = summarize([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0]])
    assert got == {"mean@4": 2.5 / 8, "pass@1": 0.25, "pass@4": 0.5}
    assert summarize([[0.5], [1.0]], threshold=0.5) == {"mean@1": 0.75, "pass@1": 1.0}


def test_eval_config():
    cfg = load_config(
        None, ["eval.samples_per_prompt=4", "eval.temperature=1.0", 'eval.sets={a="x.jsonl"}']
    )
    assert cfg.eval.samples_per_prompt == 4 and cfg.eval.sets == {"a": "x.jsonl"}
    with pytest.raises(ConfigError, match=r"eval\.samples_per_prompt: n > 1 greedy"):
        load_config(None, ["eval.samples_per_prompt=4"])
    with pytest.raises(ConfigError, match=r"eval\.sets: a set name"):
        load_config(None, ['eval.sets={"a/b"="x.jsonl"}'])


def test_eval_sets_answers_are_text_for_a_builtin_reward_only(tmp_path):
    import json

    from slipstream.run.setup import eval_sets
    from slipstream.tasks import TaskError

    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps({"prompt": "2+2", "answer": ["4", "four"]}) + "\n")
    rw = tmp_path / "rw.py"
    rw.write_text("def score(prompt, completion):\n    return 0.0\n")
    base = [f"task.path={f}", f'eval.sets={{e="{f}"}}']
    # exact would compare with str(['4', 'four']): the set is rejected as the task's rows are
    with pytest.raises(TaskError, match="column 'answer': expected a string or a number"):
        eval_sets(load_config(None, [*base, 'task.reward="exact"']))
    [p] = eval_sets(load_config(None, [*base, f'task.reward="{rw}:score"']))["e"]
    assert p.answer == ["4", "four"]  # a reward of your own gets the column as it is


def test_eval_sets_read_their_test_split_or_a_folder_naming_none_whole(tmp_path):
    """`eval.sets` read a folder with the training split's name (`task.split`): a folder of
    train.jsonl and test.jsonl was scored on its training rows."""
    import json

    from slipstream.run.setup import eval_sets
    from slipstream.tasks import TaskError

    def rows(path, *prompts):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))

    rows(tmp_path / "split" / "train.jsonl", "train row")
    rows(tmp_path / "split" / "test.jsonl", "test row")
    rows(tmp_path / "whole" / "a.jsonl", "a row")
    rows(tmp_path / "whole" / "b.jsonl", "b row")
    rows(tmp_path / "t.jsonl", "x")
    sets = f'eval.sets={{s="{tmp_path / "split"}", w="{tmp_path / "whole"}"}}'
    got = eval_sets(load_config(None, [f"task.path={tmp_path / 't.jsonl'}", sets]))
    assert [p.text for p in got["s"]] == ["test row"]
    assert [p.text for p in got["w"]] == ["a row", "b row"]
    cfg = load_config(None, [f"task.path={tmp_path / 't.jsonl'}", sets, 'eval.split="dev"'])
    with pytest.raises(TaskError, match=r"no file of split 'dev' \(eval.split\)"):
        eval_sets(cfg)


class _Recorder:
    """An engine that answers '1' to every request and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.stats, self.version = EngineStats(), 0

    def generate(self, requests: list[Request]) -> list[Completion]:
        self.requests += requests
        return [
            Completion(r, [ord("1")], [0.0], [0], FinishReason.STOP, 0.0, 0.0) for r in requests
        ]


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(0.0, 1.0, 0), (1.0, 0.9, 20)])
def test_greedy_evaluation_asks_for_no_top_k_or_top_p(temperature, top_p, top_k):
    """Greedy evaluation set top_p to 1 but kept sampling.top_k, so its requests counted as
    filtering: they recorded kept_logmass for nothing and could not use the CUDA sampling
    graph. Sampled evaluation keeps both. Evaluation now passes the sampling settings as they
    are and `SamplingParams` drops them for greedy (tests/test_engine.py)."""
    from test_algo_integration import _prompt, _run

    run = _run([_prompt("a")], "sampling.top_k=20", "sampling.top_p=0.9")
    run.cfg.eval.temperature = temperature
    run.eval_engine, run.heldout = _Recorder(), [_prompt("a")]
    assert run.evaluate() == 1.0
    (params,) = {r.params for r in run.eval_engine.requests}
    assert (params.top_p, params.top_k) == (top_p, top_k)
    assert params.filters == (top_k > 0)


def test_held_out_prompts_are_encoded_at_the_first_evaluation_only():
    """Every evaluation encoded each held-out prompt twice (to skip those too long, `Run.fits`,
    and to generate): 8 encodings an evaluation here, thousands with a real held-out set. Now
    each prompt is encoded once a run, and every evaluation asks the engine for the same
    requests as before: the ids of encoding each prompt anew, the same seeds and results."""
    from test_algo_integration import CharTok, _prompt, _run

    class Counting(CharTok):
        calls = 0

        def encode_prompt(self, prompt: Prompt) -> list[int]:
            self.calls += 1
            return super().encode_prompt(prompt)

    long = Prompt("long", "x" * 40 + "=", "1")
    run = _run([_prompt("a")], "sampling.max_new_tokens=8")
    run.tok, run.max_len, run.eval_engine = Counting(), 16, _Recorder()
    run.heldout = [_prompt("a"), long, _prompt("b")]
    run.eval_sets = {"hard": [long, _prompt("c")]}
    assert [run.evaluate() for _ in range(3)] == [1.0] * 3
    assert run.tok.calls == 5  # the 5 prompts of the two sets, once each
    assert run.eval_metrics["heldout/skipped_too_long"] == 1
    want = [(CharTok().encode_prompt(_prompt(p)), i) for i, p in enumerate("ab")]
    want += [(CharTok().encode_prompt(_prompt("c")), 0)]
    got = [(r.prompt_tokens, r.seed) for r in run.eval_engine.requests]
    assert got == want * 3
    run.heldout = [_prompt("d")]  # another list: encoded anew
    run.evaluate()
    assert run.tok.calls == 6 and run.eval_engine.requests[-2].prompt_tokens == [*map(ord, "d=")]
