"""Config sections of what is trained on: the model, the task, sampling, evaluation, warm start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from slipstream.config.base import _Section
from slipstream.engine.request import MIN_TEMPERATURE

# the chat template's variables slipstream sets itself on every rendering
RENDER_ARGUMENTS = ("messages", "tools", "documents", "add_generation_prompt")


def _same_data(a: str, b: str) -> bool:
    """Whether two `task.path`-style values name the same file, folder or hub id."""
    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return os.path.normpath(a) == os.path.normpath(b)


class ModelSection(_Section):
    path: str | None = None
    """Hugging Face model folder (config.json, *.safetensors, tokenizer.json). None: the
    built-in tiny model, warm-started on the built-in task and cached."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype. `bfloat16`: the trainer keeps float32 master weights and AdamW state
    and runs its products in bfloat16 (train.precision); samplers hold bfloat16 weights;
    checkpoints are written in bfloat16. Their log-probs then differ slightly from the
    trainer's: the behaviour weight and `mismatch/kl` of the loss account for it."""


class RewardEntry(_Section):
    fn: str
    """`math_verify`, `exact`, `module:function` or `path/to/file.py:function`."""
    weight: float = 1.0
    """Its weight in the total reward: the sum of weight x value over the functions that apply
    to the sample (a TRL-style function returns None, or NaN, where it does not)."""
    name: str | None = None
    """Its metric name, `reward/<name>`; default the function's name."""
    shape: Literal["auto", "slipstream", "trl", "verl"] = "auto"
    """How it is called. `slipstream`: `fn(prompt: Prompt, completion: str) -> float`. `trl`:
    batched `fn(prompts, completions, **columns) -> list[float | None]`, called with one
    sample at a time (prompts as messages and completions as `[{"role": "assistant",
    "content": ...}]` for a conversation row, strings for a string prompt even when a chat
    template renders it, as TRL; every other column of the row by name).
    `verl`: `fn(data_source, solution_str, ground_truth, extra_info) -> float | dict`, a dict's
    `score` being the reward and its other numbers logged as `reward/<name>/<key>`. `auto`: by
    the parameter names (`prompts`/`completions`: trl; `solution_str`/`data_source`: verl)."""


