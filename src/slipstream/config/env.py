"""Config section of multi-turn environments: workers, timeouts, budgets, parking."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from slipstream.config.base import _Section


class EnvConfig(_Section):
    tools: str | None = None
    """A tool class as `module:Class` or `path/to/file.py:Class` (slipstream.envs.tools): each
    sample gets a fresh instance, `reset(**row)` with its row, and its public methods as tools.
    None: single-turn (no environment)."""
    factory: str | None = None
    """A token-level environment factory as `module:function` or `path/to/file.py:function`,
    called as `function(row: Prompt, tokenizer) -> Env` (slipstream.envs.base) for each sample.
    Exclusive with `tools`."""
    tool_format: Literal["auto", "plain", "hermes", "json"] = "auto"
    """How the model calls tools and reads replies (envs.parse, envs.render): `hermes`,
    `<tool_call>{json}</tool_call>` blocks, the prompt and the replies rendered by the model's
    chat template when it renders tools (`apply_chat_template(..., tools=...)`), else by
    Qwen2.5's ChatML written out; `json`, a turn that is one bare JSON object
    `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2/3.3's tools templates), rendered by the
    model's chat template; `plain`, `CALL name {json}` lines answered by `RESULT` lines, for
    models without a tools template; `auto`: where the chat template renders tools, the format
    its tool prompt asks for (`hermes` if it shows `<tool_call>` tags, else `json`), else
    `plain`. A format the template's tool prompt does not ask for is an error."""
    workers: int = Field(8, ge=1, le=256)
    """Environment workers per sampler: each runs one step at a time (with `process` workers,
    `worker_concurrency` at a time), so this many steps run at once; an episode's environment
    lives in one worker from its start to its end."""
    worker_concurrency: int = Field(1, ge=1, le=64)
    """Steps one worker process runs at once, each in a thread of its own inside it
    (`isolation = "process"` only): above 1, a slow step no longer holds up the other
    episodes homed in its worker, and a timed-out step's SIGKILL also ends the steps running
    beside it (they end `crash`). 1: one step at a time, the exact time limit."""
    isolation: Literal["process", "thread"] = "process"
    """Where the workers run (envs.workers): `process`, worker processes (the factory must be
    picklable; a crash or a timed-out step kills only its worker, and the episodes whose
    environments it held end `crash`); `thread`, threads of the sampler (nothing pickled; a
    timed-out step's thread is abandoned, not stopped)."""
    step_timeout_s: float = Field(30.0, gt=0.0)
    """Longest one environment step may take once it runs; past it the episode ends
    (`timeout`), scored 0, and its worker process is SIGKILLed and replaced."""
    max_turns: int = Field(8, ge=1)
    """Model turns per episode; an episode still calling tools after them ends (`max_turns`)."""
    max_tokens: int = Field(1024, ge=1)
    """Tokens after the prompt per episode, the model's and the environment's together; an
    episode that reaches it ends (`max_tokens`). Each turn is also capped by
    `sampling.max_new_tokens`."""
    park_kv_tokens: int = Field(65536, ge=0)
    """Cached tokens of waiting episodes whose KV is kept (engine.parking) per sampler; an
    episode that does not fit is re-prefilled whole when it resumes. 0: always re-prefill.
    Memory: per token, layers x 2 x kv_heads x head_dim x the dtype's bytes (Qwen2.5-0.5B in
    bfloat16: 12 KiB, so the default holds 0.75 GiB)."""
    tool_latency_median_s: float = Field(0.02, ge=0.0, le=600.0)
    """task.kind = builtin_tools: median seconds of a calculator call (lognormal latency)."""
    tool_latency_p99_s: float = Field(0.6, ge=0.0, le=3600.0)
    """task.kind = builtin_tools: 99th percentile of a calculator call's seconds (at least the
    median; the default is 30x it; equal to it: every call takes the median)."""

    @model_validator(mode="after")
    def _latency(self) -> EnvConfig:
        if self.tools and self.factory:
            raise ValueError("env.factory: give env.tools or env.factory, not both")
        if self.worker_concurrency > 1 and self.isolation == "thread":
            raise ValueError(
                "env.worker_concurrency: applies to worker processes (env.isolation = "
                '"process"); with threads, each of env.workers runs one step: raise env.workers'
            )
        if self.tool_latency_p99_s < self.tool_latency_median_s:
            raise ValueError(
                "env.tool_latency_p99_s: must be at least env.tool_latency_median_s "
                f"({self.tool_latency_p99_s} < {self.tool_latency_median_s})"
            )
        return self
