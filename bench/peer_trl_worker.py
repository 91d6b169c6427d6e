"""TRL's side of bench/peer_trl.py, run with the separate virtual environment's Python (trl
installed there, never in slipstream's). Imports nothing of slipstream.

    python peer_trl_worker.py MODEL_DIR TRAIN_JSONL OUT_DIR --seed S --steps N --save-at 30 300

Trains `GRPOTrainer` with the settings of the comparison (module docstring of peer_trl.py),
saves the model at each `--save-at` step under OUT_DIR/step_NNNNNN, and writes OUT_DIR/trl.json
with the time at the end of every step (`step_end_s`, perf_counter seconds from the start of
`train()`), the installed versions and the settings used.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-at", type=int, nargs="*", default=[])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import datasets
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer

    out = Path(args.out)
    rows = [json.loads(line) for line in Path(args.train).read_text().splitlines()]
    data = datasets.Dataset.from_list(rows)

    def exact(completions: list[str], answer: list[str], **_: object) -> list[float]:
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    settings = dict(
        output_dir=str(out / "trainer"),
        seed=args.seed,
        max_steps=args.steps,
        per_device_train_batch_size=64,  # completions per step: 8 prompts x 8
        num_generations=8,
        gradient_accumulation_steps=1,
        max_completion_length=8,
        learning_rate=5e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        num_iterations=1,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
    )
    cfg = GRPOConfig(**settings)
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    ends: list[float] = []
    origin = [0.0]

    class Clock(transformers.TrainerCallback):
        def on_train_begin(self, *a: object, **k: object) -> None:
            origin[0] = time.perf_counter()

        def on_step_end(self, a, state, control, **k):
            ends.append(time.perf_counter() - origin[0])
            if state.global_step in args.save_at:  # after the step's time is taken
                trainer.save_model(str(out / f"step_{state.global_step:06d}"))
                tok.save_pretrained(str(out / f"step_{state.global_step:06d}"))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact,
        args=cfg,
        train_dataset=data,
        processing_class=tok,
        callbacks=[Clock()],
    )
    trainer.train()
    resolved = {k: getattr(cfg, k) for k in settings}
    for k in ("temperature", "top_p", "top_k", "loss_type", "scale_rewards", "epsilon"):
        resolved[k] = getattr(cfg, k, None)
    resolved.update(
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        adam_epsilon=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        optim=str(cfg.optim),
    )
    info = {
        "step_end_s": ends,
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "settings": {
            k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in resolved.items()
        },
    }
    (out / "trl.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
