"""Reward functions in the shapes users bring (slipstream, TRL batched, verl compute_score),
weighted and combined, logged per function, behind the reward guard inline and in a process."""

from __future__ import annotations

import math

import pytest

from slipstream.config import load_config
from slipstream.run.setup import build_task
from slipstream.tasks.guard import RewardGuard
from slipstream.tasks.rewards import CombinedReward, RewardPart, adapt, detect_shape, part_means
from slipstream.types import FinishReason, Group, Prompt, Sample

CHAT = Prompt(
    "p0",
    "<rendered>",
    "42",
    meta={"answer": "42", "kind": "math", "data_source": "gsm8k", "extra_info": {"i": 3}},
    messages=[{"role": "user", "content": "6*7?"}],
)
PLAIN = Prompt("p1", "6*7=", "42", meta={"answer": "42", "kind": "free"})

REWARDS = """
seen = []

def slip(prompt, completion):
    return float(prompt.answer in completion)

def trl_len(prompts, completions, **kwargs):
    seen.append((prompts, completions, kwargs))
    out = []
    for c, kind in zip(completions, kwargs["kind"]):
        text = c[0]["content"] if isinstance(c, list) else c
        out.append(None if kind == "free" else len(text) / 10)
    return out

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(ground_truth in solution_str), "acc": 1.0, "pred": solution_str, "src": data_source == "gsm8k"}

def verl_float(data_source, solution_str, ground_truth, extra_info=None):
    return extra_info["i"] * 1.0

def trl_wrong_length(prompts, completions, **kw):
    return [1.0, 2.0]

def nan_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float("nan")}

def trl_nan(prompts, completions, **kwargs):
    return [float("nan") for _ in completions]

def len_reward(completion_ids, **kwargs):  # TRL's documentation's first example
    return [float(len(ids)) for ids in completion_ids]
"""


@pytest.fixture
def rewards_py(tmp_path):
    f = tmp_path / "rw.py"
    f.write_text(REWARDS)
    return f


def test_shapes_are_told_by_parameter_names():
    assert detect_shape(lambda prompt, completion: 0.0) == "slipstream"
    assert detect_shape(lambda prompts, completions, **kw: []) == "trl"
    assert detect_shape(lambda completions, **kw: []) == "trl"
    assert (
        detect_shape(lambda data_source, solution_str, ground_truth, extra_info=None: 0) == "verl"
    )
    assert detect_shape(math.sqrt) == "slipstream"


