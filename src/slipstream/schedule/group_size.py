"""Adaptive group size: spend a fixed sample budget where it buys the most learning signal.

A group carries gradient only when it holds both a success and a failure (otherwise every
advantage is 0 and the zero-variance filter drops it, DAPO §3.2). With pass rate p, a group of
G independent samples is informative with probability

    P(G) = 1 - p^G - (1 - p)^G.

We choose the group sizes G_i of the B prompts about to be drawn to maximise the expected
number of informative groups, sum_i P_i(G_i), under sum_i G_i = budget and
g_min <= G_i <= g_max. Each P_i has decreasing increments,

    P(G + 1) - P(G) = p^G (1 - p) + (1 - p)^G p,

so the greedy allocation (one sample at a time to the prompt with the largest increment) is
optimal for this separable concave problem. Hard prompts (small p) keep large increments for
longer and receive more samples; a prompt at p = 0.5 is almost surely informative with a few
samples. This is the budget-allocation view of adaptive rollouts (Knapsack RL, Li et al. 2025),
with the probability of a non-zero gradient as each prompt's value.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def informative_prob(pass_rate: float, group_size: int) -> float:
    """P(a group of `group_size` samples holds at least one success and one failure)."""
    p = pass_rate
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def _gain(p: float, g: int) -> float:
    """`informative_prob(p, g + 1) - informative_prob(p, g)`, in a form without cancellation."""
    return p**g * (1.0 - p) + (1.0 - p) ** g * p


def allocate_group_sizes(
    pass_rates: Sequence[float], budget: int, g_min: int, g_max: int
) -> list[int]:
    """Group sizes `[B]` for prompts with these running pass rates `[B]`, summing to `budget`.

    Every prompt gets at least `g_min` (>= 1) and at most `g_max` samples. Ties (including
    prompts at p = 0 or 1, which can never be informative) go to the smaller group, then to the
    earlier prompt, so the result is deterministic and as even as the gains allow. Use the
    tracker's rate with a prior (e.g. 0.5) for unseen prompts.
    """
    b = len(pass_rates)
    if not 1 <= g_min <= g_max:
        raise ValueError(f"need 1 <= g_min <= g_max, got g_min={g_min}, g_max={g_max}")
    if not b * g_min <= budget <= b * g_max:
        raise ValueError(
            f"budget {budget} cannot be split over {b} prompts with {g_min} <= G <= {g_max}"
        )
    for p in pass_rates:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"pass rates must be in [0, 1], got {p}")
    sizes = [g_min] * b
    heap = [(-_gain(p, g_min), g_min, i) for i, p in enumerate(pass_rates) if g_min < g_max]
    heapq.heapify(heap)
    for _ in range(budget - b * g_min):
        _, g, i = heapq.heappop(heap)
        sizes[i] = g + 1
        if g + 1 < g_max:
            heapq.heappush(heap, (-_gain(pass_rates[i], g + 1), g + 1, i))
    return sizes


def expected_informative(pass_rates: Sequence[float], sizes: Sequence[int]) -> float:
    """Expected number of informative groups for these pass rates and group sizes."""
    return sum(informative_prob(p, g) for p, g in zip(pass_rates, sizes, strict=True))