class TaskConfig(_Section):
    kind: Literal["builtin", "builtin_tools", "dataset", "jsonl"] = "builtin"
    """`builtin`: running sums of digits (heavy-tailed lengths). `builtin_tools`: running sums
    of numbers up to 99 with a calculator tool of heavy-tailed latency, multi-turn
    (slipstream.envs.builtin; `env.tool_latency_*`). `dataset` (or its old name `jsonl`): the
    rows of `path`. Setting `path` selects `dataset`; a built-in kind with a `path` is an
    error."""
    path: str | None = None
    """Training rows: a JSONL, JSON, Parquet or CSV file, a folder of them, or a hub dataset id
    (`owner/name`, where the network allows it). Parquet, CSV and hub ids need the datasets
    library (`pip install 'slipstream[data]'`)."""
    split: str = "train"
    """The split of a folder (files whose path names it: `train.jsonl`, `data/test-0.parquet`)
    or of a hub dataset; a single file is all one split."""
    dataset_config: str | None = None
    """A hub dataset's config name, for one of several (`openai/gsm8k`'s `main`), as TRL's
    `dataset_config` and `load_dataset(path, name)`; used for `path` and `heldout_path`."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Your file's column names for `prompt`, `messages`, `answer` and `id`, e.g.
    `{prompt = "problem", answer = "solution"}`. Defaults: `messages`, else `prompt` (a string,
    or a list of messages as verl's files have it); verl's `reward_model.ground_truth`, else
    `answer`, `ground_truth` or `solution`. Every other column travels with the prompt to the
    reward."""
    chat_template: str = "auto"
    """`auto`: render prompts with the model's own chat template when it has one (as
    `apply_chat_template(..., add_generation_prompt=True)`), plain text otherwise. `none`: plain
    text (`prompt_template`). Or a path to a Jinja template file, which checkpoints then save
    as their tokenizer_config.json's `chat_template`."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Variables passed to every rendering of the chat template, training and evaluation
    prompts alike, as `apply_chat_template(..., **kwargs)` and TRL's / vLLM's
    `chat_template_kwargs`: `{enable_thinking = false}` for Qwen3 (needs a chat template; not
    `messages`, `tools`, `documents` or `add_generation_prompt`). Not saved in checkpoints:
    pass the same ones when you prompt a checkpoint."""
    system_prompt: str | None = None
    """A system turn put first in every conversation that has none (needs a chat template)."""
    heldout_path: str | None = None
    """Held-out rows (a file or folder as `path`); None holds out `heldout_split` or else
    `heldout_fraction` of `path`."""
    heldout_split: str | None = None
    """The split of `path` (or of `heldout_path`) held out, e.g. `test` of a folder or hub
    dataset; None: `heldout_fraction` of the training split, or, of `heldout_path`, the whole
    file, or the folder's or hub dataset's `split` (a folder of unnamed files: all of them).
    `split` itself of the same data is an error (those rows are trained on)."""
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of `path` held out for evaluation when there is no `heldout_path` (above 0: at
    least one row of a file of two or more). 0: no held-out rows, and no held-out metric
    (`heldout_acc`); `eval.sets` are still scored."""
    heldout_seed: int = 0
    """Seed of the held-out split, independent of `run.seed`: runs of different seeds are
    evaluated on the same prompts."""
    reward: str | None = None
    """`math_verify` (math answers compared by the math-verify library; the default when
    neither this nor `rewards` is set), `exact` (string equality after stripping), or a Python
    reward function `module:function` or `path/to/file.py:function` in any shape of `rewards`
    (shape `auto`)."""
    rewards: list[RewardEntry] = Field(default_factory=list)
    """Several weighted reward functions instead of `reward`, each logged as `reward/<name>`:
    `rewards = [{fn = "rewards.py:fmt", weight = 0.2}, {fn = "math_verify"}]`."""
    reward_isolation: Literal["auto", "process", "inline"] = "auto"
    """Where the reward runs. `process`: in a worker subprocess, so a reward that hangs, spins in C
    or crashes the interpreter costs one sample (its worker is killed and replaced), not the run;
    one round trip per group. `inline`: in the sampler itself, no IPC and no timeout. `auto`:
    `process` for your own `module:function` / `file.py:function`, `inline` for the built-in task,
    `exact` and `math_verify`."""
    reward_timeout_s: float = Field(10.0, gt=0.0)
    """Longest a reward may take on one completion, in isolation `process`; past it the worker
    is killed and the sample counts as a `timeout` error. The first call in each worker process
    may take as long as the worker's start (120 s), for a reward that imports or connects on its
    first call."""
    reward_errors: Literal["zero", "fail"] = "zero"
    """A reward that raises, returns NaN, inf or a non-number, times out or crashes its worker:
    `zero` scores the sample 0 and counts it (metrics `reward/errors_raised`, `_invalid`,
    `_timeout`, `_crashed`); `fail` stops the run with an error naming the reward, the prompt
    and what happened."""
    prompt_template: str = "{prompt}"
    """How a row's string prompt becomes the model's input text (`{prompt}`, which it must
    hold, is replaced; other braces are kept as written). A conversation row is not put
    through it."""
    max_train_prompts: int | None = Field(None, ge=1)
    """Train on the first N training prompts only (None: all). A small pool makes prompts
    recur within a run, as epochs over a fixed dataset do: that is where the pass-rate band
    and adaptive group sizes, which track each prompt's pass rate, have something to act on."""

    @model_validator(mode="before")
    @classmethod
    def _path_selects_dataset(cls, raw: Any) -> Any:
        """A `path` with no `kind` means the dataset; with `kind = "builtin"` it is a conflict."""
        if isinstance(raw, dict) and raw.get("path") is not None:
            if raw.get("kind") in ("builtin", "builtin_tools"):
                raise ValueError(
                    f"task.kind: {raw['kind']!r} trains a built-in task, which has no task.path; "
                    "drop task.kind (task.path selects the dataset) or task.path"
                )
            raw = {**raw, "kind": raw.get("kind", "dataset")}
        return raw

    @model_validator(mode="after")
    def _prompt_in_template(self) -> TaskConfig:
        if "{prompt}" not in self.prompt_template:
            raise ValueError(
                f"task.prompt_template: {self.prompt_template!r} has no {{prompt}}, so every "
                'prompt would be this same text; e.g. "Question: {prompt} Answer:"'
            )
        return self

    @model_validator(mode="after")
    def _template_kwargs(self) -> TaskConfig:
        taken = sorted(set(self.chat_template_kwargs) & set(RENDER_ARGUMENTS))
        if taken:
            raise ValueError(
                f"task.chat_template_kwargs: {taken[0]!r} is set by slipstream itself "
                f"(reserved: {', '.join(RENDER_ARGUMENTS)})"
            )
        return self

    @model_validator(mode="after")
    def _heldout_not_trained_on(self) -> TaskConfig:
        """A held-out split that is the training split of the same data is trained on."""
        if self.heldout_split != self.split or self.path is None:
            return self
        if self.heldout_path is None or _same_data(self.heldout_path, self.path):
            raise ValueError(
                f"task.heldout_split: {self.split!r} is task.split of the same data, so the "
                "held-out rows would be trained on; name another split, or to score the "
                f'training rows use eval.sets={{train="{self.path}"}}'
            )
        return self

    @model_validator(mode="after")
    def _one_reward_setting(self) -> TaskConfig:
        if self.rewards and self.reward is not None:
            raise ValueError("task.rewards: set task.reward or task.rewards, not both")
        if self.kind not in ("builtin", "builtin_tools") and not self.path:
            raise ValueError(f"task.path: required when task.kind = {self.kind!r}")
        return self

    def reward_entries(self) -> list[RewardEntry]:
        """The reward functions in force: `rewards`, else `reward` (default math_verify)."""
        return self.rewards or [RewardEntry(fn=self.reward or "math_verify")]


