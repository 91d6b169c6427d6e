"""Pack samples into the padded tensors of a `Batch`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slipstream.types import Batch, Sample


def collate(
    samples: Sequence[Sample], advantages: Sequence[float], group_ids: Sequence[int], pad_id: int
) -> Batch:
    """Right-padded `Batch` of prompt + completion rows; the loss mask covers completions only,
    and of a multi-turn sample only its model tokens (`Sample.model_mask_T`)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    width = max(len(s.prompt_tokens) + len(s.completion_tokens) for s in samples)
    B = len(samples)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    mask = torch.zeros(B, width - 1, dtype=torch.bool)
    blogp = torch.zeros(B, width - 1)
    versions = torch.full((B, width - 1), -1, dtype=torch.long)
    for r, s in enumerate(samples):
        p, c = len(s.prompt_tokens), len(s.completion_tokens)
        ids[r, : p + c] = torch.tensor(s.prompt_tokens + s.completion_tokens)
        # target column t predicts token t+1: completion token j sits at column p - 1 + j
        mask[r, p - 1 : p - 1 + c] = True if s.model_mask_T is None else _model_mask(s)
        blogp[r, p - 1 : p - 1 + c] = torch.tensor(s.behavior_logp_T, dtype=torch.float32)
        versions[r, p - 1 : p - 1 + c] = torch.tensor(s.versions_T, dtype=torch.long)
    versions.masked_fill_(~mask, -1)  # environment tokens, as outside the mask
    return Batch(
        input_ids=ids,
        targets=ids[:, 1:],
        loss_mask=mask,
        behavior_logp=blogp,
        versions=versions,
        advantages=torch.tensor(list(advantages), dtype=torch.float32),
        group_ids=torch.tensor(list(group_ids), dtype=torch.long),
    )


def _model_mask(s: Sample) -> torch.Tensor:
    """`[c]` bool: the model's tokens of a multi-turn sample (environment tokens carry no loss)."""
    assert s.model_mask_T is not None
    return torch.tensor(s.model_mask_T, dtype=torch.bool)


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
