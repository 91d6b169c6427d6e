"""Where actors live and how they talk.

`channels` declares what the trainer and the samplers exchange (prompt requests, finished
groups, weights, a stop flag) as protocols; samplers and the orchestrator see nothing else, so
a Ray runtime can host the same classes. `weights` is the shared-memory weight channel (a
seqlock around one flat buffer per dtype); `local` starts N sampler processes beside the
trainer process and owns the one shutdown path.
"""

from slipstream.runtime.channels import (
    Channels,
    GroupChannel,
    PromptChannel,
    PromptRequest,
    SamplerMessage,
    SamplerReport,
    StopFlag,
    WeightChannel,
)

__all__ = [
    "Channels",
    "GroupChannel",
    "PromptChannel",
    "PromptRequest",
    "SamplerMessage",
    "SamplerReport",
    "StopFlag",
    "WeightChannel",
]