class SamplingConfig(_Section):
    group_size: int = Field(8, ge=1)
    """G: completions sampled per prompt."""
    temperature: float = Field(0.6, ge=MIN_TEMPERATURE)
    """Sampling temperature (at least 1e-4: the sampler scales logits in float32); log-probs
    are recorded, and the trainer evaluates, the temperature-scaled distribution, so RL
    optimises the policy that is sampled. The sampling defaults of a model folder's
    generation_config.json (temperature, top_p, top_k) are not read: `sampling.temperature`,
    `top_p` and `top_k` apply, as TRL's own settings do."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling; below 1 it biases the importance ratio (see engine.sampling). Not
    generation_config.json's top_p, which is not read."""
    top_k: int = Field(0, ge=-1)
    """Keep only the k most likely tokens; 0 keeps all, and so does -1 (vLLM's "no limit"),
    which is read as 0. Not generation_config.json's top_k, which is not read."""
    max_new_tokens: int = Field(64, ge=1)
    """Longest completion; longer ones are cut and marked `length`. 64 for the built-in model;
    with a `model.path` the default is TRL's max_completion_length, 256."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a completion besides the model's own stop tokens (every
    `eos_token_id` of generation_config.json and config.json, tokenizer_config.json's
    `eos_token`). Like a stop token, the string's tokens stay in the trained completion (so the
    model learns to stop) and are cut from the text the reward sees. An added token
    (`<|im_start|>`) is a stop token; any other string is matched on the text, as vLLM does:
    the completion ends at the token that completes it, however the tokens split it."""
    adaptive_group_size: bool = False
    """Vary G per prompt within the same budget of B x `group_size` samples: prompts with a low
    running pass rate get more samples than easy ones, so that hard prompts still get a group
    with a success and a failure (schedule.group_size, Knapsack RL). Unseen prompts count as
    pass rate 0.5. Off: every prompt gets `group_size`."""
    group_size_min: int = Field(2, ge=1)
    """Smallest group with `adaptive_group_size` (at most `group_size`)."""
    group_size_max: int = Field(32, ge=1)
    """Largest group with `adaptive_group_size` (at least `group_size`)."""

    @field_validator("top_k")
    @classmethod
    def _no_limit(cls, k: int) -> int:
        return max(k, 0)  # vLLM's -1 is this sampler's 0: keep all


