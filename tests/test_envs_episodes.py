"""Multi-turn episodes: masks and tokens (token in, token out), log-prob parity, parking (the
engine never waits for an environment), budgets and failures ending an episode once."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Hashable

import pytest
import torch

from scripted_env import drive_episode
from slipstream.config.env import EnvConfig
from slipstream.engine import Engine, Request, SamplingParams
from slipstream.engine.parking import KVPark
from slipstream.envs import Observation, StepResult
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.schedule.episodes import Episode, EpisodeRunner, run_episodes
from slipstream.train.batch import collate, token_logprobs
from slipstream.types import FinishReason, Prompt

EOS = 1
VOCAB = 13


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(seed: int = 0) -> CausalLM:
    """A tiny random Llama; normal(0, 0.5) weights so that next-token choices are not ties."""
    cfg = ModelConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else 0.5 * torch.randn_like(p))
    return model.eval()


class Scripted:
    """Known turns: the prompt is [2, 3, 4 + i]; after model turn t it replies [5 + t] * (t + 2)
    for `turns - 1` turns, then ends with reward 1. Records what it was shown."""

    def __init__(self, i: int, turns: int = 3, sleep_s: float = 0.0) -> None:
        self.i, self.turns, self.sleep_s = i, turns, sleep_s
        self.actions: list[list[int]] = []
        self.slept: tuple[float, float] | None = None

    def initial_observation(self) -> Observation:
        return Observation([2, 3, 4 + self.i % 8])

    def step(self, action_tokens: list[int]) -> StepResult:
        self.actions.append(list(action_tokens))
        t = len(self.actions)
        if self.sleep_s and t == 1:
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            self.slept = (t0, time.perf_counter())
        if t >= self.turns:
            return StepResult(reward=1.0, done=True)
        return StepResult(0.0, False, Observation([5 + t] * (t + 2)), {"tool_calls": 1.0})


def _env_end(e: Episode) -> tuple[str, FinishReason]:
    """How an episode the environment ended ends: `done`, or `max_tokens` (a cut completion)
    when `max_new_tokens` cut its last turn before its EOS."""
    return (
        ("done", FinishReason.STOP) if e.tokens[-1] == EOS else ("max_tokens", FinishReason.LENGTH)
    )


def _run(
    envs: dict[Hashable, Scripted],
    params: SamplingParams,
    slots: int = 3,
    park_tokens: int = 10_000,
    max_len: int = 96,
    trace: bool = False,
    decode_graph: bool = False,
    **cfg: object,
):
    model = _model()
    engine = Engine(
        model, EOS, num_slots=slots, max_len=max_len, trace=trace, decode_graph=decode_graph
    )
    engine.park = KVPark(park_tokens)
    cfg.setdefault("isolation", "thread")  # the test reads what its environments recorded
    runner = EpisodeRunner(
        lambda p: envs[p.id], params, EnvConfig(**cfg), max_len, on_end=engine.park.discard
    )
    items = [(Prompt(str(k), "", None), str(k), 100 + n) for n, k in enumerate(envs)]
    try:
        eps = run_episodes(engine, runner, items)
    finally:
        runner.close()
    return model, engine, {e.key: e for e in eps}


def test_trained_tokens_are_exactly_the_models_and_logprobs_match_the_trainer() -> None:
    envs = {str(i): Scripted(i) for i in range(5)}
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    model, engine, eps = _run(envs, params)
    assert sorted(eps) == sorted(envs) and all(
        (e.stats.end, e.finish) == _env_end(e) for e in eps.values()
    )
    samples = [eps[k].sample() for k in sorted(eps)]
    for s, k in zip(samples, sorted(eps)):
        env = envs[k]
        assert len(env.actions) == 3 and s.reward == 1.0 and s.episode is not None
        assert s.episode.turns == 3 and s.episode.tool_calls == 2
        # token in, token out: the sequence is the prompt, each turn and each observation
        a = env.actions
        assert s.prompt_tokens == [2, 3, 4 + int(k)]
        assert s.completion_tokens == a[0] + [6] * 3 + a[1] + [7] * 4 + a[2]
        assert s.model_mask_T == [True] * len(a[0]) + [False] * 3 + [True] * len(a[1]) + [
            False
        ] * 4 + [True] * len(a[2])
        assert s.episode.env_tokens == 7 and s.model_tokens == sum(map(len, a))
    batch = collate(samples, [1.0] * len(samples), list(range(len(samples))), pad_id=0)
    for r, k in enumerate(sorted(eps)):
        trained = batch.targets[r][batch.loss_mask[r]].tolist()
        assert trained == [t for turn in envs[k].actions for t in turn]  # exactly the model's
        assert (batch.versions[r][~batch.loss_mask[r]] == -1).all()
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, 1.0)
    mask = batch.loss_mask
    assert int(mask.sum()) == sum(s.model_tokens for s in samples) > 40
    # 1e-5 absolute plus 1e-5 relative: on this model (logits of a few units) the engine and the
    # trainer each differ from a float64 recompute by up to ~1.8e-5, and from each other by up
    # to ~1.05e-5 at log-probs near -2.3, parked KV or not (the single-turn parity test of
    # tests/test_engine.py shows the same 1.1e-5 here); the relative part covers that, nothing
    # more (4.5e-6 relative)
    torch.testing.assert_close(logp[mask], batch.behavior_logp[mask], atol=1e-5, rtol=1e-5)
    assert engine.park is not None and engine.park.stats.restored > 0  # turns resumed from KV
    assert engine.park.used == 0 and not engine.park.entries  # nothing left parked


@pytest.mark.parametrize(
    ("park_tokens", "decode_graph"), [(10_000, False), (0, False), (10_000, True)]
)
def test_a_parked_sequence_resumes_with_the_tokens_of_an_unparked_run(
    park_tokens: int, decode_graph: bool
) -> None:
    """Greedy: every turn after the first equals a fresh generate() of its whole history
    (KV restored from the park, or re-prefilled; ragged decode steps, or fixed-shape ones)."""
    envs = {str(i): Scripted(i, turns=3) for i in range(4)}
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    model, engine, eps = _run(
        envs, params, slots=2, park_tokens=park_tokens, decode_graph=decode_graph
    )
    assert engine.park is not None
    assert (engine.park.stats.restored > 0) == (park_tokens > 0)
    fresh = Engine(model, EOS, num_slots=4, max_len=96)
    for k, ep in eps.items():
        a = envs[k].actions
        for t in (1, 2):  # turn t's history: the sequence up to where that turn starts
            start = len(ep.prompt_tokens) + sum(map(len, a[:t])) + sum(i + 3 for i in range(t))
            history = (ep.prompt_tokens + ep.tokens)[:start]
            (ref,) = fresh.generate([Request(history, params)])
            assert ref.tokens == a[t], (k, t)


def test_the_engine_keeps_decoding_while_one_environment_step_sleeps() -> None:
    sleeper = Scripted(0, turns=2, sleep_s=0.3)
    envs: dict[Hashable, Scripted] = {"0": sleeper}
    envs.update({str(i): Scripted(i, turns=6) for i in range(1, 12)})
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    _, engine, eps = _run(envs, params, slots=4, max_len=128, trace=True, max_tokens=120)
    assert all((e.stats.end, e.finish) == _env_end(e) for e in eps.values())
    assert sleeper.slept is not None and eps["0"].stats.env_time_s >= 0.3
    t0, t1 = sleeper.slept
    during = [n for t, n in engine.stats.active_trace if t0 <= t <= t1]
    busy = sum(during) / (len(during) * engine.num_slots) if during else 0.0
    # the other 11 episodes (6 turns of up to 12 tokens) fill the 4 slots while it sleeps
    assert len(during) >= 20, len(during)
    assert busy >= 0.7, busy


def test_budgets_failures_and_timeouts_end_an_episode_once_with_its_reason() -> None:
    class Raises(Scripted):
        def step(self, action_tokens: list[int]) -> StepResult:
            raise RuntimeError("tool crashed")

    class Slow(Scripted):
        def step(self, action_tokens: list[int]) -> StepResult:
            time.sleep(0.5)
            return super().step(action_tokens)

    class Async(Scripted):
        async def step(self, action_tokens: list[int]) -> StepResult:  # type: ignore[override]
            await asyncio.sleep(0.001)
            return Scripted.step(self, action_tokens)

    envs: dict[Hashable, Scripted] = {
        "turns": Scripted(0, turns=10),
        "raises": Raises(1),
        "slow": Slow(2),
        "async": Async(3, turns=2),
    }
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    _, _, eps = _run(envs, params, max_turns=3, step_timeout_s=0.2, workers=4)
    ends = {k: (e.stats.end, e.reward, e.finish) for k, e in eps.items()}
    assert ends == {
        "turns": ("max_turns", 0.0, FinishReason.LENGTH),
        "raises": ("error", 0.0, FinishReason.ABORTED),
        "slow": ("timeout", 0.0, FinishReason.ABORTED),
        "async": (*_env_end(eps["async"])[:1], 1.0, _env_end(eps["async"])[1]),
    }
    assert "tool crashed" in eps["raises"].error and eps["turns"].stats.turns == 3


@pytest.mark.parametrize("reward", [math.nan, math.inf, None, "1"])
def test_a_reward_that_is_not_a_finite_number_ends_the_episode_as_an_error(reward: object) -> None:
    """Before, a NaN reward was summed into the episode's (and made its group's advantages
    NaN); now the episode ends `error`, scored 0, with the value in its message."""

    class Bad(Scripted):
        def step(self, action_tokens: list[int]) -> StepResult:
            return StepResult(reward=reward, done=True)  # type: ignore[arg-type]

    class Scalar(Scripted):  # a numpy or torch scalar is a number: kept
        def step(self, action_tokens: list[int]) -> StepResult:
            return StepResult(reward=torch.tensor(0.5), done=True)  # type: ignore[arg-type]

    envs: dict[Hashable, Scripted] = {"bad": Bad(0), "good": Scripted(1, turns=1), "t": Scalar(2)}
    _, _, eps = _run(envs, SamplingParams(temperature=1.0, max_new_tokens=4))
    assert (eps["bad"].stats.end, eps["bad"].reward) == ("error", 0.0)
    assert repr(reward) in eps["bad"].error and "not a finite number" in eps["bad"].error
    assert (eps["good"].stats.end, eps["good"].reward) == (_env_end(eps["good"])[0], 1.0)
    assert (eps["t"].stats.end, eps["t"].reward) == (_env_end(eps["t"])[0], 0.5)


def test_token_budget_ends_the_episode() -> None:
    envs: dict[Hashable, Scripted] = {"a": Scripted(0, turns=10)}
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    _, _, eps = _run(envs, params, max_tokens=12)
    e = eps["a"]
    assert e.stats.end == "max_tokens" and len(e.tokens) <= 12


def test_the_last_turn_resumes_from_parked_kv_too() -> None:
    """The last turn (`env.max_turns`) is not parked when it ends, but its history was, at the
    end of the turn before: it is restored (before, a request not parking itself skipped the
    restore, so each episode's last turn re-prefilled its whole history)."""
    envs = {str(i): Scripted(i, turns=2) for i in range(3)}
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    model, engine, eps = _run(envs, params, slots=3, max_turns=2)
    assert engine.park is not None
    assert all(e.stats.end == _env_end(e)[0] and e.stats.turns == 2 for e in eps.values())
    assert engine.park.stats.saved == 3 and engine.park.stats.restored == 3
    assert not engine.park.entries and engine.park.used == 0
    fresh = Engine(model, EOS, num_slots=3, max_len=96)
    for k, ep in eps.items():  # the restored turn is a fresh generation's
        first = envs[k].actions[0]
        history = (ep.prompt_tokens + ep.tokens)[: len(ep.prompt_tokens) + len(first) + 3]
        (ref,) = fresh.generate([Request(history, params)])
        assert ref.tokens == envs[k].actions[1], k


def test_an_episode_carries_kept_logmass_with_zeros_for_environment_tokens() -> None:
    from slipstream.engine import Completion
    from slipstream.schedule.episodes import Episode

    def turn(n: int, mass: list[float] | None) -> Completion:
        req = Request([2], SamplingParams(1.0, top_p=0.9))
        return Completion(req, [3] * n, [-1.0] * n, [0] * n, FinishReason.STOP, 0, 0, mass)

    ep = Episode(key=0, prompt=Prompt("p", "q", "a"), seed=0, prompt_tokens=[2])
    ep.add_turn(turn(2, None))  # a turn without filtering: nothing recorded yet
    ep.add_observation(Observation([5]))
    ep.add_turn(turn(2, [-0.1, -0.2]))
    ep.add_observation(Observation([6, 7]))
    s = ep.sample()
    assert s.kept_logmass_T == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0]
    plain = Episode(key=1, prompt=Prompt("p", "q", "a"), seed=0, prompt_tokens=[2])
    plain.add_turn(turn(2, None))
    plain.add_observation(Observation([5]))
    assert plain.sample().kept_logmass_T is None


