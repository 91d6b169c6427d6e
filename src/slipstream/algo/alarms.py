"""The collapse watchdog's alarms: pure tests on a short history of step measurements.

Each takes the history of one quantity, oldest first, ending with the current step, and
returns a message when the alarm fires (None when it does not). The signs of an RL collapse
they look for (entropy collapse: Yu et al. 2025, DAPO; a policy jump: Schulman et al. 2015,
TRPO's KL bound; degenerate importance weights: Kong 1992; all-equal rewards, which leave
GRPO no signal; exploding gradients):

- `entropy_drop`: the mean relative fall of entropy per step over the window,
  `(H[0] - H[-1]) / (H[0] * (n - 1))`, above `rate`;
- `step_kl`: KL(old || new) of the last step above `limit`;
- `ess_low`: the token ESS below `floor`;
- `reward_constant`: the reward std was below `eps` in each of the last `steps` steps;
- `grad_spike`: the last gradient norm above `factor` x the median of the ones before it;
- `nonfinite`: the last step's loss or gradient was not finite.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def entropy_drop(entropy: Sequence[float], rate: float) -> str | None:
    """`entropy`: the last `n >= 2` steps' mean token entropy (nats)."""
    if rate <= 0 or len(entropy) < 2 or entropy[0] <= 0:
        return None
    fall = (entropy[0] - entropy[-1]) / (entropy[0] * (len(entropy) - 1))
    if fall > rate:
        return (
            f"entropy fell {fall:.1%} a step over {len(entropy) - 1} steps "
            f"({entropy[0]:.3f} -> {entropy[-1]:.3f}; limit {rate:.1%})"
        )
    return None


def step_kl(kl: float, limit: float) -> str | None:
    """`kl`: KL between the policies before and after the last step (`train/step_kl`)."""
    if limit <= 0 or not kl > limit:  # NaN counts as above
        if limit > 0 and math.isnan(kl):
            return "KL between consecutive policies is NaN"
        return None
    return f"KL between consecutive policies {kl:.4g} > {limit:.4g}"


def ess_low(ess: float, floor: float) -> str | None:
    if floor <= 0 or ess >= floor:
        return None
    return f"token ESS {ess:.3f} < {floor:.3f}"


def reward_constant(reward_std: Sequence[float], steps: int, eps: float = 1e-6) -> str | None:
    """`reward_std`: the std of every sample's reward, per step, newest last."""
    if steps <= 0 or len(reward_std) < steps:
        return None
    if all(s < eps for s in reward_std[-steps:]):
        return f"every reward was the same for {steps} step(s)"
    return None


def grad_spike(grad_norm: Sequence[float], factor: float) -> str | None:
    """`grad_norm`: pre-clipping gradient norms, newest last; needs 2 before the newest."""
    if factor <= 0 or len(grad_norm) < 3:
        return None
    base = statistics.median(grad_norm[:-1])
    g = grad_norm[-1]
    if base > 0 and not g <= factor * base:  # inf and NaN fire
        return f"gradient norm {g:.4g} > {factor:g} x median {base:.4g}"
    return None


def nonfinite(loss: float, grad_norm: float) -> str | None:
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    return f"non-finite step (loss {loss}, gradient norm {grad_norm})"
