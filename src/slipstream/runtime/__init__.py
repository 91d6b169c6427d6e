"""Where actors live and how they talk.

`channels` declares what the trainer and the samplers exchange (prompt requests, finished
groups, weights, a stop flag) as protocols; samplers and the orchestrator see nothing else, so
a Ray runtime can host the same classes. `weights` is the shared-memory weight channel (a
seqlock around one flat buffer per dtype); `local` starts N sampler processes beside the
trainer process and owns the one shutdown path; `ray` hosts the same samplers (and the
trainer) as Ray actors, on one machine or a cluster, with the channels of `ray_channels`
(actor queues, object store or broadcast weights). `make_runtime` picks one by
`runtime.kind`.
"""

from typing import Any

import torch

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


def make_runtime(
    rc: Any,
    params: dict[str, torch.Tensor],
    prompts: int,
    groups: int,
    sampler_env: list[dict[str, str]] | None = None,
    weight_devices: list[str] | None = None,
) -> Any:
    """The runtime `rc.kind` names (not started): `prompts` bounds each sampler's inbox,
    `groups` the finished groups (unless `runtime.queue_size` is set). `params` shapes the
    weight channel (names, shapes, dtypes; meta tensors do). `sampler_env`: environment
    variables of each local sampler process (`CUDA_VISIBLE_DEVICES`, runtime.placement);
    on Ray the actors' GPUs are Ray's to assign (`sampler_resources`). `weight_devices`:
    each local sampler's device; with a GPU among them the weights go by CUDA IPC."""
    from slipstream.runtime.local import LocalRuntime, default_threads

    args = (params, rc.num_samplers, rc.threads_per_sampler or default_threads(rc.num_samplers))
    kw = dict(
        prompt_queue=prompts + rc.num_samplers,
        group_queue=rc.queue_size or groups,
        shutdown_timeout_s=rc.shutdown_timeout_s,
        max_restarts=rc.max_restarts,
    )
    if rc.kind != "ray":
        return LocalRuntime(*args, **kw, sampler_env=sampler_env, weight_devices=weight_devices)
    from slipstream.runtime.ray import RayRuntime

    return RayRuntime(
        *args,
        **kw,
        weight_transport=rc.weight_transport,
        call_timeout_s=rc.call_timeout_s,
        sampler_resources=rc.sampler_resources,
        startup_timeout_s=rc.startup_timeout_s,
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
    "make_runtime",
]
