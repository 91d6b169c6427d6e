"""The records that flow through slipstream: `Sample`, `Group`, `Batch`.

One name per concept, everywhere. A policy *version* is the trainer's optimizer step
count; the *lag* of a token is `trainer_version - token_version` when the trainer uses it.
Shape suffixes follow the tinker-cookbook habit: `_T` per completion token, `_G` per group
member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: reward worker processes import this module without torch
    import torch


class FinishReason(StrEnum):
    """Why generation of a sample ended."""

    STOP = "stop"  # produced the end-of-sequence token
    LENGTH = "length"  # hit max_new_tokens
    ABORTED = "aborted"  # cut short by the sampler (staleness bound, redundant rollout)


@dataclass(frozen=True)
class TrainerState:
    """What a TRL-shaped reward function gets as `trainer_state` (TRL passes the trainer's
    `transformers.TrainerState`), in the fields slipstream can give: `global_step`, the policy
    version of the weights that score the completion (in a sampler, the version it holds when
    the group is scored: some of its tokens may be older; in an evaluation, the version
    evaluated); `max_steps`, the run's `run.steps`; `epoch`, always None: a sampler does not
    know where the trainer's prompt stream is (TRL's `epoch` is None before training too)."""

    global_step: int
    max_steps: int
    epoch: float | None = None


class CompletionText(str):
    """A completion's decoded text that carries its token ids (`token_ids`), what TRL passes
    a reward function as `completion_ids`, and the `TrainerState` it is scored at
    (`trainer_state`, None where unknown). A tool episode's also carries its messages after
    the prompt (`messages`, None for a single turn): what TRL passes a reward function as a
    conversational episode's completion (envs.tool_env). It is the text (a `str`) to
    everything else, and pickles with all of them to a reward worker process."""

    token_ids: tuple[int, ...]
    trainer_state: TrainerState | None
    messages: tuple[dict[str, Any], ...] | None

    def __new__(
        cls,
        text: str,
        token_ids: list[int] | tuple[int, ...],
        trainer_state: TrainerState | None = None,
        messages: list[dict[str, Any]] | tuple[dict[str, Any], ...] | None = None,
    ) -> CompletionText:
        self = super().__new__(cls, text)
        self.token_ids = tuple(token_ids)
        self.trainer_state = trainer_state
        self.messages = None if messages is None else tuple(messages)
        return self

    def __reduce__(
        self,
    ) -> tuple[
        type[CompletionText],
        tuple[str, tuple[int, ...], TrainerState | None, tuple[dict[str, Any], ...] | None],
    ]:
        return CompletionText, (str(self), self.token_ids, self.trainer_state, self.messages)


class TurnTokens(list[int]):
    """A model turn's token ids (a `list`, what `Env.step` gets) that carry the `TrainerState`
    the turn ended at (`trainer_state`: the version of the weights its engine held then, as a
    single-turn sample's is the version that scores it; None where unknown). `ToolEnv` gives
    it to the episode's reward; it pickles with it to an environment worker process."""

    trainer_state: TrainerState | None

    def __init__(self, ids: list[int], trainer_state: TrainerState | None = None) -> None:
        super().__init__(ids)
        self.trainer_state = trainer_state

    def __reduce__(self) -> tuple[type[TurnTokens], tuple[list[int], TrainerState | None]]:
        return TurnTokens, (list(self), self.trainer_state)


@dataclass
class Prompt:
    """One task item: the text the model sees and what the verifier needs to score it."""

    id: str
    text: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)
    # the conversation `text` is the chat template's rendering of (generation prompt opened),
    # which holds its own special tokens; None: `text` is plain text, encoded with the
    # tokenizer's BOS/EOS (model.tokenizer)
    messages: list[dict[str, Any]] | None = None
    # a string row's prompt (after `task.prompt_template`) that the chat template rendered as
    # the one user turn: TRL-style rewards get it and string completions, as TRL does for a
    # standard (not conversational) dataset; None: the row was a conversation, or plain text
    plain_prompt: str | None = None


@dataclass
class EpisodeStats:
    """How a multi-turn episode went (slipstream.envs); `end` is why it ended:

    `done` (the environment said so), `max_turns`, `max_tokens` (budgets of the `env` config),
    `length` (the engine's context is full), `timeout` (a step ran past `env.step_timeout_s`),
    `error` (the environment raised), `crash` (the worker process holding it died), `aborted`
    (cut by the sampler).
    """

    turns: int = 0  # model turns
    tool_calls: int = 0  # calls the model made (past ToolEnv's max_calls_per_turn included)
    tool_errors: int = 0  # of them, not answered by their tool's result: a bad call, a tool
    # that raised or hit a sandbox limit, a call past the cap (refused, never run)
    env_time_s: float = 0.0  # wall time of the environment's steps, summed
    reset_time_s: float = 0.0  # wall time of building it and its first observation
    env_tokens: int = 0  # tokens the environment appended (never trained)
    end: str = "done"


