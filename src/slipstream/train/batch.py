"""Pack samples into the padded tensors of a `Batch`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slipstream.types import Batch, Sample

BEHAVIOR_LOGPROBS = ("full", "truncated")


def collate(
    samples: Sequence[Sample],
    advantages: Sequence[float],
    group_ids: Sequence[int],
    pad_id: int,
    behavior: str = "full",
) -> Batch:
    """Right-padded `Batch` of prompt + completion rows; the loss mask covers completions only,
    and of a multi-turn sample only its model tokens (`Sample.model_mask_T`).

    `behavior` (`trainer.behavior_logprobs`): `full` takes the recorded log-probs of the full
    softmax; `truncated` subtracts each token's `kept_logmass_T` where a sample has one, giving
    the exact log-prob of the top-k / top-p distribution it was drawn from."""
    if behavior not in BEHAVIOR_LOGPROBS:
        raise ValueError(f"behavior {behavior!r}; valid: {', '.join(BEHAVIOR_LOGPROBS)}")
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    # at least one target column: an episode that crashed before its first observation has
    # no tokens at all, and a batch of only such rows still makes a (skipped) step
    width = max(2, *(len(s.prompt_tokens) + len(s.completion_tokens) for s in samples))
    # rows as Python lists, then one tensor each: a tensor per row and field cost ~5 ms a step
    # of 64 rows, more than the rest of collation
    ids, mask, blogp, versions = [], [], [], []
    for s in samples:
        p, c = len(s.prompt_tokens), len(s.completion_tokens)
        if p == 0 and c:
            raise ValueError(f"sample of prompt {s.prompt_id!r} has a completion but no prompt")
        rest = width - p - c
        ids.append(s.prompt_tokens + s.completion_tokens + [pad_id] * rest)
        # target column t predicts token t+1: completion token j sits at column p - 1 + j
        keep = [True] * c if s.model_mask_T is None else [bool(m) for m in s.model_mask_T]
        lead = max(p - 1, 0)  # 0 for a row without tokens
        tail = width - 1 - lead - c
        mask.append([False] * lead + keep + [False] * tail)
        blogp.append([0.0] * lead + _behavior_logp(s, behavior) + [0.0] * tail)
        versions.append([-1] * lead + list(s.versions_T) + [-1] * tail)
    ids_t = torch.tensor(ids, dtype=torch.long)
    mask_t = torch.tensor(mask, dtype=torch.bool)
    versions_t = torch.tensor(versions, dtype=torch.long)
    versions_t.masked_fill_(~mask_t, -1)  # environment tokens, as outside the mask
    return Batch(
        input_ids=ids_t,
        targets=ids_t[:, 1:],
        loss_mask=mask_t,
        behavior_logp=torch.tensor(blogp, dtype=torch.float32),
        versions=versions_t,
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
        group_ids=torch.tensor(list(group_ids), dtype=torch.long),
    )


def loss_width(s: Sample) -> int:
    """Columns of `s`'s collated row that a micro-batch holding it keeps (`Batch.slice`,
    `microbatch.row_widths`): its last loss column + 1. Completion token j sits at column
    p - 1 + j, so that is p + j of the last model token: p + c - 1 for a single-turn sample,
    1 for one without a model token (an episode that ended before the model spoke)."""
    keep = s.model_mask_T or [True] * len(s.completion_tokens)
    last = max((j for j, k in enumerate(keep) if k), default=None)
    return 1 if last is None else len(s.prompt_tokens) + last


def _behavior_logp(s: Sample, behavior: str) -> list[float]:
    """`[T]` behaviour log-probs of `s`: log p of the full softmax, or log p - log Z."""
    z = s.kept_logmass_T
    if behavior == "full" or z is None:
        return list(s.behavior_logp_T)
    return [lp - lz for lp, lz in zip(s.behavior_logp_T, z)]


def token_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs `[B, T]` of `batch.targets` under `model` at `temperature`, and entropy `[B, T]`.

    The engine records log-probs of the same temperature-scaled distribution, so with identical
    weights the two agree and the on-policy ratio is 1.
    """
    logits = model(batch.input_ids[:, :-1]).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = logits.log_softmax(dim=-1)
    logp = logp_all.gather(-1, batch.targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy
