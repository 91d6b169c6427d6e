"""Config: every bad input is one clear line and exit code 2, never a traceback."""

from __future__ import annotations

import tomllib

import pytest
import torch

from slipstream.cli import main
from slipstream.config import Config, ConfigError, dump_config, load_config, parse_value


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["trainer.lrr=3e-4"], "unknown key 'trainer.lrr' (did you mean 'trainer.lr'?)"),
        (["trainr.lr=3e-4"], "unknown key 'trainr.lr' (did you mean trainer.lr?)"),
        (["trainer.lr=abc"], "trainer.lr: Input should be a valid number"),
        (
            ["sampling.group_size=0"],
            "sampling.group_size: Input should be greater than or equal to 1",
        ),
        (["sampling.top_p=1.5"], "sampling.top_p: Input should be less than or equal to 1"),
        (["trainer.loss=foo"], "trainer.loss: unknown 'foo'; valid: reinforce, ppo, dapo"),
        (["trainer.advantage=bar"], "trainer.advantage: unknown 'bar'; valid: grpo"),
        (["schedule.name=fast"], "schedule.name: unknown 'fast'; valid: sync, tail_batching"),
        (["task.kind=jsonl"], "task.path: required when task.kind = 'jsonl'"),
        (["trainer.lr"], "expected key=value"),
        (["trainer.betas=[0.9,1.0]"], "trainer.betas: each beta must be in [0, 1)"),
        (["run.steps.x=1"], "run.steps: Input should be a valid integer"),
        (["run.seed=1", "run.seed.x=2"], "'seed' is a value, not a section"),
        (
            ['task.prompt_template="Q: {question}"'],
            "task.prompt_template: 'Q: {question}' has no {prompt}",
        ),
        (['task.rewards=[{fun="x.py:f"}]'], "task.rewards[0].fn: Field required"),
        (
            [
                'schedule.name="pipeline"',
                "schedule.min_lag=2",
                "watchdog.enabled=true",
                'watchdog.actions={ess_low="tighten"}',
            ],
            "schedule.min_lag: 2 with a watchdog action 'tighten'",
        ),
        (
            ['task.rewards=[{fn="x.py:f", wieght=2}]'],
            "unknown key 'task.rewards[0].wieght' (did you mean 'task.rewards[0].weight'?)",
        ),
        (
            ["sampling.group_size=1", 'trainer.advantage="rloo"'],
            "sampling.group_size: rloo needs groups of at least 2",
        ),
        (
            ['task.kind="builtin_tools"', 'filters.overlong="penalty"'],
            "filters.overlong: 'penalty' weighs one completion",
        ),
        (
            ["task.chat_template_kwargs={messages=1}"],  # was "(not one of messages, ...)"
            "task.chat_template_kwargs: 'messages' is set by slipstream itself (reserved: "
            "messages, tools, documents, add_generation_prompt)",
        ),
    ],
)
def test_bad_override_names_the_key(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_exits_2_with_one_line(capsys):
    assert main(["train", "trainer.lrr=3e-4"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "trainer.lrr" in err and "Traceback" not in err


def test_maxrl_with_a_negative_reward_setting_exits_2(capsys):
    args = ["train", "trainer.advantage=maxrl", "filters.overlong=penalty"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "maxrl" in err and "overlong" in err


def test_agg_defaults_to_the_loss_default_and_the_builtin_task_choice():
    assert load_config().trainer.agg == "seq-mean-token-mean"  # the built-in task's own
    data = ["task.kind=jsonl", "task.path=x.jsonl"]
    assert load_config(None, data).trainer.agg == "token-mean"  # ppo's
    assert load_config(None, [*data, "trainer.loss=oapl"]).trainer.agg == "seq-mean-token-mean"
    assert load_config(None, [*data, "trainer.agg=token-sum-norm"]).trainer.agg == "token-sum-norm"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["schedule.min_lag=2"], "continuous-batching"),  # sync
        (["schedule.name=pipeline", "schedule.min_lag=4", "schedule.max_lag=2"], "at most"),
    ],
)
def test_min_lag_needs_continuous_batching_and_room_below_max_lag(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, overrides)
    load_config(None, ["schedule.name=pipeline", "schedule.min_lag=4", "schedule.max_lag=4"])


def test_file_then_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[trainer]\nlr = 0.01\nloss = "dapo"\n[sampling]\ngroup_size = 4\n')
    cfg = load_config(f, ["trainer.lr=3e-4"])
    assert cfg.trainer.lr == 3e-4 and cfg.trainer.loss == "dapo" and cfg.sampling.group_size == 4


def test_yaml_file(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("trainer:\n  batch_prompts: 4\nrun:\n  seed: 7\n")
    cfg = load_config(f)
    assert cfg.trainer.batch_prompts == 4 and cfg.run.seed == 7


def test_bad_file_syntax_is_one_line(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[trainer\nlr = 1")
    with pytest.raises(ConfigError, match=r"run.toml: not valid TOML"):
        load_config(f)
    j = (
        tmp_path / "run.json"
    )  # valid JSON, but configs are TOML or YAML ("not valid JSON" was wrong)
    j.write_text('{"trainer": {"lr": 0.001}}')
    with pytest.raises(
        ConfigError, match=r"run.json: not valid TOML \(a config file is TOML or YAML\)"
    ):
        load_config(j)


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[sampling]\ngroup_sise = 4\n")
    with pytest.raises(ConfigError, match=r"did you mean 'sampling.group_size'"):
        load_config(f)


@pytest.mark.parametrize(("text", "shown"), [("?", "None"), ("sampling:\n  1: 4\n", "sampling.1")])
def test_yaml_keys_that_are_not_strings_are_named(tmp_path, text, shown):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=rf"run.yaml: key '{shown}' is not text"):
        load_config(f)


def test_resolved_config_round_trips():
    cfg = load_config(None, ["trainer.lr=3e-4", 'run.dir="x"'])
    again = Config.model_validate(tomllib.loads(dump_config(cfg)))
    assert again == cfg


def test_parse_value():
    assert parse_value("3e-4") == 3e-4
    assert parse_value("true") is True
    assert parse_value("8") == 8
    assert parse_value("runs/a") == "runs/a"
    assert parse_value('"x y"') == "x y"


def test_cli_names_what_is_wrong_with_a_command(tmp_path, capsys):
    assert main(["--help"]) == 0
    assert "commands:" in capsys.readouterr().out
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
    assert main(["bench"]) == 2 and main(["bench", "presets"]) == 2
    assert "usage: slipstream bench schedules" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2  # a folder that is not a run
    assert f"{tmp_path}: no config.toml to resume from" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, key",
    [
        (['runtime.kind="inprocess"', 'schedule.name="sync"'], "the in-process sync loop"),
        (['task.kind="builtin_tools"'], "multi-turn environments"),
        (["runtime.chaos_kills=1"], "a run with runtime.chaos_kills"),
    ],
)
def test_recording_refuses_runs_a_replay_cannot_re_execute(extra, key):
    """What the schedule record cannot describe is refused with one line when the run starts.
    K changes under `auto` and the watchdog's actions are in the record: accepted (and
    replayed by tests/test_replay_run.py)."""
    base = ['schedule.name="pipeline"', 'runtime.kind="local"', "run.record_schedule=true"]
    load_config(None, base)  # recordable as it is
    watchdog = ["watchdog.enabled=true", 'watchdog.actions={step_kl="rollback"}']
    load_config(
        None, [*base, 'schedule.max_lag="auto"', *watchdog, "watchdog.inject_lr_spike_at=3"]
    )
    with pytest.raises(ConfigError, match=f"run.record_schedule: {key}"):
        load_config(None, [*base, *extra])


@pytest.mark.parametrize("loss", ["reinforce", "cispo", "dro", "oapl"])
def test_a_ppo_clip_on_a_loss_without_one_is_refused_before_the_run(loss):
    """Before, the config took it and the first training step raised (after the warm start
    and the first generation)."""
    with pytest.raises(ConfigError, match=rf"trainer.eps_high: loss '{loss}' takes no PPO clip"):
        load_config(None, [f"trainer.loss={loss}", "trainer.eps_high=0.3"])
    with pytest.raises(ConfigError) as e:  # it named the loss's constants, which are no setting
        load_config(None, [f"trainer.loss={loss}", "trainer.eps_high=0.3"])
    assert "its settings" not in str(e.value)
    for ok in ("ppo", "dapo", "gspo"):
        assert load_config(None, [f"trainer.loss={ok}", "trainer.eps_high=0.3"]).trainer.eps_high
    with pytest.raises(ConfigError, match=rf"trainer.dual_clip: loss '{loss}' takes no PPO clip"):
        load_config(None, [f"trainer.loss={loss}", "trainer.dual_clip=3"])


def test_the_dual_clip_reaches_the_loss():
    """`trainer.dual_clip` (verl's clip_ratio_c) is the PPO loss's `dual_clip`: a token with
    a negative advantage whose ratio is far above 1 has its loss floored at -adv x c."""
    from slipstream.algo import losses
    from slipstream.train.trainer import Trainer

    with pytest.raises(ConfigError, match="greater than 1"):
        load_config(None, ["trainer.dual_clip=1"])
    cfg = load_config(None, ["trainer.loss=ppo", "trainer.dual_clip=3"]).trainer
    hp = Trainer.loss_settings(cfg)
    assert hp == {"dual_clip": 3.0}
    # ratio e^2 = 7.39 on a token of advantage -1: clipped PPO gives 7.39, the dual clip 3
    logp, old = torch.tensor([[2.0]]), torch.tensor([[0.0]])
    adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 1)
    with_clip = losses.compute("ppo", logp, old, adv, mask, **hp).loss
    without = losses.compute("ppo", logp, old, adv, mask).loss
    assert with_clip.item() == pytest.approx(3.0) and without.item() == pytest.approx(
        7.389, abs=1e-3
    )


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("num_samplers", "3", "has no sampler processes"),
        ("chaos_kills", "2", "has no sampler processes"),
        ("defer_eval", "true", "evaluates in line"),
    ],
)
def test_orchestrated_runtime_settings_on_the_in_process_loop_are_refused(key, value, why):
    """Before, `slipstream train runtime.chaos_kills=2` (the default in-process sync loop) ran
    one sampler and killed nothing, exit 0, without a word; `runtime.defer_eval=true`
    evaluated in line all the same."""
    setting = f"runtime.{key}={value}"
    with pytest.raises(ConfigError, match=f"^runtime.{key}: the in-process sync loop {why}"):
        load_config(None, [setting])
    load_config(None, [setting, 'runtime.kind="local"'])
    load_config(None, [setting, 'schedule.name="pipeline"'])


