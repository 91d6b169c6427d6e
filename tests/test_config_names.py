"""Users from TRL and verl: an unknown key names the setting it maps to, and a model folder
takes TRL's defaults where the built-in model's would wreck it."""

from __future__ import annotations

import re
from pathlib import Path

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


@pytest.mark.parametrize(
    "override, meant",
    [
        # TRL's epsilon and verl's clip_ratio set both bounds: eps_low alone left eps_high at
        # the loss's 0.2, so epsilon=0.1 trained with the clip [0.9, 1.2] instead of [0.9, 1.1]
        ("trainer.epsilon=0.1", "trainer.eps_low and trainer.eps_high"),
        ("actor.clip_ratio=0.1", "trainer.eps_low and trainer.eps_high"),  # was lr_min_ratio
        ("importance_sampling_level='sequence'", "trainer.loss = 'gspo'"),  # was packing
        ("norm_adv_by_std_in_grpo=false", "trainer.advantage (true: grpo, false: dr_grpo)"),
        ("loss_type='dr_grpo'", "'dr_grpo' agg=token-sum-norm"),
        ("loss_agg_mode='seq-mean-token-sum-norm'", "seq-mean-token-sum-norm is token-sum-norm"),
        ("trainer.delta=4.0", "no cap on the unclipped ratio"),  # was trainer.betas
        ("actor.clip_ratio_c=3.0", "trainer.dual_clip"),  # was trainer.lr_min_ratio
    ],
)
def test_trl_and_verl_loss_settings_name_what_they_map_to(override, meant):
    """Each of TRL's and verl's loss and advantage settings is answered with slipstream's
    (or with why there is none), not with the nearest spelling of another setting."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert meant in str(e.value), str(e.value)


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


def _trl_table() -> list[tuple[list[str], set[str], str]]:
    """The README's "Coming from TRL" rows: (TRL names, slipstream settings, note)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = readme.split("### Coming from TRL", 1)[1].split("\n\n")
    table = next(b for b in blocks if b.startswith("| TRL"))
    rows = []
    for line in table.splitlines()[2:]:
        trl, ours, note = (c.strip() for c in line.strip().strip("|").split("|"))
        names = [m.split("=")[0] for m in re.findall(r"`([a-z_][a-z0-9_]*(?:=[^`]*)?)`", trl)]
        settings = {w.split("=")[0] for m in re.findall(r"`([^`]*)`", ours) for w in m.split()}
        rows.append((names, {s for s in settings if "." in s}, note if ours == "none" else ""))
    return [r for r in rows if r[0]]


def test_the_readme_trl_table_is_read():
    rows = _trl_table()
    assert len(rows) >= 15
    assert (["num_iterations"], set(), "one optimizer update a batch") in rows
    names = {n for r in rows for n in r[0]}
    assert {"gradient_accumulation_steps", "learning_rate", "report_to"} <= names


@pytest.mark.parametrize("row", _trl_table(), ids=lambda r: r[0][0])
def test_every_trl_name_of_the_readme_table_gets_the_tables_answer(row):
    """Bare and section-prefixed: `gradient_accumulation_steps` was answered 'trainer.grad_clip'
    or 'trainer.warmup_steps', `num_iterations` 'trainer.lr_min_ratio' or nothing."""
    names, settings, note = row
    keys = _all_keys(Config)
    for name in names:
        for key in (name, f"trainer.{name}"):
            if key in keys:  # the same name here (trainer.warmup_steps)
                assert key in settings, (key, settings)
                continue
            with pytest.raises(ConfigError) as e:
                load_config(None, [f"{key}=1"])
            said = str(e.value)
            if note:
                assert note in said and "did you mean" not in said, (key, said)
                continue
            meant = re.findall(r"[a-z_]+\.[a-z_]+", said.split("(did you mean ", 1)[1])
            assert settings & set(meant), (key, said, settings)


def test_an_unknown_section_with_a_bracket_and_a_newline_stays_one_line(tmp_path):
    """Found by tests/test_fuzz.py: a config file's empty section named "\n[" was taken for a
    list entry's field (any '[' in the key), so that section itself was suggested, written
    raw: a newline in a one-line error."""
    import pytest

    from slipstream.config import ConfigError, load_config

    f = tmp_path / "c.toml"
    f.write_text('["\\n["]\n')  # the TOML section "\n[", as the fuzzer wrote it
    with pytest.raises(ConfigError) as e:
        load_config(str(f), [])
    said = str(e.value)
    assert "\n" not in said and "did you mean the section" not in said, said