def test_trl_is_called_as_trl_calls_it(rewards_py):
    import importlib.util

    spec = importlib.util.spec_from_file_location("rw_mod", rewards_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    fn = adapt(mod.trl_len, "auto")
    assert fn(CHAT, "1234567890") == 1.0
    prompts, completions, kwargs = mod.seen[-1]
    assert prompts == [CHAT.messages]  # chat prompt: messages in, assistant messages out
    assert completions == [[{"role": "assistant", "content": "1234567890"}]]
    assert kwargs["answer"] == ["42"] and kwargs["extra_info"] == [{"i": 3}]
    assert fn(PLAIN, "12345") is None  # not applicable
    assert mod.seen[-1][:2] == (["6*7="], ["12345"])  # plain prompt: strings


def _completion(k: int, version: int = 0) -> object:
    """A finished completion of `k` tokens (an engine's `Completion`, as `score_group` reads it)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        request=SimpleNamespace(prompt_tokens=[1], seed=0), tokens=[4] * k, logp=[0.0] * k,
        versions=[version] * k, finish_reason=FinishReason.STOP, t_start=0.0, t_end=0.0,
        kept_logmass=None,
    )  # fmt: skip


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_trl_reward_gets_the_completions_token_ids(rewards_py, isolation):
    """TRL passes `completion_ids` to every reward function; its documentation's first example
    rewards `len(ids)`. It was called as a slipstream function (no `prompts`/`completions`
    parameter), with the prompt as `completion_ids`, and raised. The ids travel with the text
    (`CompletionText`), to a reward worker process too; the sampler's scoring makes them."""
    from types import SimpleNamespace

    from slipstream.schedule.sampler import score_group
    from slipstream.tasks.guard import GuardedTask
    from slipstream.types import CompletionText

    assert detect_shape(lambda completion_ids, **kw: []) == "trl"
    guard = RewardGuard(CombinedReward((RewardPart(f"{rewards_py}:len_reward"),)), isolation)
    try:
        [v] = guard.score(CHAT, [CompletionText("a b", [5, 6, 7])])
        assert (v.reward, v.error) == (3.0, "")
        task = GuardedTask(SimpleNamespace(name="t"), guard)  # type: ignore[arg-type]
        tok = SimpleNamespace(decode=lambda ids: "x" * len(ids))
        done = [_completion(k) for k in (2, 5)]
        group = score_group(tok, task, CHAT, done)  # type: ignore[arg-type]
        assert [s.reward for s in group.samples] == [2.0, 5.0]
        assert type(group.samples[0].completion_text) is str  # the sample keeps the text alone
    finally:
        guard.close()


def test_weighted_combination_and_parts(rewards_py):
    r = CombinedReward(
        (
            RewardPart(f"{rewards_py}:trl_len", 0.5),
            RewardPart(f"{rewards_py}:compute_score", 2.0, name="correct"),
            RewardPart("exact"),
        )
    )
    out = r(CHAT, "is 42")
    # trl_len = 5/10 = 0.5 (weight 0.5), correct = 1 (weight 2), exact("is 42", "42") = 0:
    # 0.5 * 0.5 + 2 * 1 + 1 * 0 = 2.25; the verl dict's other numbers are logged, not 'pred'
    assert out == {
        "score": 2.25,
        "reward/trl_len": 0.5,
        "reward/correct": 1.0,
        "reward/correct/acc": 1.0,
        "reward/exact": 0.0,
    }
    # a TRL None leaves that function out of the sum (TRL's nansum)
    assert r(PLAIN, "42")["score"] == 2.0 * 1.0 + 1.0 and "reward/trl_len" not in r(PLAIN, "42")
    assert (
        not r.trusted and CombinedReward((RewardPart("exact"), RewardPart("math_verify"))).trusted
    )
    with pytest.raises(ValueError, match="two functions named 'exact'"):
        CombinedReward((RewardPart("exact"), RewardPart("exact", 2.0)))


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_guard_scores_every_shape_and_counts_bad_returns(rewards_py, isolation):
    parts = (RewardPart(f"{rewards_py}:verl_float"), RewardPart(f"{rewards_py}:slip", 2.0))
    guard = RewardGuard(CombinedReward(parts), isolation, timeout_s=10.0)
    try:
        [a, b] = guard.score(CHAT, ["42", "no"])
        assert (a.reward, b.reward) == (3.0 + 2.0, 3.0)
        assert a.parts == {"reward/verl_float": 3.0, "reward/slip": 1.0}
    finally:
        guard.close()
    for name, error in [("trl_wrong_length", "raised"), ("nan_score", "invalid")]:
        g = RewardGuard(CombinedReward((RewardPart(f"{rewards_py}:{name}"),)), isolation)
        try:
            with pytest.warns(RuntimeWarning, match=name):
                [v] = g.score(CHAT, ["42"])
            assert (v.reward, v.error) == (0.0, error) and g.errors[error] == 1
        finally:
            g.close()


def test_a_lone_verl_dict_is_its_score_and_its_parts(rewards_py):
    g = RewardGuard(CombinedReward((RewardPart(f"{rewards_py}:compute_score"),)), "inline")
    [v] = g.score(CHAT, ["42"])
    assert v.reward == 1.0
    assert v.parts == {"reward/compute_score": 1.0, "reward/compute_score/acc": 1.0}


def test_config_builds_the_combined_reward(tmp_path, rewards_py):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "6*7=", "answer": "42", "kind": "math"}\n' * 4)
    cfg = load_config(
        None,
        [
            f"task.path={data}",
            "task.heldout_fraction=0.0",
            f'task.rewards=[{{fn="{rewards_py}:trl_len", weight=0.5}}, {{fn="exact", weight=2}}]',
            'task.reward_isolation="inline"',
        ],
    )
    task = build_task(cfg)
    try:
        p = task.train_prompts()[0]
        assert p.meta == {"answer": "42", "kind": "math"}
        [v] = task.score(p, ["42"])
        assert v.reward == 0.5 * 0.2 + 2.0 and set(v.parts) == {"reward/trl_len", "reward/exact"}
    finally:
        task.close()
    builtin = build_task(load_config(None, [f"task.path={data}", 'task.reward="exact"']))
    assert builtin.guard.isolation == "inline" and builtin.guard.name == "exact"  # trusted


