"""A sampler built where it runs: `SamplerFactory(spec)(sampler_id)` is the `SamplerWorker`
(schedule.sampler) of one sampler process or Ray actor.

The runtime pickles the factory, not the model: inside the child it allocates the model on
the sampler's device (on meta first, so no random initialisation runs: the weights arrive
through the weight channel before the first step), sizes the engine's slots to its KV budget
(within its share of a GPU it shares, leaving room for the staging copy of the weights its
first read allocates), and builds the task and, for multi-turn runs, the environment factory
from the config. The runtime's fork server preloads this module (runtime.processes.PRELOAD).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slipstream.engine import capacity
from slipstream.model.hf import tensor_bytes
from slipstream.model.meta import empty_model
from slipstream.run.agentic import build_env_factory
from slipstream.schedule.sampler import SamplerSpec, SamplerWorker


@dataclass(frozen=True)
class SamplerFactory:
    """Builds the worker of a sampler id from `spec`; picklable (the runtime calls it inside
    the child)."""

    spec: SamplerSpec

    def __call__(self, sampler_id: int) -> SamplerWorker:
        from slipstream.run.components import engine_share  # (not in the preload)
        from slipstream.run.setup import build_task, make_engine

        spec = self.spec
        p = spec.placement
        device = torch.device(p.local_sampler_device(sampler_id) if p else "cpu")
        # built on meta, allocated once on its device: the weights arrive through the channel
        # before the first step (model.meta), so no random initialisation ever runs
        model = empty_model(spec.model_config, device, spec.dtype)
        e = spec.cfg.engine
        free = capacity.free_device_bytes(device)
        staging = tensor_bytes(model.parameters())  # the weight channel's, at 1st read
        share = engine_share(spec.cfg, p, sampler_id) if p is not None else 1.0
        slots = capacity.engine_slots(
            spec.model_config,
            spec.dtype,
            spec.num_slots,
            spec.max_len,
            e.max_tokens,
            e.memory_fraction,
            free,
            staging,
            graphs=device.type == "cuda",  # its decode step is captured (Engine.decode_graph)
            share=share,  # of a GPU it shares (run.components.engine_share)
        )
        engine = make_engine(model, spec.tokenizer, slots, spec.max_len, version=-1)
        task = build_task(spec.cfg)
        env_factory = build_env_factory(spec.cfg, spec.tokenizer, task)
        return SamplerWorker(spec, sampler_id, engine, task, env_factory)
