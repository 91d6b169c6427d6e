"""slipstream.sim: predict what an RL run will do on a cluster before renting it.

Owns the first-principles cost model (cost.py: decode as the slower of FLOPs and bytes,
prefill, training at an MFU, weight sync, KV-cache-bound batch), the hardware presets and the
CPU profile (hardware.py), completion-length distributions (lengths.py), the discrete-event
cluster simulator running the very `ScheduleSpec` presets the orchestrator runs
(simulator.py, events.py), the failure model and goodput (failures.py), the planner
(planner.py), calibration from a local run folder (runs.py, calibrate.py), the published
figures it reproduces (figures.py), and the `slipstream sim` / `slipstream plan` commands
(cli.py).

Imports only `slipstream.schedule.presets` from the rest of the package.
"""

from slipstream.sim.cost import MODELS, ModelShape, model_shape
from slipstream.sim.failures import RECOVERY, SOURCES, FailureModel, goodput
from slipstream.sim.hardware import HARDWARE, Hardware, hardware
from slipstream.sim.lengths import Empirical, HeavyTail, LengthDist, Lognormal, Straggler
from slipstream.sim.planner import PlanRequest, plan
from slipstream.sim.simulator import Cluster, SimConfig, SimResult, Workload, simulate

__all__ = [
    "HARDWARE",
    "MODELS",
    "RECOVERY",
    "SOURCES",
    "Cluster",
    "Empirical",
    "FailureModel",
    "Hardware",
    "HeavyTail",
    "LengthDist",
    "Lognormal",
    "ModelShape",
    "PlanRequest",
    "SimConfig",
    "SimResult",
    "Straggler",
    "Workload",
    "goodput",
    "hardware",
    "model_shape",
    "plan",
    "simulate",
]
