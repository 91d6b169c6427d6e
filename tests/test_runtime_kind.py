"""Only the sync schedule runs in process: any other schedule left at `runtime.kind =
"inprocess"` (the default) runs on the local runtime, and every decision that depends on the
runtime reads that (`Config.runtime_kind`)."""

from __future__ import annotations

from slipstream.config import load_config
from slipstream.run.components import resolve_placement


def test_a_schedule_other_than_sync_runs_on_local_with_all_its_samplers():
    cfg = load_config(None, ['schedule.name="async"', "runtime.num_samplers=2"])
    assert cfg.runtime.kind == "inprocess" and cfg.runtime_kind == "local"
    # placed for one sampler, the second's spawn failed with IndexError (README's command)
    assert len(resolve_placement(cfg).samplers) == 2
    assert load_config(None, []).runtime_kind == "inprocess"
    ray = load_config(None, ['schedule.name="pipeline"', 'runtime.kind="ray"'])
    assert ray.runtime_kind == "ray"


def test_a_samplers_task_error_is_raised_as_one_line_and_anything_else_with_its_traceback():
    from slipstream.runtime.channels import sampler_failure
    from slipstream.tasks.jsonl import TaskError

    tb = "Traceback (most recent call last):\n  File 'x', line 1\n"
    err = sampler_failure(0, tb + "slipstream.tasks.guard.RewardError: reward 'r' raised (fail)\n")
    assert isinstance(err, TaskError) and str(err) == "reward 'r' raised (fail)"
    other = sampler_failure(1, tb + "ValueError: boom\n")
    assert type(other) is RuntimeError and str(other).startswith("sampler 1 failed:\nTraceback")
    # a name that is not a TaskError of the task modules stays a RuntimeError
    assert type(sampler_failure(2, tb + "slipstream.tasks.guard.Nothing: x")) is RuntimeError
