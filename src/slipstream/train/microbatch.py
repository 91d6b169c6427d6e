"""How one optimizer step's batch is cut into micro-batches, and each placed on its device.

A micro-batch's memory grows with the tokens it holds (activations, the hidden states the
chunked head keeps), not with its row count: 16 rows of 100 tokens and 16 rows of 8k are a
80x apart. Padded, it holds rows x its widest row; packed (`trainer.packing`: the rows laid
end to end in one row, `train.logprobs.packed_hidden`), the sum of its row widths.
`plan_micro_batches` cuts a length-sorted batch into consecutive ranges under a token budget
(`trainer.micro_batch_tokens`) counted the way the trainer will run them, so short rows share
a micro-batch and long ones go few at a time. Every micro-batch is scored against the whole
step's normaliser (token count, sequence count, longest row: `algo.losses`), so the split
changes the memory and never the gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from slipstream.types import Batch


def row_widths(loss_mask_BT: torch.Tensor) -> list[int]:
    """Per row, the columns a micro-batch holding it must keep: its last loss position + 1."""
    T = loss_mask_BT.shape[1]
    cols = torch.arange(1, T + 1).expand_as(loss_mask_BT)
    return (cols * loss_mask_BT.cpu()).amax(dim=1).clamp(min=1).tolist()


def plan_micro_batches(
    widths: Sequence[int], max_rows: int, max_tokens: int = 0, packed: bool = False
) -> list[slice]:
    """Consecutive row ranges covering `range(len(widths))`, in order.

    A range holds at most `max_rows` rows and, with `max_tokens > 0`, at most `max_tokens`
    tokens: padded (rows x its widest row), or with `packed` the sum of its rows' widths,
    the length of the one row they are packed into; a row wider than the budget is a range
    of its own. Greedy: a range grows until the next row would break a bound. On rows sorted
    by width (`Trainer.batch` sorts them; packed, in any order) that is the fewest ranges any
    split into consecutive ranges can have.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    out: list[slice] = []
    start, widest, total = 0, 0, 0
    for r, w in enumerate(widths):
        n, wide, tot = r - start + 1, max(widest, w), total + w
        held = tot if packed else n * wide
        if r > start and (n > max_rows or (max_tokens > 0 and held > max_tokens)):
            out.append(slice(start, r))
            start, wide, tot = r, w, w
        widest, total = wide, tot
    if widths:
        out.append(slice(start, len(widths)))
    return out


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """`batch` with every tensor on `device` (no copy where it already is)."""
    moved = {
        f.name: getattr(batch, f.name).to(device, non_blocking=True)
        for f in dataclasses.fields(batch)
    }
    return Batch(**moved)
