"""The warm start's cache key holds what its weights depend on: a warm start whose stopping
rule read a 16-prompt evaluation (it stops at a weaker model) gets its own entry instead of
the default one, which then kept a weak model for every later `slipstream train`."""

from __future__ import annotations

from slipstream.config import load_config
from slipstream.tasks.arithmetic import RunningSums
from slipstream.train.warmstart import cache_key, warmstart_evaluation, ws_seed


def _key(*overrides: str) -> str:
    cfg = load_config(None, list(overrides))
    ws = cfg.warmstart.for_task("builtin")
    return cache_key(RunningSums(), ws, ws_seed(cfg), evaluation=warmstart_evaluation(cfg))


def test_the_stopping_rules_evaluation_is_in_the_key_and_the_defaults_key_is_unchanged():
    default = _key()
    assert default == "b2acdefb0d1149fa"  # the entry `slipstream train` has always used
    assert warmstart_evaluation(load_config(None, [])) is None
    small = _key("eval.num_prompts=16")
    assert small != default and small != _key("sampling.max_new_tokens=32") != default
    assert _key("eval.num_prompts=16") == small  # deterministic
    assert _key("eval.every=3", "run.steps=5", "trainer.lr=1e-3") == default  # RL-only settings