def _scripted(env: Scripted, turns: list[list[int]], max_len: int = 96, **cfg: object) -> Episode:
    """Drive one episode of `env` with the model turns `turns` (no engine): each is cut at its
    request's `max_new_tokens` (finish LENGTH), else ends at its EOS (finish STOP)."""
    cfg.setdefault("isolation", "thread")
    params = SamplingParams(1.0, max_new_tokens=4)
    runner = EpisodeRunner(lambda p: env, params, EnvConfig(**cfg), max_len)

    def finish(out: list[int]) -> FinishReason:
        return FinishReason.STOP if out[-1] == EOS else FinishReason.LENGTH

    return drive_episode(runner, Prompt("p", "", None), turns, finish)


@pytest.mark.parametrize(
    ("cap", "end"),
    [({}, "max_tokens"), ({"max_tokens": 7}, "max_tokens"), ({"max_len": 10}, "length")],
)
def test_an_episode_the_environment_ends_after_a_cut_turn_ends_on_that_budget(
    cap: dict[str, int], end: str
) -> None:
    """Before, `done` from the environment always ended the episode `done` (STOP), even when
    its last turn was cut by `max_new_tokens`, `env.max_tokens` or the context, so
    `filters.overlong` never saw it; now it ends on that budget, LENGTH, the reward kept."""
    ep = _scripted(Scripted(0, turns=2), [[3, EOS], [4, 4, 4, 4, 4, EOS]], **cap)
    assert (ep.stats.end, ep.finish, ep.reward) == (end, FinishReason.LENGTH, 1.0)
    assert ep.tokens[-1] != EOS and ep.stats.turns == 2
    whole = _scripted(Scripted(0, turns=2), [[3, EOS], [4, EOS]])
    assert (whole.stats.end, whole.finish, whole.reward) == ("done", FinishReason.STOP, 1.0)


def test_the_first_observations_time_is_kept_out_of_the_steps() -> None:
    """Before, the time of building an environment and its first observation was summed into
    `env_time_s` (`env/time_per_turn_s`); now it is `reset_time_s` (`env/reset_s`)."""

    class SlowReset(Scripted):
        def initial_observation(self) -> Observation:
            time.sleep(0.3)
            return super().initial_observation()

    ep = _scripted(SlowReset(0, turns=2), [[3, EOS], [4, EOS]])
    assert ep.stats.reset_time_s >= 0.3 and ep.stats.env_time_s < 0.1
