"""Tasks: the built-in task's shape, JSONL rows with clear errors, reward plugins."""

from __future__ import annotations

import hashlib
import json
import statistics

import pytest

from slipstream.tasks import JsonlTask, PromptSource, RunningSums, TaskError, load_reward, read_rows
from slipstream.tasks.arithmetic import running_sums
from slipstream.tasks.jsonl import math_verify_reward
from slipstream.types import Prompt


def test_running_sums_golden():
    assert running_sums([3, 5, 4]) == "8,12"
    assert running_sums([7, 9, 7, 2]) == "16,23,25"


@pytest.mark.parametrize(
    ("settings", "digest"),
    [
        ({}, "cbbec8337f2e710d"),
        ({"k_min": 2, "k_max": 6, "term_max": 99, "seed": 0}, "a4538b5cfb934adb"),
    ],
)
def test_builtin_prompts_are_the_recorded_draw_and_each_task_gets_its_own_lists(settings, digest):
    """Golden digests of every prompt, recorded before the draw was cached per process (a
    change to the draw would silently change every run's data), and the cache hands each
    task fresh lists."""
    a, b = RunningSums(**settings), RunningSums(**settings)
    text = "\n".join(f"{p.id} {p.text} {p.answer}" for p in a.heldout_prompts() + a.train_prompts())
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest
    a.train_prompts().clear()
    assert len(b.train_prompts()) == 20000 and len(RunningSums(**settings).train_prompts()) == 20000


def test_builtin_lengths_are_heavy_tailed_and_split_is_disjoint():
    task = RunningSums()
    lens = sorted(len(p.answer) + 1 for p in task.train_prompts())  # +1: end-of-sequence
    p99 = lens[int(0.99 * len(lens))]
    assert p99 >= 5 * statistics.median(lens)
    train = {p.text for p in task.train_prompts()}
    assert not train & {p.text for p in task.heldout_prompts()}
    p = task.heldout_prompts()[0]
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, p.answer + "1") == 0.0


def test_prompt_source_is_deterministic_and_resumable():
    prompts = [Prompt(str(i), str(i), i) for i in range(7)]
    a = PromptSource(prompts, seed=3)
    first = [a.draw().id for _ in range(10)]
    b = PromptSource(prompts, seed=3)
    for _ in range(4):
        b.draw()
    c = PromptSource(prompts, seed=3)
    c.load_state_dict(b.state_dict())
    assert [c.draw().id for _ in range(6)] == first[4:]
    assert sorted(first[:7]) == sorted(p.id for p in prompts)  # an epoch is a permutation


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{bad json", "not valid JSON"),
        ('{"prompt": "x"}', "missing column 'answer'"),
        ('{"answer": "x"}', "missing column 'messages' or 'prompt'"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt": "", "answer": "1"}', "column 'prompt': empty prompt"),
        ('{"prompt": "x", "answer": [1]}', "column 'answer': expected a string or a number"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, message):
    f = tmp_path / "data.jsonl"
    f.write_text('{"prompt": "1+1", "answer": "2"}\n\n' + line + "\n")
    with pytest.raises(TaskError) as err:
        read_rows(f)
    assert f"{f}:3: {message}" in str(err.value)


def test_math_verify_reward():
    p = Prompt("0", "What is 2+2?", "4")
    assert math_verify_reward(p, "The answer is $\\boxed{4}$") == 1.0
    assert math_verify_reward(p, "The answer is $\\boxed{5}$") == 0.0
    assert math_verify_reward(Prompt("1", "half", "\\frac{1}{2}"), "$0.5$") == 1.0


@pytest.mark.parametrize(
    ("answer", "completion", "reward"),
    [
        ("\\$18.90", "\\boxed{18.90}", 1.0),  # MATH's money answers: `\$` is no delimiter
        ("\\$32,\\!348", "The answer is $\\boxed{\\$32,348}$", 1.0),
        ("\\$18.90", "\\boxed{19.90}", 0.0),
        ("$\\frac{1}{2}$", "\\boxed{0.5}", 1.0),  # already delimited: read as given
    ],
)
def test_math_verify_reads_an_escaped_dollar_as_a_dollar_sign(answer, completion, reward):
    """Before, any `$` in the reference meant "delimited", so `\\$18.90` parsed to nothing
    and every completion scored 0."""
    assert math_verify_reward(Prompt("0", "q", answer), completion) == reward


def test_reward_plugin_from_file_and_errors(tmp_path):
    f = tmp_path / "rewards.py"
    f.write_text("def score(prompt, completion):\n    return float(prompt.answer in completion)\n")
    fn = load_reward(f"{f}:score")
    assert fn(Prompt("0", "q", "42"), "it is 42") == 1.0
    assert load_reward("slipstream.tasks.jsonl:exact_reward")(Prompt("0", "q", "a"), " a ") == 1.0
    with pytest.raises(TaskError, match="has no function 'nope'"):
        load_reward(f"{f}:nope")
    with pytest.raises(TaskError, match="cannot import"):
        load_reward("no_such_module_x:f")
    # a file that raises as it runs (task.reward_isolation = "inline" loads it in the run)
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_x\n")
    with pytest.raises(
        TaskError, match=r"bad.py:score': loading it raised ModuleNotFoundError: No module"
    ):
        load_reward(f"{bad}:score")
    bad.write_text("def score(prompt, completion)\n    return 1.0\n")
    with pytest.raises(TaskError, match=r"raised SyntaxError: expected ':' \(bad.py, line 1\)"):
        load_reward(f"{bad}:score")
    with pytest.raises(TaskError, match="expected math_verify, exact"):
        load_reward("bogus")


def test_jsonl_task_split(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(
        "\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(50))
    )
    task = JsonlTask(str(f), load_reward("exact"), heldout_fraction=0.2, seed=1)
    assert len(task.heldout_prompts()) == 10 and len(task.train_prompts()) == 40
    assert not {p.id for p in task.heldout_prompts()} & {p.id for p in task.train_prompts()}
