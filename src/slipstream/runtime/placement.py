"""Which device the trainer and each sampler use, checked against the machine.

`resolve` is pure (it takes the machine's CUDA device count), so every rule is tested on a
CPU. Rules:

- `trainer.device` names `cpu`, `cuda` (= `cuda:0`) or `cuda:N`; a CUDA device the machine
  does not have is a `ConfigError` (exit 2), never a crash later in a sampler.
- `runtime.sampler_devices = "auto"`: with the trainer on the CPU, every sampler too; with the
  trainer on GPU k, the samplers round-robin over the other GPUs, and on a one-GPU machine
  they share GPU k with it (colocated: the engine and the trainer split its memory,
  `engine.memory_fraction`, which the engines on one GPU split evenly: `engines_on`). A
  list names one device per sampler.
- The engines on one GPU each size themselves within their share of its free memory
  (`memory_share`): an even split on the local runtime, the GPU fraction its actor asked for
  on Ray.
- A sampler process sees only its own GPU: it is started with `CUDA_VISIBLE_DEVICES` set to
  that GPU (the parent's own `CUDA_VISIBLE_DEVICES` numbering respected), so inside it the
  device is `cuda:0` and nothing it does can touch another GPU's memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from slipstream.config.base import ConfigError


@dataclass(frozen=True)
class Placement:
    """Resolved devices: the trainer's and one per sampler (`cpu` or `cuda:N`, parent numbering)."""

    trainer: str
    samplers: tuple[str, ...]

    def colocated(self, i: int) -> bool:
        """Sampler `i` shares the trainer's GPU."""
        return self.samplers[i] == self.trainer and self.trainer != "cpu"

    def sampler_env(self, i: int, parent_visible: str | None = None) -> dict[str, str]:
        """Environment of sampler `i`'s process: only its GPU visible (for the CPU
        `CUDA_VISIBLE_DEVICES=""` hides every GPU so the engine cannot pick one up), and
        which buffer of the weight channel is its own (runtime.cuda_weights)."""
        dev = self.samplers[i]
        env = {"SLIPSTREAM_WEIGHTS_DEVICE": dev}  # its buffer of the weight channel
        if dev == "cpu":
            return {"CUDA_VISIBLE_DEVICES": "", **env}
        index = int(dev.partition(":")[2])
        visible = (
            parent_visible if parent_visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        if visible:
            return {"CUDA_VISIBLE_DEVICES": visible.split(",")[index].strip(), **env}
        return {"CUDA_VISIBLE_DEVICES": str(index), **env}

    def engines_on(self, device: str) -> int:
        """Engines of a local run that share `device` (parent numbering): its samplers' and,
        on the trainer's, the trainer's own (the run's evaluation engine); each sizes itself
        within its share of the GPU (`memory_share`; 1 on the CPU, which has no memory bound)."""
        if device == "cpu":
            return 1
        return sum(d == device for d in self.samplers) + (device == self.trainer)

    def local_sampler_device(self, i: int) -> str:
        """Sampler `i`'s device as its own process names it (`cuda:0`: the only one it sees)."""
        return "cpu" if self.samplers[i] == "cpu" else "cuda:0"


def memory_share(kind: str, engines_on: int, ray_gpu: float) -> float:
    """The share of its GPU's free memory one engine sizes itself within: it takes
    `engine.memory_fraction` of that share less what it allocates beside its KV cache
    (engine.capacity.memory_budget), so the engines on one GPU take the fraction of its free
    memory together, their own copies of the weights included.

    - `local`: `1 / engines_on`, the engines of the run on its GPU (`Placement.engines_on`).
    - `ray`: `ray_gpu`, the `GPU` its actor asked for (runtime.sampler_resources, or
      runtime.trainer_resources for the trainer actor), when below 1. Ray packs actors whose
      fractions add up to at most 1 onto one GPU but divides nothing of it, so an actor that
      asked for half a GPU sizes itself within half of it. A whole GPU (or more: the engine
      uses the first) or none asked for: 1.
    - `inprocess`: 1, the one engine.
    """
    if kind == "local":
        return 1.0 / max(engines_on, 1)
    if kind == "ray" and 0 < ray_gpu < 1:
        return ray_gpu
    return 1.0


def _canonical(key: str, name: str, cuda_count: int) -> str:
    """`cuda` -> `cuda:0`; a CUDA device beyond `cuda_count` is a ConfigError naming `key`."""
    if name == "cpu":
        return name
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"{key}: expected cpu, cuda or cuda:N, got {name!r}")
    i = int(index or 0)
    if cuda_count == 0:
        raise ConfigError(
            f"{key}: {name!r} asked for, but this machine has no CUDA device "
            "(install the CUDA build of torch, or use cpu)"
        )
    if i >= cuda_count:
        raise ConfigError(
            f"{key}: {name!r} asked for, but this machine has {cuda_count} CUDA device(s)"
        )
    return f"cuda:{i}"


def resolve(
    trainer_device: str, sampler_devices: str | list[str], num_samplers: int, cuda_count: int
) -> Placement:
    """The placement of a run; ConfigError (one line, naming the key) when it cannot be."""
    trainer = _canonical("trainer.device", trainer_device, cuda_count)
    if isinstance(sampler_devices, str):
        if sampler_devices != "auto":
            raise ConfigError(
                f"runtime.sampler_devices: expected 'auto' or a list of devices, got {sampler_devices!r}"
            )
        if trainer == "cpu":
            return Placement(trainer, ("cpu",) * num_samplers)
        mine = int(trainer.partition(":")[2])
        free = [f"cuda:{i}" for i in range(cuda_count) if i != mine] or [trainer]
        return Placement(trainer, tuple(free[i % len(free)] for i in range(num_samplers)))
    if len(sampler_devices) != num_samplers:
        raise ConfigError(
            f"runtime.sampler_devices: {len(sampler_devices)} device(s) for "
            f"runtime.num_samplers = {num_samplers}; give one per sampler or 'auto'"
        )
    samplers = tuple(
        _canonical(f"runtime.sampler_devices[{i}]", d, cuda_count)
        for i, d in enumerate(sampler_devices)
    )
    return Placement(trainer, samplers)


def cuda_device_count() -> int:
    """CUDA devices this process sees (0 with a CPU-only torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_device(device: str) -> None:
    """Make `device` this process's current CUDA device (nothing for `cpu`): what is launched
    without naming a device goes there, not to cuda:0 (the fused sampling kernel, which Triton
    launches on the current device's stream, and CUDA-graph captures and replays, on its
    current stream). A sampler process sees one GPU (`CUDA_VISIBLE_DEVICES`) and needs none."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(device)