@pytest.mark.parametrize(
    "where", [['schedule.name="pipeline"'], ['schedule.name="async"'], ['runtime.kind="local"']]
)
def test_refill_off_outside_the_in_process_sync_loop_is_refused(where):
    """Before, `filters.pass_rate_refill=false` with any orchestrated schedule (which issues
    prompts until a step holds B groups) ran as if it were true, without a word."""
    off = "filters.pass_rate_refill=false"
    with pytest.raises(ConfigError, match=r"^filters.pass_rate_refill: false is honoured only"):
        load_config(None, [off, *where])
    assert not load_config(None, [off]).filters.pass_rate_refill  # the in-process sync loop
    assert load_config(None, [*where]).filters.pass_rate_refill


def test_a_date_like_value_is_text_and_errors_name_the_setting_itself():
    """`run.dir=2024-01-01` was read as a TOML date and refused; errors on settings of several
    types named keys that do not exist (`schedule.max_lag.int`); a number given to a text
    setting now says how to quote it."""
    assert load_config(None, ["run.dir=2024-01-01"]).run.dir == "2024-01-01"
    with pytest.raises(ConfigError, match=r"^schedule.max_lag: Input should be"):
        load_config(None, ["schedule.max_lag=soon"])
    with pytest.raises(ConfigError, match=r"^runtime.sampler_devices: Input should be 'auto'"):
        load_config(None, ["runtime.sampler_devices=3"])
    with pytest.raises(ConfigError, match=r"needs quotes: wandb.name='\"123\"'"):
        load_config(None, ["wandb.name=123"])
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.lrr' \(did you mean 'trainer.lr'"):
        load_config(None, ["trainer.lrr=1"])