def test_part_means_per_step():
    def sample(parts: dict[str, float]) -> Sample:
        return Sample("p", [1], [2], [0.0], [0], FinishReason.STOP, reward_parts=parts)

    g = Group(
        PLAIN, [sample({"reward/a": 1.0, "reward/b": 0.0}), sample({"reward/a": 0.0}), sample({})]
    )
    # a: (1 + 0) / 2 over the samples it applied to; b: 0 / 1
    assert part_means([g]) == {"reward/a": 0.5, "reward/b": 0.0}


def test_a_trl_reward_with_a_ground_truth_column_is_called_as_trl():
    # TRL's documented reference reward takes the dataset's `ground_truth` column by name:
    # it is TRL's shape (completions), not verl's (solution_str, ground_truth)
    def reward_func(completions, ground_truth, **kwargs):
        return [float(c == gt) for c, gt in zip(completions, ground_truth)]

    assert detect_shape(reward_func) == "trl"
    row = Prompt("p2", "6*7=", "42", meta={"ground_truth": "42"})
    assert adapt(reward_func, "auto")(row, "42") == 1.0


def test_numpy_and_tensor_rewards_count_as_numbers_when_combined():
    import numpy as np
    import torch

    values = {"np32": np.float32(0.5), "np_int": np.int64(1), "tensor": torch.tensor(0.25)}

    def trl_array(prompts, completions, **kw):  # TRL takes an array back as well as a list
        return np.array([2.0], dtype=np.float32)

    fns = [lambda p, c, v=v: v for v in values.values()]
    parts = tuple(RewardPart(name, 1.0, name=name) for name in values)
    r = CombinedReward(parts, _fns=fns)
    # 0.5 + 1 + 0.25, each logged under its name
    assert r(PLAIN, "x") == {
        "score": 1.75,
        "reward/np32": 0.5,
        "reward/np_int": 1.0,
        "reward/tensor": 0.25,
    }
    assert adapt(trl_array, "auto")(PLAIN, "x") == 2.0
    assert math.isnan(
        CombinedReward(parts[:1], _fns=[lambda p, c: torch.ones(2)])(PLAIN, "x")["score"]
    )


def test_bool_rewards_count_as_0_and_1_when_weighted_or_combined():
    """TRL's `[c == a for ...]` gives bools, which `torch.tensor(rewards)` takes as 1 and 0;
    alone (weight 1) they counted, weighted or beside another function they made the sample
    invalid (reward 0)."""
    import numpy as np

    parts = (RewardPart("a", 2.0, name="match"), RewardPart("b", 0.5, name="np"))
    r = CombinedReward(parts, _fns=[lambda p, c: True, lambda p, c: np.bool_(False)])
    assert r(PLAIN, "x") == {"score": 2.0, "reward/match": 1.0, "reward/np": 0.0}


