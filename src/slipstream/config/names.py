"""The settings other RL libraries call by other names: the hint of an unknown key.

A user who writes TRL's `learning_rate=1e-6` (or `trainer.learning_rate`) is told the setting
it maps to, not the nearest spelling (`trainer.lr_min_ratio`, which would be accepted and
change nothing they meant). `SETTING_FOR` maps a name's last part, as TRL's `GRPOConfig`,
`ScriptArguments` and `ModelConfig`, and verl's configs spell it, to what slipstream has; the
README's "Coming from TRL" table says the same with its caveats.
"""

from __future__ import annotations

import difflib

SETTING_FOR: dict[str, str] = {
    "learning_rate": "trainer.lr",
    "lr": "trainer.lr",
    "lr_scheduler_type": "trainer.lr_schedule",
    "warmup_steps": "trainer.warmup_steps",
    "weight_decay": "trainer.weight_decay",
    "max_grad_norm": "trainer.grad_clip",
    "adam_beta1": "trainer.betas",
    "adam_beta2": "trainer.betas",
    "num_generations": "sampling.group_size",
    "rollout_n": "sampling.group_size",
    "max_completion_length": "sampling.max_new_tokens",
    "response_length": "sampling.max_new_tokens",
    "max_new_tokens": "sampling.max_new_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "top_k": "sampling.top_k",
    "epsilon": "trainer.eps_low and trainer.eps_high (TRL's epsilon alone sets both bounds)",
    "clip_ratio": "trainer.eps_low and trainer.eps_high (verl's clip_ratio sets both bounds)",
    "clip_ratio_low": "trainer.eps_low",
    "epsilon_high": "trainer.eps_high",
    "clip_ratio_high": "trainer.eps_high",
    "clip_ratio_c": "trainer.dual_clip (verl's dual clip; off unless set here)",
    "loss_type": "trainer.loss and trainer.agg (TRL's 'dapo' and 'bnpo' are loss=ppo "
    "agg=token-mean, 'grpo' agg=seq-mean-token-mean, 'dr_grpo' agg=token-sum-norm)",
    "loss_agg_mode": "trainer.agg (verl's seq-mean-token-sum-norm is token-sum-norm)",
    "scale_rewards": "trainer.advantage (grpo scales by the group's std, dr_grpo does not; "
    "TRL's 'batch' std has no equivalent)",
    "norm_adv_by_std_in_grpo": "trainer.advantage (true: grpo, false: dr_grpo)",
    "importance_sampling_level": "trainer.loss = 'gspo' for 'sequence' (eps 3e-4 / 4e-4); "
    "'token' is ppo or dapo",
    "adv_estimator": "trainer.advantage",
    "per_device_train_batch_size": "trainer.batch_prompts (prompts a step; x group_size samples)",
    "train_batch_size": "trainer.batch_prompts (prompts a step; x group_size samples)",
    "gradient_accumulation_steps": "trainer.batch_prompts (prompts a step; the memory of one "
    "backward pass is trainer.micro_batch_tokens)",
    "max_steps": "run.steps",
    "total_training_steps": "run.steps",
    "seed": "run.seed",
    "output_dir": "run.dir",
    "report_to": "run.sinks",
    "save_steps": "checkpoint.every",
    "eval_steps": "eval.every",
    "reward_weights": "task.rewards (a weight per function)",
    "reward_funcs": "task.reward or task.rewards",
    "mask_truncated_completions": "filters.overlong = 'mask_loss'",
    "model_name_or_path": "model.path",
    "dataset_name": "task.path",
    "dataset_config": "task.dataset_config",
    "dataset_train_split": "task.split",
    "dataset_test_split": "task.heldout_split",
    "bf16": "model.dtype = 'bfloat16'",
    "torch_dtype": "model.dtype",
    "gradient_checkpointing": "trainer.activation_checkpointing",
    "max_prompt_length": "engine.max_len (prompt and completion together)",
}
# names of what slipstream does not have, and why that is fine
NO_SETTING: dict[str, str] = {
    "beta": "slipstream has no KL-to-reference penalty: TRL's default beta = 0",
    "kl_coef": "slipstream has no KL-to-reference penalty",
    "use_kl_loss": "slipstream has no KL-to-reference penalty",
    "delta": "slipstream has no cap on the unclipped ratio (TRL's two-sided delta)",
    "num_iterations": "slipstream has no such setting: one optimizer update a batch",
    "ppo_epochs": "slipstream has no such setting: one optimizer update a batch",
}


def hint(key: str, known: list[str]) -> str:
    """' (did you mean ...?)' for an unknown dotted `key`: the setting its last part names in
    another library (`SETTING_FOR`; `NO_SETTING`: why there is none), a setting of that last
    part in another section, else the nearest spelling of the whole key; '' when nothing is
    near."""
    last = key.rsplit(".", 1)[-1]
    if last in NO_SETTING:
        return f" ({NO_SETTING[last]})"
    if last in SETTING_FOR:
        return f" (did you mean {SETTING_FOR[last]}?)"
    if "." not in key:  # a section of several keys, misspelt
        sections = sorted({k.split(".")[0] for k in known} - {key})
        near = difflib.get_close_matches(key, sections, n=1, cutoff=0.6)
        if near:  # (quoted as the key is: a name with a newline stays on one line)
            return f" (did you mean the section {near[0]!r}?)"
    same = [k for k in known if k.rsplit(".", 1)[-1] == last and k != key]
    if same:
        return f" (did you mean {' or '.join(same[:3])}?)"
    near = difflib.get_close_matches(key, [k for k in known if k != key], n=1, cutoff=0.5)
    return f" (did you mean {near[0]!r}?)" if near else ""
