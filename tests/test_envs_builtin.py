"""The built-in agentic task: the calculator, its latency, and warm-start traces that are
exactly the episodes the environment produces."""

from __future__ import annotations

import math
import random

import pytest

from slipstream.envs import ToolEnv
from slipstream.envs.builtin import (
    RENDERER,
    TOOLS_ALPHABET,
    Calculator,
    Latency,
    scripted_trace,
    tool_sums_task,
)
from slipstream.model.builtin import builtin_tokenizer
from slipstream.types import Prompt

TOK = builtin_tokenizer(TOOLS_ALPHABET)


def test_latency_is_lognormal_with_the_median_and_p99_asked() -> None:
    lat = Latency(0.02, 0.6)
    # p99 / median = 30 = exp(2.3263 * sigma)  =>  sigma = ln 30 / 2.3263 = 1.4621
    assert math.isclose(lat.sigma, math.log(30) / 2.3263478740408408)
    assert abs(lat.sigma - 1.4621) < 1e-4
    rng = random.Random(0)
    xs = sorted(lat.draw(rng) for _ in range(40_000))
    assert abs(xs[20_000] / 0.02 - 1) < 0.05
    assert abs(xs[39_600] / 0.6 - 1) < 0.15
    assert Latency(0.05, 0.05).draw(rng) == 0.05 and Latency(0.0, 0.0).draw(rng) == 0.0


def test_calculator_replies_running_sums_or_an_error() -> None:
    calc = Calculator()
    assert calc.calc("482+931+287").text == "1413,1700"
    assert calc.calc("482+931+287=").text == "1413,1700"
    bad = calc.calc("482*3")
    assert bad.error and bad.text.startswith("error: ")


def test_prompts_are_numbers_up_to_99_of_2_to_6_terms() -> None:
    prompts = tool_sums_task(num_train=2000).train_prompts()
    ks = [p.meta["k"] for p in prompts]
    assert min(ks) == 2 and max(ks) <= 6
    terms = [int(t) for p in prompts for t in p.text.rstrip("=").split("+")]
    assert max(terms) > 90 and all(0 <= t <= 99 for t in terms)
    assert all(set(p.text) <= set(TOOLS_ALPHABET) for p in prompts)


def test_a_scripted_trace_is_exactly_the_episode_the_environment_plays() -> None:
    row = Prompt("t0", "482+931+287=", answer="1413,1700")
    s = scripted_trace(row, TOK, TOK.eos_id)
    assert s.model_mask_T is not None
    text = TOK.inner.decode(s.completion_tokens, skip_special_tokens=True)  # past the stops
    assert text == "CALL calc 482+931+287\nRESULT calc: 1413,1700\n1413,1700"
    model = [t for t, m in zip(s.completion_tokens, s.model_mask_T) if m]
    assert TOK.inner.decode(model, skip_special_tokens=True) == "CALL calc 482+931+2871413,1700"
    assert model.count(TOK.eos_id) == 2  # each model turn ends with EOS
    # replay the trace's model turns through the environment: same tokens, reward 1
    env = ToolEnv(Calculator(), row, TOK, "plain", RENDERER)
    obs = env.initial_observation()
    assert obs.tokens == s.prompt_tokens
    cut = s.completion_tokens.index(TOK.eos_id) + 1
    r1 = env.step(s.completion_tokens[:cut])
    assert r1.next_observation is not None and not r1.done
    n = len(r1.next_observation.tokens)
    assert s.completion_tokens[cut : cut + n] == r1.next_observation.tokens
    assert s.model_mask_T[cut : cut + n] == [False] * n
    r2 = env.step(s.completion_tokens[cut + n :])
    assert r2.done and r2.reward == 1.0


@pytest.mark.slow  # ~1.4 s: imports the run setup (the task builder) and the config
def test_the_factories_pickle_for_the_environment_workers(tmp_path) -> None:
    """Worker processes get the factory pickled: the built-in one and `env.tools`' one, whose
    tool class (a file path) is loaded in the worker, not pickled."""
    import pickle

    from slipstream.config import load_config
    from slipstream.run.agentic import build_env_factory
    from slipstream.run.setup import build_task

    tools = tmp_path / "my_tools.py"
    tools.write_text("class Echo:\n    def echo(self, text: str) -> str:\n        return text\n")
    for extra in (["task.kind=builtin_tools"], [f"env.tools={tools}:Echo"]):
        cfg = load_config(None, extra)
        factory = build_env_factory(cfg, TOK, build_task(cfg))
        again = pickle.loads(pickle.dumps(factory))
        obs = again(Prompt("p", "1+2=", "3")).initial_observation()
        assert obs.text.endswith("1+2=") and obs.tokens == TOK.encode(obs.text), extra
    assert "- echo(text)" in obs.text  # the plain format lists a tool class's tools
    # a tool class without its own `reward` is scored by the task's verifier (in the worker)
    env = again(Prompt("p", "1+2=", "3"))
    env.initial_observation()
    assert env.step(TOK.encode("3")).reward == 1.0


def test_episode_accuracy_samples_n_episodes_a_prompt_with_fixed_seeds(monkeypatch):
    """Held-out accuracy of an environment task honours `eval.temperature` and
    `eval.samples_per_prompt`: n episodes of each prompt, seeds i n + j, mean reward."""
    from types import SimpleNamespace

    from slipstream.config import load_config
    from slipstream.engine import SamplingParams
    from slipstream.run import agentic

    seen: dict = {}

    class Runner:
        def close(self) -> None:
            seen["closed"] = True

    def make_runner(cfg, factory, engine, params, workers):
        seen["params"] = params
        return Runner()

    def run_episodes(engine, runner, items):
        seen["items"] = items
        return [SimpleNamespace(key=k, reward=float(seed % 2)) for _, k, seed in reversed(items)]

    monkeypatch.setattr(agentic, "make_runner", make_runner)
    monkeypatch.setattr(agentic, "run_episodes", run_episodes)
    cfg = load_config(None, [])
    prompts = [Prompt(id=f"p{i}", text="", answer="") for i in range(2)]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    acc = agentic.episode_accuracy(cfg, None, None, prompts, None, params, 3)  # type: ignore[arg-type]
    assert [(p.id, seed) for p, _, seed in seen["items"]] == [
        ("p0", 0),
        ("p0", 1),
        ("p0", 2),
        ("p1", 3),
        ("p1", 4),
        ("p1", 5),
    ]
    assert acc == 0.5 and seen["params"] is params and seen["closed"]
    agentic.episode_accuracy(cfg, None, None, prompts)  # type: ignore[arg-type]
    assert seen["params"].temperature == 0.0 and len(seen["items"]) == 2  # greedy, one each