def test_trl_completions_follow_the_rows_prompt_format_not_the_chat_template():
    # TRL gives string completions for a string prompt (a standard dataset) and assistant
    # messages for a conversation; rendering the string through the model's chat template
    # does not make its reward a conversational one (`len(completion)` would be 1)
    from slipstream.model.chat import ChatTemplate
    from slipstream.tasks import RowFormat
    from slipstream.tasks.datasets import Row

    seen = []

    def reward_len(prompts, completions, **kwargs):
        seen.append((prompts, completions))
        return [float(len(c)) for c in completions]

    fmt = RowFormat(chat=ChatTemplate("{{ messages[0]['content'] }}!"), system_prompt="Be brief.")
    plain = fmt.prompt(Row("d:1", {"prompt": "6*7?", "answer": "42"}), "0")
    assert plain.messages is not None  # rendered by the template
    assert adapt(reward_len, "auto")(plain, "42") == 2.0
    assert seen[-1] == (["6*7?"], ["42"])
    chat = fmt.prompt(
        Row("d:2", {"messages": [{"role": "user", "content": "6*7?"}], "answer": 1}), "1"
    )
    assert adapt(reward_len, "auto")(chat, "42") == 1.0
    assert seen[-1][1] == [[{"role": "assistant", "content": "42"}]]


ASYNC_REWARDS = """
import asyncio

loops = []

async def trl_async(prompts, completions, **kwargs):
    loops.append(asyncio.get_running_loop())  # a client kept between calls needs the same loop
    await asyncio.sleep(0)
    return [float(len(loops) > 1 and loops[-1] is loops[-2]) + float(c == "42") for c in completions]

async def verl_async(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(ground_truth in solution_str)}

async def slip_async(prompt, completion):
    return 0.5

async def raises(prompts, completions, **kwargs):
    raise ValueError("no judge")
"""


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_async_rewards_are_awaited_as_trl_awaits_them(tmp_path, isolation):
    # TRL's GRPOTrainer awaits `async def` reward functions (a judge behind an HTTP API); they
    # were called as plain functions, so every sample "raised" a coroutine and scored 0
    f = tmp_path / "arw.py"
    f.write_text(ASYNC_REWARDS)
    parts = tuple(RewardPart(f"{f}:{n}") for n in ("trl_async", "verl_async", "slip_async"))
    guard = RewardGuard(CombinedReward(parts), isolation)
    try:
        [a, b] = guard.score(PLAIN, ["42", "no"])  # b: the second call, on the same loop
        assert a.error == b.error == "" and guard.errors == {}
        assert a.parts == {
            "reward/trl_async": 1.0,
            "reward/verl_async": 1.0,
            "reward/slip_async": 0.5,
        }
        assert b.parts["reward/trl_async"] == 1.0 and b.reward == 1.5
    finally:
        guard.close()
    g = RewardGuard(CombinedReward((RewardPart(f"{f}:raises"),)), isolation)
    try:
        with pytest.warns(RuntimeWarning, match="raised ValueError: no judge"):
            [v] = g.score(PLAIN, ["42"])
        assert (v.reward, v.error) == (0.0, "raised")
    finally:
        g.close()


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_reward_file_imports_the_modules_beside_it(tmp_path, isolation):
    # `task.reward="path/rw.py:fn"` with `import helpers` beside it: as `python rw.py` would,
    # the file's folder is on the import path (it raised ModuleNotFoundError on every sample)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "sibling_helpers_7f3a.py").write_text("def score(c):\n    return float(c == 'ok')\n")
    (folder / "rw.py").write_text(
        "from sibling_helpers_7f3a import score\n\n"
        "def reward(prompt, completion):\n    return score(completion)\n"
    )
    guard = RewardGuard(CombinedReward((RewardPart(f"{folder / 'rw.py'}:reward"),)), isolation)
    try:
        assert [v.reward for v in guard.score(PLAIN, ["ok", "no"])] == [1.0, 0.0]
        assert guard.errors == {}
    finally:
        guard.close()


