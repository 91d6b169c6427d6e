"""One optimizer step from scored groups: recompute log-probs, loss, AdamW.

The trainer owns the policy weights and their version (its optimizer step count). It never
knows which schedule or runtime feeds it: `step(groups)` takes finished, scored groups with
their advantages and returns metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from slipstream.algo import losses, staleness
from slipstream.config import TrainerConfig
from slipstream.model.llama import CausalLM
from slipstream.train import precision
from slipstream.train.batch import collate
from slipstream.train.logprobs import completion_logprobs
from slipstream.train.microbatch import plan_micro_batches, row_widths, to_device
from slipstream.types import Batch, Group


class Trainer:
    """AdamW on a `CausalLM`, one `step()` per policy version."""

    def __init__(
        self,
        model: CausalLM,
        cfg: TrainerConfig,
        temperature: float,
        pad_id: int,
        total_steps: int = 0,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.device = model.lm_head.weight.device
        self.compute_dtype = compute_dtype  # float32 master weights, products in this dtype
        self.total_steps = total_steps
        self.cfg = cfg
        self.temperature = temperature
        self.pad_id = pad_id
        self.version = 0
        self.skipped_steps = 0
        self.opt = precision.make_adamw(model, cfg.lr, cfg.weight_decay, betas=(0.9, 0.99))
        self._hp: dict[str, Any] = {
            k: v for k, v in (("eps_low", cfg.eps_low), ("eps_high", cfg.eps_high)) if v is not None
        }

    def batch(self, groups: Sequence[Group]) -> Batch:
        """All samples of `groups`, sorted by length so that each micro-batch is trimmed to
        rows of similar length: with heavy-tailed lengths this cuts padding about 2x."""
        rows = []
        for g, group in enumerate(groups):
            assert group.advantages_G is not None, "advantages must be computed before training"
            rows += [(s, a, g) for s, a in zip(group.samples, group.advantages_G)]
        rows.sort(key=lambda r: len(r[0].prompt_tokens) + r[0].num_tokens)
        return collate(
            [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], self.pad_id
        )

    def lr_at(self, version: int) -> float:
        """Learning rate of the step that produces `version + 1`: warm-up, then the schedule."""
        cfg = self.cfg
        if cfg.warmup_steps and version < cfg.warmup_steps:
            return cfg.lr * (version + 1) / cfg.warmup_steps
        span = self.total_steps - cfg.warmup_steps
        if cfg.lr_schedule == "constant" or span <= 0:
            return cfg.lr
        progress = min(1.0, (version - cfg.warmup_steps) / span)
        floor = cfg.lr * cfg.lr_min_ratio
        return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """Train on `groups`; bump the version. Skips (and counts) a non-finite step."""
        self.model.train()
        full = to_device(self.batch(groups), self.device)
        num_tokens = full.loss_mask.sum()
        num_seqs = full.loss_mask.any(dim=1).sum()
        max_len = full.loss_mask.shape[1]
        parts, ent_sum, seq_lr, tok_lr = [], full.advantages.new_zeros(()), [], []
        self.opt.zero_grad(set_to_none=True)
        total_loss = full.advantages.new_zeros(())
        for rows in self.micro_batches(full):
            batch = full.slice(rows)
            logp, entropy = self.logprobs(batch)
            out = losses.compute(
                self.cfg.loss,
                logp,
                batch.behavior_logp,
                batch.advantages,
                batch.loss_mask,
                agg=self.cfg.agg,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=max_len,
                **self._hp,
            )
            out.loss.backward()
            total_loss += out.loss.detach()
            parts.append(out.metrics)
            ent_sum += (entropy.detach() * batch.loss_mask).sum()
            seq_lr.append(
                staleness.seq_log_ratio(logp.detach(), batch.behavior_logp, batch.loss_mask)
            )
            tok_lr.append((logp.detach() - batch.behavior_logp)[batch.loss_mask])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.lr_at(self.version)
        lr_scale = staleness.vcpo_lr_scale(torch.cat(seq_lr)) if self.cfg.vcpo else 1.0
        finite = bool(torch.isfinite(total_loss)) and bool(torch.isfinite(grad_norm))
        if finite:
            for g in self.opt.param_groups:
                g["lr"] = lr * lr_scale
            self.opt.step()
        else:
            self.skipped_steps += 1  # weights and optimizer state untouched
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        metrics = {
            f"train/{k}": v for k, v in losses.to_floats(losses.merge_metrics(parts)).items()
        }
        metrics.update(
            {
                "train/loss": float(total_loss),
                "train/entropy": float(ent_sum / num_tokens.clamp(min=1)),
                "train/grad_norm": float(grad_norm),
                "train/lr": lr * lr_scale,
                "train/skipped": 0.0 if finite else 1.0,
                "tokens/trained": float(num_tokens),
                # how far the data's policy is from this one: 1 on-policy (ALGORITHMS.md, Staleness)
                "staleness/ess_token": staleness.ess(torch.cat(tok_lr)),
                "staleness/ess_seq": staleness.ess(torch.cat(seq_lr)),
            }
        )
        if math.isnan(metrics["train/grad_norm"]):
            metrics["train/grad_norm"] = float("inf")
        return metrics

    def micro_batches(self, full: Batch) -> list[slice]:
        """Row ranges of `full` (length-sorted): `micro_batch_size` rows and at most
        `micro_batch_tokens` padded tokens each (train.microbatch)."""
        c = self.cfg
        return plan_micro_batches(
            row_widths(full.loss_mask), c.micro_batch_size, c.micro_batch_tokens
        )

    def logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy `[B, T]` of a micro-batch, in the compute dtype, chunked."""
        with precision.autocast(self.device, self.compute_dtype):
            return completion_logprobs(self.model, batch, self.temperature, packed=self.cfg.packing)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.opt.state_dict(),
            "version": self.version,
            "skipped": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.skipped_steps = state["skipped"]
