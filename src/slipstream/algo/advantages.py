"""Group-relative advantages: rewards `[N, G]` (N prompts, G samples each) to advantages `[N, G]`.

Every method here is a pure function of one group's rewards. The formulas are the contract in
docs/algorithms.md; a group whose rewards are all equal gets exactly 0 under every method, because it
carries no learning signal (and a float mean of equal numbers is not always that number, so the
zero is enforced, not left to rounding).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

EPS = 1e-6


def grpo(rewards: Tensor, eps: float = EPS) -> Tensor:
    """`(R - mean_g R) / (std_g R + eps)`, std with ddof=1 (GRPO, Shao et al. 2024).

    `rewards` `[N, G]`. G=1 has no spread to normalise by and gives 0.
    """
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (rewards.std(dim=1, keepdim=True, correction=1) + eps)


def dr_grpo(rewards: Tensor) -> Tensor:
    """`R - mean_g R`: Dr. GRPO (Liu et al. 2025, §3) drops the std, whose division
    up-weights groups that are nearly all right or all wrong (the difficulty bias)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo(rewards: Tensor) -> Tensor:
    """Leave-one-out baseline `R_i - mean_{j≠i} R_j = G/(G-1) (R_i - mean_g R)`
    (RLOO, Ahmadian et al. 2024). `rewards` `[N, G]` with G >= 2."""
    g = rewards.shape[1]
    if g < 2:
        raise ValueError(f"rloo needs at least 2 samples per group, got G={g}")
    return g / (g - 1) * (rewards - rewards.mean(dim=1, keepdim=True))


def maxrl(rewards: Tensor, eps: float = EPS) -> Tensor:
    """`(R - mean_g R) / (mean_g R + eps)`, 0 where `mean_g R <= 0`.

    Maximum-likelihood RL: with 0/1 rewards the gradient of log(pass rate) is the policy
    gradient divided by the pass rate p, so hard prompts (small p) weigh 1/p more. A group with
    no success has no likelihood to raise and gets 0. Defined for rewards in [0, 1]: a mean at
    or below 0 (only reachable with negative rewards) would flip or explode the 1/p weight, so
    it gets 0 too; the config rejects settings that make rewards negative.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    adv = (rewards - mean) / (mean + eps)
    return torch.where(mean <= 0, torch.zeros_like(adv), adv)


def oapl(rewards: Tensor, beta: float = 1.0) -> Tensor:
    """`R - V` with the soft-optimal value `V = beta * log mean_g exp(R / beta)`.

    This is the regression target of the `oapl` loss (optimal-advantage regression, A*-PO,
    Brantley et al. 2025). V is computed as `m + beta * log mean exp((R - m) / beta)` with
    `m = max_g R`: exp cannot overflow, and equal rewards give exactly `V = R`.
    """
    if beta <= 0:
        raise ValueError(f"oapl beta must be > 0, got {beta}")
    top = rewards.amax(dim=1, keepdim=True)
    scaled = (rewards - top) / beta
    log_mean = torch.logsumexp(scaled, dim=1, keepdim=True) - math.log(rewards.shape[1])
    return rewards - (top + beta * log_mean)


METHODS: dict[str, Callable[..., Tensor]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "maxrl": maxrl,
    "oapl": oapl,
}
"""The advantage estimators by name; `compute(rewards, name)` picks one."""


def compute(rewards: Tensor, method: str, **kw: float) -> Tensor:
    """Advantages `[N, G]` of rewards `[N, G]` under `method` (one of `METHODS`).

    `kw` are the method's own settings (`eps` for grpo and maxrl, `beta` for oapl). The result
    is detached, in the rewards' floating dtype (float32 for integer rewards).
    """
    if method not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; valid: {', '.join(METHODS)}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    fn = METHODS[method]
    allowed = [p for p in inspect.signature(fn).parameters if p != "rewards"]
    unknown = sorted(set(kw) - set(allowed))
    if unknown:
        raise ValueError(
            f"advantage method {method!r} takes no setting {unknown}; valid: {allowed or 'none'}"
        )
    rewards = rewards.detach()
    if not rewards.is_floating_point():
        rewards = rewards.float()
    adv = fn(rewards, **kw)
    uniform = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(uniform, torch.zeros_like(adv), adv)
