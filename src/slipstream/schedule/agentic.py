"""Episodes in a run's loops: the runner on an engine, episodes as groups, the per-step
episode metrics.

How the environments of a run are built from its config (`env.tools`, `env.factory`, the
built-in agentic task) and how episodes are evaluated is `run.agentic`; the episode itself
(turns, the environment's steps in workers) is `schedule.episodes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slipstream.config import Config
from slipstream.engine import Engine, SamplingParams
from slipstream.engine.parking import KVPark
from slipstream.envs.base import EnvFactory
from slipstream.envs.workers import Workers
from slipstream.model.tokenizer import Tokenizer
from slipstream.schedule.episodes import Episode, EpisodeRunner
from slipstream.types import Group, Prompt, TrainerState

END_REASONS = (
    "done", "max_turns", "max_tokens", "length", "timeout", "error", "crash", "aborted",
)  # fmt: skip


def make_runner(
    cfg: Config,
    factory: EnvFactory,
    engine: Engine,
    params: SamplingParams,
    workers: Workers | None = None,
) -> EpisodeRunner:
    """An episode runner on `engine`, which gets a KV park of `env.park_kv_tokens`; `workers`
    shared with other runners (None: its own, closed with it). A turn ends at the version
    `engine` holds then (`TrainerState`, with `run.steps`), as a single-turn group is scored."""
    engine.park = KVPark(cfg.env.park_kv_tokens)

    def state() -> TrainerState:
        return TrainerState(engine.version, cfg.run.steps)

    return EpisodeRunner(
        factory, params, cfg.env, engine.max_len, engine.park.discard, workers, state
    )


def episode_group(
    tok: Tokenizer, prompt: Prompt, episodes: list[Episode], sampler_id: int = 0
) -> Group:
    """One group of the G episodes of `prompt`, in member order; each sample's text is the
    whole transcript (`Tokenizer.decode` would stop at the first turn's end)."""
    texts = [tok.text(e.tokens) for e in episodes]
    return Group(prompt, [e.sample(sampler_id, t) for e, t in zip(episodes, texts)])


def episode_metrics(groups: Sequence[Group], trained: Sequence[Group]) -> dict[str, Any]:
    """`env/...` metrics of the episodes among `groups`, every group the step generated
    ({} if there are none); `env/tokens_trained` counts the model tokens of the episodes of
    `trained`, the groups the optimizer step trained on (after the filters; a group the
    filters dropped is not trained, a sample masked out of its group neither, and no group of
    a step the trainer skipped: `ledger.trained_groups`)."""
    eps = [s for g in groups for s in g.samples if s.episode is not None]
    if not eps:
        return {}
    stats = [s.episode for s in eps if s.episode is not None]
    turns = sum(e.turns for e in stats)
    out: dict[str, Any] = {
        "env/episodes": len(stats),
        "env/turns_mean": turns / len(stats),
        "env/tool_calls": sum(e.tool_calls for e in stats),
        "env/tool_errors": sum(e.tool_errors for e in stats),
        "env/time_per_turn_s": sum(e.env_time_s for e in stats) / max(turns, 1),
        "env/reset_s": sum(e.reset_time_s for e in stats) / len(stats),
        "env/tokens_trained": sum(
            s.model_tokens for g in trained for s in g.samples if s.episode is not None
        ),
        "env/tokens_env": sum(e.env_tokens for e in stats),
    }
    for reason in END_REASONS:
        out[f"env/end_{reason}"] = sum(e.end == reason for e in stats)
    return out
