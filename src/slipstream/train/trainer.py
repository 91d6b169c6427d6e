"""One optimizer step from scored groups: recompute log-probs, loss, AdamW.

The trainer owns the policy weights and their version (its optimizer step count). It never
knows which schedule or runtime feeds it: `step(groups)` takes finished, scored groups with
their advantages and returns metrics.

The proximal policy of the decoupled objective (docs/algorithms.md, "Proximal policy"):

- `none`: the sampler is the proximal policy; ratios are taken against `behavior_logp`.
- `recompute`: the weights at the start of the step (AReaL's decoupled PPO). A step is one
  optimizer update, so those are the weights of the step's own forward pass: `old_logp` is its
  detached output, exactly what a separate no_grad pass computes (a test holds this), at no
  extra cost.
- `loglinear`: AReaL's interpolation by version between `behavior_logp` and the current
  log-probs (`algo.correction.loglinear_proximal`).

Micro-batches: every micro-batch's loss is the *sum* of its aggregation's numerator; once all
are back, the gradient is divided by the step's denominator (`losses.normaliser`), counted
over the tokens that stayed in the loss. So a token the correction masks leaves the
denominator of the whole step, and no split of the step changes the gradient. The sequences
that overlong `mask_loss` took out of the groups (`Group.masked`) still count as sequences,
as in TRL's `mask_truncated_completions` (docs/algorithms.md, "Aggregation").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from slipstream.algo import correction, losses, staleness
from slipstream.algo.correction import CorrectionSpec
from slipstream.config import TrainerConfig
from slipstream.config.train import CLIP_SETTINGS
from slipstream.model.llama import CausalLM
from slipstream.train import precision
from slipstream.train.batch import collate, loss_width
from slipstream.train.logprobs import completion_logprobs
from slipstream.train.microbatch import plan_micro_batches, row_widths, to_device
from slipstream.types import Batch, Group

PROXIMAL_MODES = ("none", "recompute", "loglinear")


def resolve_proximal(
    mode: str,
    max_lag: int,
    exact_sampler: bool = True,
    replay: bool = False,
    truncated: bool = False,
) -> str:
    """`auto`, from bench/staleness.py's measurements (docs/algorithms.md, "Proximal policy"):

    - `truncated` behaviour log-probs (`trainer.behavior_logprobs`, with a sampler that top-k
      or top-p truncates) on fresh data: `recompute`, the only mode where `pi / mu`, which
      reads the kept mass Z < 1 on-policy, is a detached weight and not the clipped ratio
      (stale data with them is a config error: config.load);
    - no trained token can be stale (max lag 0, no replayed samples) and the sampler computes
      the trainer's log-probs exactly: `none`;
    - the same with an inexact sampler (bfloat16): `recompute`, whose weight corrects the
      mismatch; the data is fresh, so the trust region it lacks does not bind (at K = 0 it
      trained exactly as `none`);
    - stale data: `loglinear`. A step is one optimizer update, so under `recompute` the
      trust-region ratio is 1 and nothing clips: it collapsed at every forced lag K >= 2,
      while `loglinear` keeps a clipped ratio and trained as well as `none`.

    Other modes are returned as they are."""
    if mode != "auto":
        return mode
    if max_lag > 0 or replay:
        return "loglinear"
    if truncated:
        return "recompute"
    return "none" if exact_sampler else "recompute"


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
        *,
        proximal: str = "none",
        correction_spec: CorrectionSpec | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if proximal not in PROXIMAL_MODES:
            raise ValueError(f"proximal {proximal!r}; valid: {', '.join(PROXIMAL_MODES)}")
        self.model = model
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.device = model.lm_head.weight.device
        self.compute_dtype = compute_dtype  # float32 master weights, products in this dtype
        self.total_steps = total_steps
        self.cfg = cfg
        self.proximal = proximal
        self.correction_spec = correction_spec or CorrectionSpec()
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.pad_id = pad_id
        self.version = 0
        self.skipped_steps = 0
        self.lr_scale = 1.0  # the watchdog's multiplier of the learning rate (schedule.watchdog)
        self.measure_step_kl = False  # train/step_kl: one no-grad forward after the update
        self.opt = precision.make_adamw(model, cfg.lr, cfg.weight_decay, betas=cfg.betas)
        self._hp = self.loss_settings(cfg)

    @staticmethod
    def loss_settings(cfg: TrainerConfig) -> dict[str, Any]:
        """The loss's settings `cfg` gives (`CLIP_SETTINGS`); the loss's defaults for the rest."""
        return {k: getattr(cfg, k) for k in CLIP_SETTINGS if getattr(cfg, k) is not None}

    def batch(self, groups: Sequence[Group]) -> Batch:
        """All samples of `groups`, sorted by the width a micro-batch holding them keeps
        (`loss_width`: prompt and completion lie end to end, right-padded, and a micro-batch is
        trimmed to its last loss column), so that each micro-batch holds rows of similar
        width: with heavy-tailed lengths this cuts padding about 2x."""
        rows = []
        for g, group in enumerate(groups):
            assert group.advantages_G is not None, "advantages must be computed before training"
            rows += [(s, a, g) for s, a in zip(group.samples, group.advantages_G)]
        rows.sort(key=lambda r: loss_width(r[0]))
        return collate(
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            self.pad_id,
            self.cfg.behavior_logprobs,
        )

    def lr_at(self, version: int) -> float:
        """Learning rate of step `s = version + 1` (the step that produces `s`) of
        `T = total_steps`: warm-up `lr s / W` up to `s = W`, then the schedule, with cosine
        progress `(s - W) / (T - W)`. Both pieces count steps from 1, so step W alone is at
        the peak and step T, the last, at `lr * lr_min_ratio`."""
        cfg = self.cfg
        step = version + 1
        if cfg.warmup_steps and step <= cfg.warmup_steps:
            return cfg.lr * step / cfg.warmup_steps
        span = self.total_steps - cfg.warmup_steps
        if cfg.lr_schedule == "constant" or span <= 0:
            return cfg.lr
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        floor = cfg.lr * cfg.lr_min_ratio
        return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def _proximal(self, logp: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """`old_logp` `[B, T]` of this micro-batch (None: the sampler's)."""
        if self.proximal == "none":
            return None
        if self.proximal == "recompute":
            return logp.detach()
        lag = self.version - batch.versions
        return correction.loglinear_proximal(batch.behavior_logp, logp, lag, batch.loss_mask)

    def step(self, groups: Sequence[Group]) -> dict[str, float]:
        """Train on `groups`; bump the version. Skips (and counts) a non-finite step, and a
        step without a trainable token (every episode crashed before the model spoke, or the
        rollout correction masked every token): AdamW would move the weights on zero
        gradients through its moments and weight decay. A skipped step trained no token
        (`tokens/trained` 0); `tokens/computed` is the loss mask either way."""
        self.model.train()
        full = to_device(self.batch(groups), self.device)
        agg = self.cfg.agg or losses.METHODS[self.cfg.loss].agg
        parts, seq_lr, tok_lr = [], [], []
        ent_sum = full.advantages.new_zeros(())
        num_tokens = torch.zeros((), dtype=torch.long, device=self.device)  # in the loss
        self.opt.zero_grad(set_to_none=True)
        total = full.advantages.new_zeros(())  # sum of the micro-batches' numerators
        old_by_mb: list[tuple[slice, torch.Tensor]] = []
        for rows in self.micro_batches(full):
            batch = full.slice(rows)
            logp, entropy = self.logprobs(batch)
            if self.measure_step_kl:
                old_by_mb.append((rows, logp.detach()))
            old_logp = self._proximal(logp, batch)
            out = losses.compute(
                self.cfg.loss,
                logp,
                batch.behavior_logp,
                batch.advantages,
                batch.loss_mask,
                old_logp=old_logp,
                correction_spec=self.correction_spec,
                agg=agg,
                num_tokens=1,
                num_seqs=1,
                max_len=1,
                **self._hp,
            )
            out.loss.backward()
            total += out.loss.detach()
            parts.append(out.metrics)
            prox = logp.detach() if old_logp is None else old_logp
            # the loss's tokens before the correction: a non-finite one is in no metric (not in
            # tokens/trained, nor in the entropy's mean: where(), as its entropy may be nan),
            # and a row without any (an episode that crashed before the model spoke) is no
            # sequence of the batch: its w = 1 would pull the sequence ESS and VCPO's scale
            valid = out.valid
            num_tokens += valid.sum()
            ent_sum += torch.where(valid, entropy.detach(), 0.0).sum()
            seq = staleness.seq_log_ratio(prox, batch.behavior_logp, valid)
            seq_lr.append(seq[valid.any(dim=1)])
            tok_lr.append((logp.detach() - batch.behavior_logp)[valid])
        merged = losses.merge_metrics(parts)
        # sequences of the step: those in the loss, and those overlong `mask_loss` masked (TRL)
        seqs = merged["seqs"] + sum(g.masked for g in groups)
        norm = losses.normaliser(
            agg, tokens=merged["tokens"], seqs=seqs, max_len=self.max_new_tokens
        )
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(norm.to(p.grad))
        total_loss = total / norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.lr_at(self.version)
        lr_scale = staleness.vcpo_lr_scale(torch.cat(seq_lr)) if self.cfg.vcpo else 1.0
        finite = bool(torch.isfinite(total_loss)) and bool(torch.isfinite(grad_norm))
        # no token left in the loss (none sampled, all non-finite or masked by the correction)
        stepped = finite and bool(merged["tokens"] > 0)
        step_lr = lr * lr_scale * self.lr_scale  # schedule x VCPO x watchdog
        if stepped:
            for g in self.opt.param_groups:
                g["lr"] = step_lr
            precision.step_adamw(self.opt)
        else:
            self.skipped_steps += 1  # weights and optimizer state untouched
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        metrics = {k if "/" in k else f"train/{k}": v for k, v in losses.to_floats(merged).items()}
        metrics.update(
            {
                "train/loss": float(total_loss),
                "train/entropy": float(ent_sum / num_tokens.clamp(min=1)),
                "train/grad_norm": float(grad_norm),
                # a skipped step's too: the rate it would have applied (no jump in the metric)
                "train/lr": step_lr,
                "train/skipped": 0.0 if stepped else 1.0,
                # a skipped step's tokens entered no update: none trained (the loops count
                # them as wasted, tokens/computed - tokens/trained), none useful to goodput
                "tokens/trained": float(num_tokens) if stepped else 0.0,
                # the loss-mask tokens its forward and backward passes went over, trained or
                # not: what the step cost (sim.calibrate fits time/train_s on it)
                "tokens/computed": float(full.num_tokens),
                # how far the data's policy is from this one: 1 on-policy (docs/algorithms.md)
                "staleness/ess_token": staleness.ess(torch.cat(tok_lr)),
                "staleness/ess_seq": staleness.ess(torch.cat(seq_lr)),
            }
        )
        if math.isnan(metrics["train/grad_norm"]):
            metrics["train/grad_norm"] = float("inf")
        if self.measure_step_kl:
            metrics["train/step_kl"] = self.step_kl(full, old_by_mb) if stepped else 0.0
        return metrics

    @torch.no_grad()
    def step_kl(self, full: Batch, old: list[tuple[slice, torch.Tensor]]) -> float:
        """KL(before || after) of the step just taken, on its own tokens: the k3 estimate
        `mean(r - 1 - log r)`, `r = pi_after / pi_before`, over the loss mask (the tokens were
        sampled near `pi_before`). `old`: each micro-batch's rows and log-probs `[b, T]`
        before the update. Costs one forward pass without gradients."""
        total, n = 0.0, 0
        for rows, before in old:
            batch = full.slice(rows)
            after, _ = self.logprobs(batch)
            m = batch.loss_mask.bool()
            log_r = (after.float() - before.float())[m]
            # expm1: exp(x) - 1 - x cancels to 0 (or below) in float32 for small steps
            total += float((torch.expm1(log_r) - log_r).clamp(min=0).sum())
            n += int(m.sum())
        return total / max(n, 1)

    def micro_batches(self, full: Batch) -> list[slice]:
        """Row ranges of `full` (length-sorted): `micro_batch_size` rows and at most
        `micro_batch_tokens` tokens each, padded or, with `packing`, packed
        (train.microbatch)."""
        c = self.cfg
        return plan_micro_batches(
            row_widths(full.loss_mask), c.micro_batch_size, c.micro_batch_tokens, c.packing
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
