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
    tool_format: Literal["plain", "hermes"] = "plain"
    """How the model calls tools and reads replies: `plain` (`CALL name {json}` lines, for
    models without a tools chat template) or `hermes` (`<tool_call>{json}</tool_call>` in
    Qwen2.5 / Hermes ChatML)."""
    workers: int = Field(4, ge=1, le=256)
    """Environment steps that run at once per sampler (threads of the sampler process; what a
    step runs in a subprocess, as the python sandbox does, runs in parallel for real)."""
    step_timeout_s: float = Field(30.0, gt=0.0)
    """Longest one environment step may take; past it the episode ends (`timeout`), scored 0.
    The step's thread cannot be killed: give tools their own time limits (the sandbox has)."""
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
        if self.tool_latency_p99_s < self.tool_latency_median_s:
            raise ValueError(
                "env.tool_latency_p99_s: must be at least env.tool_latency_median_s "
                f"({self.tool_latency_p99_s} < {self.tool_latency_median_s})"
            )
        return self
