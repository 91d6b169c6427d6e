"""Generation: slot KV cache, continuous batching, sampling, per-token logprobs and versions,
in-flight weight swap, abort."""

from slipstream.engine.engine import Completion, Engine, EngineStats, Request, SamplingParams

__all__ = ["Completion", "Engine", "EngineStats", "Request", "SamplingParams"]