STATE_REWARD = """
seen = []

def at_step(prompts, completions, trainer_state, **kwargs):  # TRL passes `trainer_state`
    seen.append(trainer_state)
    return [float(trainer_state.global_step) for _ in completions]
"""


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_trl_reward_gets_the_trainer_state(tmp_path, isolation):
    """TRL passes its `TrainerState` to every reward function as `trainer_state`; slipstream
    passed none, so a reward reading `trainer_state.global_step` raised on every sample. It
    travels with the text (`CompletionText`), to a reward worker process too; the sampler's
    scoring makes it, and a text without one passes none."""
    from types import SimpleNamespace

    from slipstream.schedule.sampler import score_group
    from slipstream.tasks.guard import GuardedTask
    from slipstream.types import CompletionText, TrainerState

    f = tmp_path / "st.py"
    f.write_text(STATE_REWARD)
    guard = RewardGuard(CombinedReward((RewardPart(f"{f}:at_step"),)), isolation)
    try:
        [v] = guard.score(PLAIN, [CompletionText("a", [5], TrainerState(7, 10))])
        assert (v.reward, v.error) == (7.0, "")
        task = GuardedTask(SimpleNamespace(name="t"), guard)  # type: ignore[arg-type]
        tok = SimpleNamespace(decode=lambda ids: "x" * len(ids))
        done = [_completion(1, version=2)]
        group = score_group(tok, task, PLAIN, done, state=TrainerState(3, 10))  # type: ignore[arg-type]
        assert [s.reward for s in group.samples] == [3.0]
        with pytest.warns(RuntimeWarning, match="trainer_state"):  # none known: none passed
            [v] = guard.score(PLAIN, [CompletionText("a", [5])])
        assert v.error == "raised"
    finally:
        guard.close()
    seen: list[object] = []
    fn = adapt(lambda prompts, completions, **kw: seen.append(kw) or [1.0], "trl")
    fn(PLAIN, CompletionText("a", [5], TrainerState(4, 9)))
    assert seen[0]["trainer_state"] == TrainerState(4, 9, None)  # max_steps, epoch unknown


@pytest.mark.slow  # ~10 s of CPU: a sync and an async run of 3 steps on a tiny model
@pytest.mark.parametrize("loop", ["sync", "async"])
def test_trainer_state_is_the_version_that_scores(tmp_path, loop):
    """A reward of `trainer_state.global_step`: in the sync loop the groups of step k are
    scored by version k - 1 and the evaluation after step k by version k; an asynchronous
    sampler scores at the version it holds (at most k - 1), and a deferred evaluation of step
    k's snapshot at k, not at the final version."""
    from slipstream.files import read_jsonl
    from slipstream.run.launch import train_async
    from slipstream.run.sync import train_sync
    from tiny import write_assets

    folder = write_assets(tmp_path, STATE_REWARD.replace("at_step", "reward"))
    cfg = load_config(None, [
        f'run.dir="{tmp_path / "run"}"', "run.steps=3", "run.quiet=true", "run.threads=1",
        "trainer.batch_prompts=2", "sampling.group_size=2", "sampling.max_new_tokens=4",
        "filters.zero_variance=false", "eval.every=1", "eval.num_prompts=2",
        f'model.path="{folder / "model"}"', f'task.path="{folder / "rows.jsonl"}"',
        f'task.reward="{folder / "reward.py"}:reward"', "task.reward_errors=fail",
        *(["schedule.name=async", "runtime.defer_eval=true"] if loop == "async" else []),
    ])  # fmt: skip
    summary = (train_sync if loop == "sync" else train_async)(cfg)
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert summary["heldout_acc_start"] == 0.0 and summary["heldout_acc_end"] == 3.0
    if loop == "sync":
        assert [r["reward_mean"] for r in records] == [0.0, 1.0, 2.0]
        assert [r["heldout_acc"] for r in records] == [1.0, 2.0, 3.0]
    else:
        assert all(0.0 <= r["reward_mean"] <= r["step"] - 1 for r in records), records
        curve = {c["step"]: c["heldout_acc"] for c in summary["heldout_curve"]}
        assert curve == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}, curve


