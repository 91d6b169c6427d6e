"""Config sections of what is trained on: the model, the task, sampling, evaluation, warm start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from slipstream.config.base import _Section


class ModelSection(_Section):
    path: str | None = None
    """Hugging Face model folder (config.json, *.safetensors, tokenizer.json). None: the
    built-in tiny model, warm-started on the built-in task and cached."""


class TaskConfig(_Section):
    kind: Literal["builtin", "builtin_tools", "jsonl"] = "builtin"
    """`builtin`: running sums of digits (heavy-tailed lengths). `builtin_tools`: running sums
    of numbers up to 99 with a calculator tool of heavy-tailed latency, multi-turn
    (slipstream.envs.builtin; `env.tool_latency_*`). `jsonl`: a file of
    {"prompt": ..., "answer": ...} rows."""
    path: str | None = None
    """The JSONL file of training rows (kind = jsonl)."""
    heldout_path: str | None = None
    """A JSONL file of held-out rows; None holds out `heldout_fraction` of `path`."""
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of `path` held out for evaluation when there is no `heldout_path`."""
    reward: str = "math_verify"
    """`math_verify` (math answers compared by the math-verify library), `exact` (string
    equality after stripping), or a Python reward function `module:function` or
    `path/to/file.py:function` taking (prompt: Prompt, completion: str) -> float."""
    reward_isolation: Literal["auto", "process", "inline"] = "auto"
    """Where the reward runs. `process`: in a worker subprocess, so a reward that hangs, spins in C
    or crashes the interpreter costs one sample (its worker is killed and replaced), not the run;
    one round trip per group. `inline`: in the sampler itself, no IPC and no timeout. `auto`:
    `process` for your own `module:function` / `file.py:function`, `inline` for the built-in task,
    `exact` and `math_verify`."""
    reward_timeout_s: float = Field(10.0, gt=0.0)
    """Longest a reward may take on one completion, in isolation `process`; past it the worker
    is killed and the sample counts as a `timeout` error."""
    reward_errors: Literal["zero", "fail"] = "zero"
    """A reward that raises, returns NaN, inf or a non-number, times out or crashes its worker:
    `zero` scores the sample 0 and counts it (metrics `reward/errors_raised`, `_invalid`,
    `_timeout`, `_crashed`); `fail` stops the run with an error naming the reward, the prompt
    and what happened."""
    prompt_template: str = "{prompt}"
    """How a row's prompt becomes the model's input text (`{prompt}` is replaced)."""
    max_train_prompts: int | None = Field(None, ge=1)
    """Train on the first N training prompts only (None: all). A small pool makes prompts
    recur within a run, as epochs over a fixed dataset do: that is where the pass-rate band
    and adaptive group sizes, which track each prompt's pass rate, have something to act on."""


class SamplingConfig(_Section):
    group_size: int = Field(8, ge=1)
    """G: completions sampled per prompt."""
    temperature: float = Field(0.6, gt=0.0)
    """Sampling temperature; log-probs are recorded, and the trainer evaluates, the
    temperature-scaled distribution, so RL optimises the policy that is sampled."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling; below 1 it biases the importance ratio (see engine.sampling)."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens; 0 keeps all."""
    max_new_tokens: int = Field(64, ge=1)
    """Longest completion; longer ones are cut and marked `length`."""
    adaptive_group_size: bool = False
    """Vary G per prompt within the same budget of B x `group_size` samples: prompts with a low
    running pass rate get more samples than easy ones, so that hard prompts still get a group
    with a success and a failure (schedule.group_size, Knapsack RL). Unseen prompts count as
    pass rate 0.5. Off: every prompt gets `group_size`."""
    group_size_min: int = Field(2, ge=1)
    """Smallest group with `adaptive_group_size` (at most `group_size`)."""
    group_size_max: int = Field(32, ge=1)
    """Largest group with `adaptive_group_size` (at least `group_size`)."""


class EvalConfig(_Section):
    every: int = Field(20, ge=1)
    """Greedy held-out accuracy every this many steps (and at the start and end)."""
    num_prompts: int = Field(256, ge=1)
    """Held-out prompts evaluated (at most the split's size)."""


class WarmstartConfig(_Section):
    target_acc: float = Field(0.1, gt=0.0, lt=1.0)
    """Supervised warm start of the built-in model stops once held-out accuracy reaches this."""
    max_steps: int = Field(3000, ge=1)
    lr: float = Field(3e-3, gt=0.0, lt=1.0)
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    """Where the warm-started model is cached; default ~/.cache/slipstream."""
