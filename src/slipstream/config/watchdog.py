"""Config section of the collapse watchdog: `[watchdog]` (schedule.watchdog)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from slipstream.config.base import _Section

Action = Literal["warn", "tighten", "rollback"]
ALARMS = ("entropy_drop", "step_kl", "ess_low", "reward_constant", "grad_spike", "nonfinite")


class WatchdogConfig(_Section):
    enabled: bool = False
    """Watch every step for the signs of a collapse and act on them (`actions`)."""
    window: int = Field(5, ge=2)
    """Steps of history the alarms compare against (entropy slope, grad-norm median)."""
    entropy_drop_rate: float = Field(0.1, ge=0.0)
    """Alarm `entropy_drop`: the token entropy fell by more than this fraction per step, on
    average over the last `window` steps. 0: off."""
    step_kl_limit: float = Field(0.5, ge=0.0)
    """Alarm `step_kl`: KL(old || new) between the policies before and after a step, on the
    step's own tokens (`train/step_kl`, one extra forward pass a step), above this. 0: off.
    (bench/beyond.py: up to 0.08 on ordinary steps of the built-in task, 12 under a 300x
    learning-rate spike; 0.05 fired on an ordinary step.)"""
    ess_floor: float = Field(0.0, ge=0.0, le=1.0)
    """Alarm `ess_low`: the token ESS of a step (`staleness/ess_token`) below this. 0: off."""
    reward_constant_steps: int = Field(3, ge=0)
    """Alarm `reward_constant`: every sample's reward was the same (std below 1e-6) for this
    many consecutive steps, or for one batch that left nothing to train on. 0: off."""
    grad_spike_factor: float = Field(10.0, ge=0.0)
    """Alarm `grad_spike`: the gradient norm (before clipping) above this times the median of
    the last `window` steps. 0: off."""
    nonfinite: bool = True
    """Alarm `nonfinite`: a step whose loss or gradient was not finite (it was skipped)."""
    actions: dict[str, Action] = Field(default_factory=dict)
    """Action per alarm (names as above): `warn` (default: log it), `tighten` (K = 0 and the
    learning rate times `tighten_lr_scale` for `tighten_steps` steps) or `rollback` (restore
    the newest checkpoint at least `rollback_margin` steps before the first alarm, discard
    the data produced after it, multiply the learning rate by `rollback_lr_scale`, go on)."""
    tighten_steps: int = Field(10, ge=1)
    """`tighten`: steps under K = 0 and the scaled learning rate."""
    tighten_lr_scale: float = Field(0.5, gt=0.0, le=1.0)
    """`tighten`: learning-rate multiplier while tightened."""
    rollback_lr_scale: float = Field(0.5, gt=0.0, le=1.0)
    """`rollback`: the learning rate is multiplied by this after each rollback."""
    rollback_lr_recover_steps: int = Field(10, ge=0)
    """`rollback`: the learning rate climbs back geometrically after a rollback, undoing one
    rollback's `rollback_lr_scale` over this many steps without an alarm (an alarm pauses the
    climb); 0: the lowered rate stays for the rest of the run."""
    max_rollbacks: int = Field(2, ge=0)
    """`rollback`: at most this many per run; later alarms only warn."""
    rollback_margin: int = Field(1, ge=0)
    """`rollback`: the checkpoint restored is at least this many steps older than the first
    alarm (an alarm fires a step or more after a collapse begins). This checkpoint, and the
    newer ones a later alarm would restore, are kept even past `checkpoint.keep`."""
    inject_lr_spike_at: int = Field(0, ge=0)
    """Fault injection, to test the watchdog on your own setup: at this step (0: never) the
    learning rate is multiplied by `inject_lr_spike_factor` for `inject_lr_spike_steps`
    steps, once (a rollback does not replay the steps already spiked); also with
    `enabled = false`, to see the run without the watchdog."""
    inject_lr_spike_factor: float = Field(30.0, gt=0.0)
    """Multiplier of the injected learning-rate spike."""
    inject_lr_spike_steps: int = Field(2, ge=1)
    """Steps of the injected spike."""

    @model_validator(mode="after")
    def _known_alarms(self) -> WatchdogConfig:
        for name in self.actions:
            if name not in ALARMS:
                raise ValueError(
                    f"watchdog.actions.{name}: unknown alarm; valid: {', '.join(ALARMS)}"
                )
        return self
