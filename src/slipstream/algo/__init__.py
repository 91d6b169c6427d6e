"""Pure tensor math of RL on verifiable rewards: tensors and numbers in, tensors and metrics out.

- `advantages`: group-relative advantages from rewards `[N, G]` (grpo, dr_grpo, rloo, maxrl, oapl).
- `losses`: policy losses, their aggregation over tokens, the decoupled staleness correction,
  and the metrics every loss reports.
- `correction`: the rollout correction of stale or mismatched tokens (truncated or masked
  importance weights at token, sequence or geometric-mean level; the log-linear proximal
  policy).
- `staleness`: token lag, effective sample size of importance weights, VCPO step-size scale.
- `alarms`: the collapse watchdog's alarms on a step record (entropy fall, KL between
  policies, ESS floor, constant reward, gradient spike, non-finite step).
- `filters`: what reaches the gradient (zero-variance groups, pass-rate band, overlong
  completions, dynamic sampling), as pure predicates with named reasons.

No I/O, no clocks, no processes, no global state beyond the registries; the formulas are the
contract in docs/algorithms.md. Stateful helpers built on these (pass-rate tracking, adaptive group
size, replay) live in `slipstream.schedule`.
"""

from slipstream.algo import advantages, filters, losses, staleness

__all__ = ["advantages", "filters", "losses", "staleness"]