class EvalConfig(_Section):
    every: int = Field(20, ge=1)
    """Held-out evaluation every this many steps (and at the start and end)."""
    num_prompts: int = Field(256, ge=1)
    """Held-out prompts evaluated (at most the split's size), of each set."""
    samples_per_prompt: int = Field(1, ge=1)
    """n: completions per held-out prompt. Reported: `heldout/mean@n` (mean reward),
    `heldout/pass@1` (share of samples that pass, the unbiased pass@1) and, for n > 1,
    `heldout/pass@n` (share of prompts with a passing sample; Chen et al. 2021's estimator)."""
    temperature: float = Field(0.0, ge=0.0)
    """0: greedy. Above 0 (needed for n > 1; at least 1e-4), sampled with `sampling.top_p`
    and `top_k`."""
    pass_threshold: float = 1.0
    """A held-out sample passes when its reward is at least this (pass@k)."""
    sets: dict[str, str] = Field(default_factory=dict)
    """More held-out sets, `{name = path}` (files, folders or hub ids as `task.path`, rendered
    the same way), each reported as `heldout/<name>/pass@1` and so on."""
    split: str = "test"
    """The split `eval.sets` read from a folder or hub dataset (a folder whose files name no
    split is read whole)."""

    @model_validator(mode="after")
    def _sampled_when_several(self) -> EvalConfig:
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"eval.temperature: 0 (greedy) or at least {MIN_TEMPERATURE}")
        if self.samples_per_prompt > 1 and self.temperature == 0.0:
            raise ValueError(
                "eval.samples_per_prompt: n > 1 greedy samples are all the same; set eval.temperature > 0"
            )
        bad = [k for k in self.sets if not k or "/" in k]
        if bad:
            raise ValueError(f"eval.sets: a set name must be non-empty without '/', got {bad[0]!r}")
        return self


class WandbConfig(_Section):
    project: str = "slipstream"
    """The W&B project (with `run.sinks` including `wandb`)."""
    entity: str | None = None
    """Your W&B user or team; None: your default entity."""
    name: str | None = None
    """The run's name; None: the run folder's name."""
    tags: list[str] = Field(default_factory=list)
    """Tags of the W&B run."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """`offline` (default): logged to RUN_DIR/wandb, no network or account; upload later with
    `wandb sync`. `online`: streamed to W&B (needs `wandb login`)."""


class WarmstartConfig(_Section):
    target_acc: float | None = Field(None, gt=0.0, lt=1.0)
    """Supervised warm start of the built-in model stops once held-out accuracy reaches this.
    None: the task's own (`TARGET_ACC`): 0.1 on the built-in task, 0.25 on `builtin_tools`,
    whose greedy episodes must copy the call and the tool's reply exactly: below about 0.2 most
    groups of episodes all fail and RL has little signal (docs/measurements.md, the built-in
    agentic task)."""
    max_steps: int = Field(3000, ge=1)
    lr: float = Field(3e-3, gt=0.0, lt=1.0)
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    """Where the warm-started model is cached; default ~/.cache/slipstream."""
    seed: int | None = Field(None, ge=0)
    """Seed of the warm start (its initial weights and batches); None: `run.seed`. Runs of
    several seeds that should start from one warm-started model set it."""

    def for_task(self, kind: str) -> WarmstartConfig:
        """This section with `target_acc` resolved for task `kind` (a set value is kept; the
        built-in task's resolved section dumps as before, so its cache key is unchanged)."""
        if self.target_acc is not None:
            return self
        return self.model_copy(update={"target_acc": TARGET_ACC.get(kind, TARGET_ACC["builtin"])})


# The warm start's default target held-out accuracy per task kind (`warmstart.target_acc`).
TARGET_ACC = {"builtin": 0.1, "builtin_tools": 0.25}