def test_a_config_file_by_flag_or_first_and_a_misplaced_one_says_where(tmp_path, capsys):
    """TRL's CLI takes `--config FILE`: it was an unknown argument (a usage message); a file
    after an override was only 'expected key=value'."""
    from slipstream.cli import main

    f = tmp_path / "run.toml"
    f.write_text("[trainer]\nlr = 0.5\n")
    run = tmp_path / "run"
    assert main(["train", "--config", str(f), "trainer.lrr=1"]) == 2  # the file was read
    assert "unknown key 'trainer.lrr'" in capsys.readouterr().err
    assert load_config(f, ["sampling.group_size=4"]).trainer.lr == 0.5
    assert main(["train", "--config", str(f), str(f), f"run.dir={run}"]) == 2
    assert "one config file a run" in capsys.readouterr().err
    assert main(["train", "trainer.lr=0.1", str(f)]) == 2
    err = capsys.readouterr().err
    assert "a config file goes first (or --config FILE)" in err and "\n" not in err.strip()
    assert not run.exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run.steps=true", "run.steps: Input should be a valid integer (got True)"),  # was 1
        ("trainer.lr=false", "trainer.lr: Input should be a valid number (got False)"),
        ("schedule.max_lag=true", "schedule.max_lag: Input should be a valid integer (got True)"),
        ("trainer.betas=[true, 0.99]", "trainer.betas: Input should be a valid number"),
        (
            "trainer.activation_checkpointing=1",  # was True
            "trainer.activation_checkpointing: Input should be a valid boolean (got 1)",
        ),
        ("run.quiet=0.0", "run.quiet: Input should be a valid boolean (got 0.0)"),
    ],
)
def test_a_boolean_is_no_number_and_a_number_no_boolean(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_boolean_is_no_number_in_a_file_or_an_assignment_either(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run:\n  steps: yes\n")  # YAML 1.1: a boolean
    with pytest.raises(ConfigError, match=r"^run\.steps: Input should be a valid integer"):
        load_config(f)
    cfg = load_config(None, ["run.steps=3", "trainer.lr=1e-4", "run.quiet=true"])
    assert (cfg.run.steps, cfg.trainer.lr, cfg.run.quiet) == (3, 1e-4, True)
    with pytest.raises(ValueError, match="valid integer"):
        cfg.run.steps = True


def test_a_temperature_the_sampler_cannot_scale_is_refused_in_the_config():
    """Below engine.request.MIN_TEMPERATURE (0 aside, greedy) every request of the run would
    be refused when made: the config says so before any work."""
    for key in ("sampling.temperature", "eval.temperature"):
        with pytest.raises(ConfigError, match=rf"^{key}: "):
            load_config(None, [f"{key}=1e-6"])
    assert load_config(None, ["eval.temperature=0"]).eval.temperature == 0.0


@pytest.mark.parametrize(
    "override",
    [
        "sampling.temperature=inf",
        "trainer.lr=nan",
        "eval.temperature=inf",
        "env.step_timeout_s=inf",
    ],
)
def test_no_setting_takes_infinity_or_nan(override):
    """TOML's `inf` and `nan` reached float settings: a temperature of inf sampled from a
    uniform distribution and recorded log-probs of it, nan reached the optimizer."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}: .*finite"):
        load_config(None, [override])


def test_vllms_top_k_of_minus_one_keeps_all_as_0_does():
    """vLLM's top_k = -1 (no limit) was refused (ge=0); it is read as 0, which keeps all."""
    assert load_config(None, ["sampling.top_k=-1"]).sampling.top_k == 0
    assert load_config(None, ["sampling.top_k=5"]).sampling.top_k == 5
    with pytest.raises(
        ConfigError, match=r"sampling\.top_k: Input should be greater than or equal to -1"
    ):
        load_config(None, ["sampling.top_k=-2"])