def test_verl_ground_truth_is_reward_model_ground_truth_as_stored():
    # verl passes `reward_model.ground_truth` as the row stores it, whatever other columns the
    # row keeps: a MATH row's worked `solution` was the answer, and an int 4 arrived as "4"
    from slipstream.tasks import RowFormat
    from slipstream.tasks.datasets import Row

    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(ground_truth)
        return float(ground_truth == 4)

    row = {
        "data_source": "math",
        "prompt": "2+2?",
        "solution": "Adding, 2+2 = \\boxed{4}.",
        "reward_model": {"style": "rule", "ground_truth": 4},
    }
    for need_answer in (True, False):  # with a built-in reward beside it, or only your own
        p = RowFormat(need_answer=need_answer).prompt(Row("v.jsonl:1", row), "0")
        assert p.answer == "4"  # the built-ins compare text
        assert adapt(compute_score, "auto")(p, "4") == 1.0
        assert seen[-1] == 4 and type(seen[-1]) is int
    # a mapped answer column is still the built-ins' answer
    mapped = RowFormat(columns={"answer": "solution"}).prompt(Row("v.jsonl:1", row), "0")
    assert mapped.answer == row["solution"]


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_trl_nan_is_a_function_that_does_not_apply_as_in_trls_nansum(rewards_py, isolation):
    # TRL turns None into NaN and sums the functions with nansum: a NaN from one TRL function
    # leaves the others' sum. It made the whole sample invalid (scored 0, an error counted).
    parts = (RewardPart(f"{rewards_py}:trl_nan", 2.0), RewardPart(f"{rewards_py}:slip"))
    guard = RewardGuard(CombinedReward(parts), isolation, timeout_s=10.0)
    try:
        [v] = guard.score(CHAT, ["42"])
    finally:
        guard.close()
    assert (v.reward, v.error) == (1.0, "") and v.parts == {"reward/slip": 1.0}
    assert not guard.errors


MUTATING_REWARDS = """
def trl_mutates(prompts, completions, **kwargs):
    prompts[0].append({"role": "user", "content": "injected"})
    kwargs["answer"][0] = "0"
    return [1.0]

def verl_mutates(data_source, solution_str, ground_truth, extra_info=None):
    extra_info["i"] = -1
    return 1.0

def trl_reads(prompts, completions, answer, **kwargs):
    return [float(len(prompts[0]) * 10 + (answer[0] == "42"))]

def verl_reads(data_source, solution_str, ground_truth, extra_info=None):
    return float(extra_info["i"])
"""


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_reward_that_changes_its_inputs_changes_nothing_else(tmp_path, isolation):
    # the prompt's own messages and columns were passed: a function that appended to
    # `prompts[0]` or set `extra_info[...]` changed what the next function and the group's next
    # samples saw and, inline, the prompt the run trains on and logs
    f = tmp_path / "mut.py"
    f.write_text(MUTATING_REWARDS)
    names = ("trl_mutates", "verl_mutates", "trl_reads", "verl_reads")
    prompt = Prompt(
        "p0",
        "<rendered>",
        "42",
        meta={"answer": "42", "extra_info": {"i": 3}},
        messages=[{"role": "user", "content": "6*7?"}],
    )
    guard = RewardGuard(CombinedReward(tuple(RewardPart(f"{f}:{n}") for n in names)), isolation)
    try:
        out = guard.score(prompt, ["42", "42"])
    finally:
        guard.close()
    for v in out:
        assert v.parts["reward/trl_reads"] == 11.0 and v.parts["reward/verl_reads"] == 3.0
    assert prompt.messages == [{"role": "user", "content": "6*7?"}]
    assert prompt.meta == {"answer": "42", "extra_info": {"i": 3}}
