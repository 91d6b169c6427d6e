"""Generation: slot KV cache, continuous batching, sampling, per-token logprobs and versions,
in-flight weight swap, abort, and the collection of finished groups."""

from slipstream.engine.engine import Engine, KVMode
from slipstream.engine.groups import GroupCollector, GroupMember
from slipstream.engine.request import Completion, Request, SamplingParams
from slipstream.engine.stats import EngineStats, rates

__all__ = [
    "Completion",
    "Engine",
    "EngineStats",
    "GroupCollector",
    "GroupMember",
    "KVMode",
    "Request",
    "SamplingParams",
    "rates",
]
