"""Users from TRL and verl: an unknown key names the setting it maps to, and a model folder
takes TRL's defaults where the built-in model's would wreck it."""

from __future__ import annotations

import pytest

from slipstream.config import ConfigError, load_config
from slipstream.config.load import Config, _all_keys
from slipstream.config.names import SETTING_FOR


@pytest.mark.parametrize(
    "override, said",
    [
        ("trainer.learning_rate=1e-6", "(did you mean trainer.lr?)"),  # was trainer.lr_min_ratio
        ("temperature=1.0", "(did you mean sampling.temperature?)"),  # was eval.temperature
        ("num_generations=8", "(did you mean sampling.group_size?)"),
        ("trainer.beta=0.04", "no KL-to-reference penalty"),  # was trainer.betas
        ("trainer.lrr=3e-4", "(did you mean 'trainer.lr'?)"),  # a typo: the nearest spelling
        ("sampler.top_k=5", "(did you mean sampling.top_k?)"),
        ("sampler={top_k=5, top_p=1}", "(did you mean the section 'sampling'?)"),
    ],
)
def test_an_unknown_key_names_the_setting_it_maps_to(override, said):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert said in str(e.value) and "\n" not in str(e.value)


def test_every_mapped_setting_exists():
    keys = _all_keys(Config)
    for name, target in SETTING_FOR.items():
        first = target.split()[0]
        assert first in keys, (name, target)


def test_a_model_folder_takes_trls_learning_rate_and_completion_length():
    """lr 6e-4 and 64 new tokens are the 0.8M-parameter built-in model's; a pretrained model
    given them was trained at 600x TRL's learning rate with answers cut at 64 tokens."""
    cfg = load_config(None, ["model.path=/m"])
    assert (cfg.trainer.lr, cfg.sampling.max_new_tokens) == (1e-6, 256)
    cfg = load_config(None, ["model.path=/m", "trainer.lr=3e-6", "sampling.max_new_tokens=64"])
    assert (cfg.trainer.lr, cfg.sampling.max_new_tokens) == (3e-6, 64)
    cfg = load_config(None, [])
    assert (cfg.trainer.lr, cfg.sampling.max_new_tokens) == (6e-4, 64)