@dataclass
class Sample:
    """One completion of one prompt, with what the trainer needs to correct for staleness.

    `behavior_logp_T[t]` is log p(token_t | prefix) under the weights that produced token t
    (the temperature-scaled full softmax, see engine.sampling); `versions_T[t]` is that
    weights' version. With top-k / top-p on, `kept_logmass_T[t]` is log Z of the kept set, so
    the exact behaviour log-prob is `behavior_logp_T[t] - kept_logmass_T[t]`
    (`trainer.behavior_logprobs`); None without them (Z = 1).
    """

    prompt_id: str
    prompt_tokens: list[int]
    completion_tokens: list[int]
    behavior_logp_T: list[float]
    versions_T: list[int]
    finish_reason: FinishReason
    completion_text: str = ""
    reward: float = 0.0
    sampler_id: int = 0
    seed: int | None = None
    # Wall-clock seconds: when the prompt was admitted and when the sample finished.
    t_start: float = 0.0
    t_end: float = 0.0
    # why the verifier failed on this sample, which then scored 0 (tasks.guard.ERRORS); "" if it did not
    reward_error: str = ""
    # each reward function's value by metric name (`reward/<name>`; tasks.rewards), when the
    # reward combines several or returned a dict; the mean per step is logged
    reward_parts: dict[str, float] = field(default_factory=dict)
    # Multi-turn episodes (slipstream.envs): True where the model produced the token, False for
    # environment tokens (tool output, user turns), which carry no loss, log-prob 0 and the
    # version of the model token before them. None: every completion token is the model's.
    model_mask_T: list[bool] | None = None
    episode: EpisodeStats | None = None
    # log Z per token of the top-k / top-p set the token was drawn from (0 for environment
    # tokens); None: no filter (a record written before the field reads back as None)
    kept_logmass_T: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_tokens)
        if len(self.behavior_logp_T) != n or len(self.versions_T) != n:
            raise ValueError(
                f"Sample {self.prompt_id}: {n} tokens but {len(self.behavior_logp_T)} logprobs "
                f"and {len(self.versions_T)} versions"
            )
        if isinstance(self.episode, dict):  # read back from JSON (checkpoints, replay)
            self.episode = EpisodeStats(**self.episode)
        if self.model_mask_T is not None and len(self.model_mask_T) != n:
            raise ValueError(
                f"Sample {self.prompt_id}: {n} tokens but a model mask of {len(self.model_mask_T)}"
            )
        if self.kept_logmass_T is not None and len(self.kept_logmass_T) != n:
            raise ValueError(
                f"Sample {self.prompt_id}: {n} tokens but {len(self.kept_logmass_T)} kept masses"
            )

    @property
    def num_tokens(self) -> int:
        """Tokens after the prompt, the environment's included (the sequence's length)."""
        return len(self.completion_tokens)

    @property
    def model_tokens(self) -> int:
        """Tokens the model produced: the ones trained."""
        m = self.model_mask_T
        return len(self.completion_tokens) if m is None else sum(m)

    @property
    def oldest_version(self) -> int | None:
        """Version of the oldest model token (the one that bounds this sample's staleness);
        None without a model token (an episode that ended before the model's first turn:
        nothing of it was generated, so nothing of it is stale)."""
        m = self.model_mask_T
        v = self.versions_T if m is None else [x for x, k in zip(self.versions_T, m) if k]
        return min(v) if v else None


@dataclass
class Group:
    """The G samples of one prompt, and their advantages once computed."""

    prompt: Prompt
    samples: list[Sample]
    advantages_G: list[float] | None = None
    # samples overlong `mask_loss` took out after advantages (algo.filters.without_truncated):
    # no token in the loss, but sequences of the step's per-sequence normaliser, as in TRL
    masked: int = 0

    @property
    def rewards_G(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @property
    def oldest_version(self) -> int | None:
        """Version of the oldest model token of any sample; None without one."""
        return min((v for s in self.samples if (v := s.oldest_version) is not None), default=None)

    def lag(self, version: int) -> int:
        """Versions the oldest model token is behind `version`: the lag the staleness bound
        acts on. 0 without a model token (a sample without one was counted as version 0, and
        its whole group dropped as stale)."""
        oldest = self.oldest_version
        return 0 if oldest is None else version - oldest


@dataclass
class Batch:
    """Padded tensors for one optimizer step (or one micro-batch of it).

    Rows are samples; columns are positions of prompt + completion, right-padded.
    `loss_mask` marks completion tokens that count. All `[B, T]` tensors are aligned on the
    *predicted* token: column t holds the token at position t+1 of `input_ids`, so that
    `logits[:, t]` scores `targets[:, t]`.
    """

    input_ids: torch.Tensor  # [B, T+1] long: prompt + completion + padding
    targets: torch.Tensor  # [B, T] long: input_ids shifted left by one
    loss_mask: torch.Tensor  # [B, T] bool
    behavior_logp: torch.Tensor  # [B, T] float, 0 outside the mask
    versions: torch.Tensor  # [B, T] long, -1 outside the mask
    advantages: torch.Tensor  # [B] float
    group_ids: torch.Tensor  # [B] long

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def slice(self, rows: slice) -> Batch:
        """A micro-batch: the rows in `rows`, trimmed to their longest sequence."""
        mask = self.loss_mask[rows]
        used = mask.any(dim=0).nonzero()
        width = int(used.max()) + 1 if used.numel() else 1
        return Batch(
            input_ids=self.input_ids[rows, : width + 1],
            targets=self.targets[rows, :width],
            loss_mask=mask[:, :width],
            behavior_logp=self.behavior_logp[rows, :width],
            versions=self.versions[rows, :width],
            advantages=self.advantages[rows],
            group_ids=self.group_ids[rows],
        )
