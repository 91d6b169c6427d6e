"""Calibration against synthetic local runs and a recorded pair of real ones.

`fake_run` writes run folders in the orchestrator's format from an independent, step-by-step
model of the local runtime (one sampler process decoding its whole batch at once, one trainer
process): one mixed forward prefills every prompt and samples each first token, every later
decode step costs a + b n + e ctx seconds, training costs c + d trained (completion) tokens,
and each weight sync `sync` seconds; 3 % noise on every phase. The calibration must recover
those costs from one run and predict another run, with another batch size or schedule,
within 10 %. tests/data/cal_a and cal_b are two real in-process `sync` runs of the built-in
model (batch_prompts 32 and 64, group_size 8; metrics trimmed to the keys the calibration
reads): fitted on either, the other's step time and sampler busy fraction within 15 %.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slipstream.sim.calibrate import (
    context_scale,
    fit_passes,
    fit_profile,
    load_calibration,
    nonneg_lstsq,
    predict,
    predict_runs,
    save_calibration,
    sim_config,
    source_lengths,
)
from slipstream.sim.cli import sim_main
from slipstream.sim.runs import RunError, pool_runs, read_run

TRUE = {"a": 2e-3, "b": 1.5e-4, "e": 4e-7, "c": 0.05, "d": 3e-5, "sync": 0.02}
PROMPT = 24
MODEL_INFO = {
    "params": 2_000_000,
    "layers": 4,
    "hidden": 128,
    "kv_heads": 2,
    "head_dim": 32,
    "vocab": 512,
}


def _generate(lens: np.ndarray, rng: np.random.Generator) -> float:
    """Seconds for one sampler to prefill and decode every sequence of `lens` together."""
    a, b, e = TRUE["a"], TRUE["b"], TRUE["e"]
    t = a + len(lens) * (b * PROMPT + e * PROMPT * PROMPT / 2)  # the prefill pass
    for x in range(1, int(lens.max())):
        active = lens > x
        n = int(active.sum())
        t += a + b * n + e * n * (PROMPT + x)
    return t * (1 + 0.03 * rng.standard_normal())


def _lengths(rng: np.random.Generator, prompts: int, group: int, max_new: int) -> np.ndarray:
    mu = np.log(60) + 0.4 * rng.standard_normal(prompts)
    lens = np.exp(mu[:, None] + 0.4 * rng.standard_normal((prompts, group)))
    return np.clip(np.rint(lens), 1, max_new).astype(int).ravel()


def fake_run(
    path: Path, batch_prompts: int, schedule: str = "sync", steps: int = 60, seed: int = 0
) -> Path:
    """A run folder as the local runtime writes it. `sync`: generate, train, sync in turn.
    `double_buffer`: the sampler generates batch k+1 (with weights k-1) while the trainer
    trains batch k."""
    rng = np.random.default_rng(seed)
    group, max_new = 4, 256
    path.mkdir(parents=True)
    path.joinpath("config.toml").write_text(
        f"[sampling]\ngroup_size = {group}\nmax_new_tokens = {max_new}\n"
        f"[trainer]\nbatch_prompts = {batch_prompts}\nmicro_batch_size = 8\n"
        f'[schedule]\nname = "{schedule}"\nmax_lag = {1 if schedule == "double_buffer" else 0}\n'
    )
    path.joinpath("model_info.json").write_text(json.dumps(MODEL_INFO))
    sampler_free, trainer_free, published, last_end = 0.0, 0.0, [0.0], 0.0
    rows = []
    for k in range(steps):
        lens = _lengths(rng, batch_prompts, group, max_new)
        gen = _generate(lens, rng)
        trained = int(lens.sum())  # loss tokens: completions only
        train = (TRUE["c"] + TRUE["d"] * trained) * (1 + 0.03 * rng.standard_normal())
        lag = 1 if schedule == "double_buffer" else 0
        start = max(sampler_free, published[max(0, k - lag)])
        start += TRUE["sync"] if k > 0 else 0.0  # the sampler loads the newest weights
        sampler_free = start + gen
        train_end = max(sampler_free, trainer_free) + train
        trainer_free = train_end + (TRUE["sync"] if schedule != "sync" else 0.0)
        published.append(train_end)
        step_time, last_end = train_end - last_end, train_end
        rows.append(
            {
                "step": k,
                "step_time_s": step_time,
                "time/generate_s": gen,
                "time/train_s": train,
                "tokens/generated": int(lens.sum()),
                "tokens/trained": trained,
                "engine/decode_steps": int(lens.max()) - 1,
                "engine/prefill_tokens": PROMPT * len(lens),
                "completion_len_mean": float(lens.mean()),
                "completion_len_max": int(lens.max()),
                "sampler_busy": min(1.0, gen / step_time),
                "completion_lens": lens.tolist(),
            }
        )
    path.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_nonneg_lstsq_recovers_and_clamps() -> None:
    X = np.array([[1.0, 2.0], [2.0, 1.0], [3.0, 5.0]])
    assert nonneg_lstsq(X, X @ np.array([0.5, 2.0])) == pytest.approx([0.5, 2.0])
    coef = nonneg_lstsq(X, X @ np.array([1.0, -0.3]))
    assert (coef >= 0).all() and coef[1] == 0


def test_context_scale_golden() -> None:
    """Completions of 3 and 5 tokens after prompts of 4 (8 prefilled tokens; rows 2 + 4 + 8):
    the simulator counts 2 x 4 x 5 / 2 = 20 prefill keys and (2 x 4 + 3) + (4 x 4 + 10) = 37
    decode keys; forwards that read 114 are 2x that. A step whose rows its lengths do not
    account for (an overlapping schedule logs the trained groups only) is not counted; none
    counted: 1.0."""
    step = {"completion_lens": [3, 5], "engine/prefill_tokens": 8, "engine/pass_rows": 14}
    assert context_scale([{**step, "engine/pass_ctx": 114}]) == 2.0
    partial = {**step, "engine/pass_rows": 30, "engine/pass_ctx": 1000}
    assert context_scale([{**step, "engine/pass_ctx": 57}, partial]) == 1.0
    assert context_scale([partial]) == 1.0 and context_scale([]) == 1.0


def test_the_profile_reads_keys_at_the_measured_rate(tmp_path: Path) -> None:
    """fit_profile scales the fitted cost per key by context_scale of the run (consistency
    check of the wiring: the same run, its forwards said to read twice the keys counted)."""
    run = read_run(fake_run(tmp_path / "a", batch_prompts=8))
    base = fit_profile(run).hardware.decode_ctx_s
    assert base is not None and base > 0
    for m in run.metrics:
        lens = np.asarray(m["completion_lens"], dtype=np.float64)
        m["engine/pass_rows"] = float((lens - 1).sum()) + m["engine/prefill_tokens"]
        counted = len(lens) * PROMPT * (PROMPT + 1) / 2
        m["engine/pass_ctx"] = 2 * (
            counted + float(((lens - 1) * PROMPT + lens * (lens - 1) / 2).sum())
        )
    assert fit_profile(run).hardware.decode_ctx_s == pytest.approx(2 * base)


def test_fit_recovers_the_true_costs(tmp_path: Path) -> None:
    cal = fit_profile(read_run(fake_run(tmp_path / "a", batch_prompts=8)))
    hw = cal.hardware
    assert cal.prompt_len == PROMPT and cal.prefills_per_group == 4  # every sample prefilled
    assert hw.decode_overhead_s == pytest.approx(TRUE["a"], rel=0.25)
    assert hw.decode_seq_s == pytest.approx(TRUE["b"], rel=0.3)
    assert hw.train_token_s == pytest.approx(TRUE["d"], rel=0.2)
    assert hw.sync_latency_s == pytest.approx(TRUE["sync"], abs=0.02)
    assert cal.fit_error["generate"] < 0.05 and cal.fit_error["train"] < 0.05


def test_the_training_line_is_fitted_on_the_tokens_computed_a_skipped_steps_too(
    tmp_path: Path,
) -> None:
    """A step the trainer skipped as non-finite trained no token (`tokens/trained` 0) yet
    spent its forward and backward passes: the line is fitted on `tokens/computed`, so every
    fourth step skipped leaves the recovered cost per token and the trained share as they were
    (fitted on `tokens/trained`, those steps pulled the line's slope down and its intercept up,
    and the share to 0.75)."""
    path = fake_run(tmp_path / "a", batch_prompts=8)
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r["tokens/computed"] = r["tokens/trained"]
        if i % 4 == 3:
            r["tokens/trained"], r["train/skipped"] = 0, 1.0
    path.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cal = fit_profile(read_run(path))
    assert cal.hardware.train_token_s == pytest.approx(TRUE["d"], rel=0.2)
    assert cal.hardware.train_overhead_s == pytest.approx(TRUE["c"], rel=0.5)
    assert cal.trained_frac == 1.0  # the fake run's filters keep every token
    assert cal.fit_error["train"] < 0.05


@pytest.mark.parametrize(
    ("batch_prompts", "schedule"),
    [(16, "sync"), (4, "sync"), (8, "double_buffer")],
)
def test_predicts_another_batch_size_or_schedule_within_10_percent(
    tmp_path: Path, batch_prompts: int, schedule: str
) -> None:
    cal = fit_profile(read_run(fake_run(tmp_path / "a", batch_prompts=8)))
    target = read_run(
        fake_run(tmp_path / "b", batch_prompts=batch_prompts, schedule=schedule, seed=7)
    )
    cmp = predict(cal, target)
    assert abs(cmp["step_time_err"]) < 0.10, cmp
    assert abs(cmp["sampler_busy_err"]) < 0.10, cmp


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(("source", "target"), [("cal_a", "cal_b"), ("cal_b", "cal_a")])
def test_predicts_a_recorded_real_run_within_15_percent(source: str, target: str) -> None:
    cal = fit_profile(read_run(DATA / source))
    assert 0 < cal.trained_frac < 1  # the filters drop groups: fewer tokens trained
    cmp = predict(cal, read_run(DATA / target))
    assert abs(cmp["step_time_err"]) < 0.15, cmp
    assert abs(cmp["sampler_busy_err"]) < 0.15, cmp


def test_calibration_file_round_trip(tmp_path: Path) -> None:
    cal = fit_profile(read_run(fake_run(tmp_path / "a", batch_prompts=8, steps=4)))
    save_calibration(cal, tmp_path / "p.json")
    assert load_calibration(tmp_path / "p.json") == cal
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RunError, match="not a calibration file"):
        load_calibration(tmp_path / "bad.json")


def test_cli_calibrate_then_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = fake_run(tmp_path / "a", batch_prompts=8, steps=6)
    b = fake_run(tmp_path / "b", batch_prompts=16, steps=6, seed=3)
    assert sim_main(["--calibrate", str(a)]) == 0
    assert (a / "sim_profile.json").exists() and "decode s/pass" in capsys.readouterr().out
    assert sim_main(["--predict", str(b), "--profile", str(a / "sim_profile.json"), "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    assert abs(cmp["step_time_err"]) < 0.15
    # in one command: calibrate, write the profile, then predict with it
    out = tmp_path / "p.json"
    assert sim_main(["--calibrate", str(a), "--out", str(out), "--predict", str(b), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["profile"] == str(out) and got["predict"] == cmp
    assert sim_main(["--calibrate", str(a), "--out", str(out), "--predict", str(b)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "step_time_s" in text and "measured" in text
    argv = ["--calibrate", str(a), "--predict", str(b), "--profile", str(out)]
    assert sim_main(argv) == 2
    assert "predicts with the profile it fits" in capsys.readouterr().err


def test_run_folder_errors_name_file_and_line(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "a", batch_prompts=2, steps=3)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{oops", lines[2]]) + "\n")
    with pytest.raises(RunError, match=r"metrics.jsonl:2: not valid JSON"):
        read_run(run)
    row = json.loads(lines[0])
    del row["time/train_s"]
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(RunError, match=r"metrics.jsonl:1: missing time/train_s"):
        read_run(run)
    (run / "config.toml").unlink()  # it said only "config.toml: missing"
    with pytest.raises(RunError, match=r"/a: not a run folder \(no config.toml\)"):
        read_run(run)
    (tmp_path / "b").mkdir()
    with pytest.raises(RunError, match=r"/b: not a run folder \(no config.toml\)"):
        read_run(tmp_path / "b")  # a folder, empty


def _pass_sums(lens: np.ndarray, rng: np.random.Generator) -> tuple[float, dict[str, float]]:
    """One step's forwards as the engine sums them (engine.stats.PASS_SUMS): the prefill pass,
    then one decode pass per position, each a + b rows + e context with 3 % noise of its own."""
    a, b, e = TRUE["a"], TRUE["b"], TRUE["e"]
    passes = [(len(lens) * PROMPT, len(lens) * PROMPT * (PROMPT + 1) / 2)]
    for x in range(1, int(lens.max())):
        n = int((lens > x).sum())
        passes.append((n, n * (PROMPT + x)))
    names = ("n", "rows", "ctx", "s", "rows2", "rows_ctx", "ctx2", "rows_s", "ctx_s")
    sums = dict.fromkeys((f"engine/pass_{k}" for k in names), 0.0)
    for r, c in passes:
        t = (a + b * r + e * c) * (1 + 0.03 * rng.standard_normal())
        for k, v in zip(names, (1, r, c, t, r * r, r * c, c * c, r * t, c * t)):
            sums[f"engine/pass_{k}"] += v
    return sums["engine/pass_s"], sums


def test_the_decode_line_is_fitted_from_the_engines_forward_passes(tmp_path: Path) -> None:
    """With the per-pass sums logged, the three costs come from the forwards themselves (rows
    vary from the whole batch to one within a step), not from step totals, where passes and
    rows move together; the step fit alone does not pin the per-row cost."""
    run = fake_run(tmp_path / "a", batch_prompts=8, steps=20)
    rng = np.random.default_rng(1)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        gen, sums = _pass_sums(np.array(r["completion_lens"]), rng)
        r.update(sums, **{"time/generate_s": gen})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    coef = fit_passes(read_run(run).metrics)
    assert coef is not None
    assert coef == pytest.approx([TRUE["a"], TRUE["b"], TRUE["e"]], rel=0.05)
    hw = fit_profile(read_run(run)).hardware  # generate time = the passes' time here
    assert (hw.decode_overhead_s, hw.decode_seq_s, hw.decode_ctx_s) == pytest.approx(coef)
    assert fit_passes([{k: v for k, v in r.items() if k != "engine/pass_n"} for r in rows]) is None


def test_the_step_records_prompt_length_is_what_the_calibration_reads(tmp_path: Path) -> None:
    """Both loops write `prompt_len_mean` (the mean prompt tokens of a sample of the step's
    groups); the calibration takes it over prefilled tokens / samples, its fallback, which
    is wrong when an engine prefills a group's prompt once."""
    from slipstream.schedule.step_stats import StepStats, prompt_len_mean
    from slipstream.types import FinishReason, Group, Prompt, Sample

    def group(prompt_len: int, n: int) -> Group:
        s = Sample("p", [1] * prompt_len, [2, 3], [0.0, 0.0], [0, 0], FinishReason.STOP)
        return Group(Prompt("p", "", None), [s] * n)

    groups = [group(PROMPT, 4), group(PROMPT // 2, 2)]  # (4 x 24 + 2 x 12) / 6 = 20
    lag = {"lag_mean": 0.0, "lag_max": 0, "lag_hist": []}
    record = StepStats().record(groups, groups, {}, lag, 0.1, 0.0)  # the orchestrated loops' record
    assert record["prompt_len_mean"] == prompt_len_mean(groups) == 20.0  # the sync loop's too
    run = read_run(fake_run(tmp_path / "a", batch_prompts=8))  # every sample prefilled
    for m in run.metrics:
        m["engine/prefill_tokens"] //= 4  # now each group's prompt prefilled once (G = 4)
        m["prompt_len_mean"] = PROMPT
    cal = fit_profile(run)
    assert cal.prompt_len == PROMPT and cal.prefills_per_group == 1  # fallback: 6 and 4


@pytest.mark.parametrize("policy", [None, "keep", "drop", "abort"])
def test_the_simulation_of_a_run_drops_stale_groups_as_the_run_did(
    tmp_path: Path, policy: str | None
) -> None:
    """The simulated run treats a group older than its bound as the recorded run did: its
    `[schedule] lag_policy`, or the trainer's default (drop) when the config is silent."""
    run_dir = fake_run(tmp_path / "run", 8, schedule="double_buffer", steps=6)
    if policy is not None:
        config = run_dir / "config.toml"
        text = config.read_text().replace("[schedule]\n", f'[schedule]\nlag_policy = "{policy}"\n')
        config.write_text(text)
    run = read_run(run_dir)
    assert sim_config(run, fit_profile(run)).lag_policy == (policy or "drop")


def test_an_unknown_lag_policy_in_a_run_folder_is_an_error_naming_the_file(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path / "run", 8, steps=4)
    config = run_dir / "config.toml"
    config.write_text(config.read_text().replace("[schedule]\n", '[schedule]\nlag_policy = "x"\n'))
    with pytest.raises(RunError, match=r"config.toml.*lag_policy"):
        sim_config(read_run(run_dir), fit_profile(read_run(run_dir)))


def test_pooled_runs_fit_their_steps_and_lengths_together(tmp_path: Path) -> None:
    """`pool_runs`: runs of one configuration (seeds) read as one record, their steps one run
    after another; the calibration names every folder and draws lengths from all of them. A
    run pooled with itself fits the same profile as the run alone (least squares over rows
    repeated twice has the same minimum), and lengths twice as many groups."""
    a = read_run(fake_run(tmp_path / "a", batch_prompts=8, steps=5, seed=1))
    b = read_run(fake_run(tmp_path / "b", batch_prompts=8, steps=4, seed=2))
    both = pool_runs([a, b])
    assert both.metrics == a.metrics + b.metrics
    assert both.paths == (a.path, b.path) and both.config == a.config
    cal = fit_profile(both)
    assert cal.sources == (str(a.path), str(b.path)) and cal.hardware.name == "cpu@a+1"
    alone, twice = fit_profile(a), fit_profile(pool_runs([a, a]))
    for f in ("decode_overhead_s", "decode_seq_s", "decode_ctx_s", "train_token_s"):
        assert getattr(twice.hardware, f) == pytest.approx(getattr(alone.hardware, f), rel=1e-6)
    n_a, n_b = (len(source_lengths(fit_profile(r)).groups) for r in (a, b))
    assert len(source_lengths(cal).groups) == n_a + n_b > n_a
    save_calibration(cal, tmp_path / "p.json")
    assert load_calibration(tmp_path / "p.json") == cal


def test_pooling_refuses_runs_of_another_configuration(tmp_path: Path) -> None:
    a = read_run(fake_run(tmp_path / "a", batch_prompts=8, steps=3))
    b = read_run(fake_run(tmp_path / "b", batch_prompts=16, steps=3))
    with pytest.raises(
        RunError, match=r"b: not the configuration of .*a \(differs in trainer.batch_prompts\)"
    ):
        pool_runs([a, b])
    with pytest.raises(RunError, match="no runs to pool"):
        pool_runs([])
    c = replace(a, config={k: v for k, v in a.config.items() if k != "schedule"})
    c.config["sampling"] = {**a.config["sampling"], "temperature": 0.6}
    with pytest.raises(RunError, match=r"differs in sampling.temperature, schedule\)"):
        pool_runs([a, c])


def test_a_calibration_file_written_before_pooling_still_loads(tmp_path: Path) -> None:
    cal = fit_profile(read_run(fake_run(tmp_path / "a", batch_prompts=8, steps=4)))
    save_calibration(cal, tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    data["source"] = data.pop("sources")[0]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_calibration(tmp_path / "old.json") == cal


def test_cli_calibrates_on_several_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = fake_run(tmp_path / "a", batch_prompts=8, steps=4, seed=1)
    b = fake_run(tmp_path / "b", batch_prompts=8, steps=4, seed=2)
    assert sim_main(["--calibrate", str(a), str(b)]) == 0
    assert load_calibration(a / "sim_profile.json").sources == (str(a), str(b))
    assert "wrote" in capsys.readouterr().out


def test_predicting_several_runs_compares_their_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`predict_runs`: one run gives `predict`'s figures; two runs of one configuration give
    the mean of their measurements against the mean of their predictions (each run weighs
    alike: derived here from the two `predict`s); a run of another configuration is refused.
    The CLI's `--predict A B` prints the same."""
    cal = fit_profile(read_run(fake_run(tmp_path / "src", batch_prompts=8, steps=5)))
    a = read_run(fake_run(tmp_path / "a", batch_prompts=16, steps=6, seed=1))
    b = read_run(fake_run(tmp_path / "b", batch_prompts=16, steps=4, seed=2))
    assert predict_runs(cal, [a], replicates=2) == predict(cal, a, replicates=2)
    pa, pb = predict(cal, a, replicates=2), predict(cal, b, replicates=2)
    both = predict_runs(cal, [a, b], replicates=2)
    for k in ("step_time_s", "step_time_s_pred", "sampler_busy", "sampler_busy_pred"):
        assert both[k] == pytest.approx((pa[k] + pb[k]) / 2, rel=1e-12)
    assert both["step_time_err"] == pytest.approx(
        (pa["step_time_s_pred"] + pb["step_time_s_pred"]) / (pa["step_time_s"] + pb["step_time_s"])
        - 1
    )
    other = read_run(fake_run(tmp_path / "c", batch_prompts=8, steps=4))
    with pytest.raises(RunError, match="not the configuration"):
        predict_runs(cal, [a, other])
    save_calibration(cal, tmp_path / "p.json")
    argv = ["--predict", str(a.path), str(b.path), "--profile", str(tmp_path / "p.json")]
    assert sim_main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["step_time_s"] == pytest.approx(both["step_time_s"])
    assert sim_main(argv) == 0 and "2 runs: the means" in capsys.readouterr().out


def test_cli_sim_with_a_profile_takes_its_workload_and_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`slipstream sim --profile P` simulates with the workload the profile was fitted on
    (prompt length, prefills, trained share: its training line is per trained token) unless a
    flag says otherwise, and `--model RUN_DIR` takes that run's model: the calibration run's
    own configuration comes back within 15 % of what it measured. (Until stop 41 it trained
    every sample's prompt, 512 tokens by default, and completion at the per-trained-token
    cost, and took no run's model: on a recorded sync run of the built-in task, seed 0 of
    bench_out/simcal_s41a, 11 s a step with `--model 0.5b` against 0.22 s measured; now
    0.23 s with `--model RUN_DIR`.) A trained share outside (0, 1] is refused."""
    run = fake_run(tmp_path / "a", batch_prompts=8, steps=8)
    assert sim_main(["--calibrate", str(run)]) == 0
    capsys.readouterr()
    argv = ["--profile", str(run / "sim_profile.json"), "--model", str(run), "--gpus", "2"]
    group = str(read_run(run).group_size)
    argv += ["--samplers", "1", "--batch-prompts", "8", "--group-size", group, "--steps", "8"]
    argv += ["--schedule", "sync", "--lengths", f"empirical:{run}", "--json"]
    assert sim_main(argv) == 0
    got = json.loads(capsys.readouterr().out)["step_time_mean_s"]
    rows = read_run(run).metrics
    measured = sum(float(r["step_time_s"]) for r in rows) / len(rows)
    assert abs(got / measured - 1) < 0.15, (got, measured)
    assert sim_main([*argv, "--trained-frac", "1.5"]) == 2
    assert "--trained-frac must be in (0, 1]" in capsys.readouterr().err


def _planned(run: Path, steps: int) -> Path:
    """`run` with the `[run] steps` a run folder's config.toml holds (fake_run writes none)."""
    with (run / "config.toml").open("a") as f:
        f.write(f"[run]\nsteps = {steps}\n")
    return run


def test_cli_names_a_partial_run_it_calibrates_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that stopped short of its `[run] steps` (crashed, or still running) was fitted
    as if whole, without a word; its steps are measurements, so they are still used."""
    a = _planned(fake_run(tmp_path / "a", batch_prompts=8, steps=6), steps=10)
    assert sim_main(["--calibrate", str(a)]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        f"slipstream sim: warning: --calibrate {a}: 6 of its 10 steps recorded (a run that "
        "stopped or is still running); using those"
    )
    whole = _planned(fake_run(tmp_path / "b", batch_prompts=8, steps=6), steps=6)
    assert sim_main(["--calibrate", str(whole)]) == 0
    assert capsys.readouterr().err == ""


def test_cli_calibrates_on_the_whole_steps_of_a_run_killed_mid_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A metrics.jsonl whose last line was cut short was refused as "not JSON", as if the
    run were corrupt; now its whole steps are fitted, as on a copy without the cut line, and
    the warning says so. A bad line that ends with its newline is still an error."""
    a = fake_run(tmp_path / "a", batch_prompts=8, steps=7)
    lines = (a / "metrics.jsonl").read_text().splitlines(keepends=True)
    whole = fake_run(tmp_path / "whole", batch_prompts=8, steps=7)
    (whole / "metrics.jsonl").write_text("".join(lines[:-1]))
    (a / "metrics.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40])
    assert sim_main(["--calibrate", str(a), "--json"]) == 0
    err = capsys.readouterr().err
    assert f"--calibrate {a}: 6 steps recorded (its last line cut short" in err, err
    got = load_calibration(a / "sim_profile.json").hardware
    want = fit_profile(read_run(whole)).hardware
    assert replace(got, name="") == replace(want, name="")
    (a / "metrics.jsonl").write_text("".join(lines[:-1]) + lines[-1][:40] + "\n")
    assert sim_main(["--calibrate", str(a)]) == 2
    assert "metrics.jsonl:7: not valid JSON" in capsys.readouterr().err


def test_cli_refuses_a_run_of_too_few_steps_to_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One step fitted every cost into the per-pass one with a fit error of 0; three steps,
    as many as the generation line's costs, pass through every step as well."""
    a = fake_run(tmp_path / "a", batch_prompts=8, steps=3)
    assert sim_main(["--calibrate", str(a)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"slipstream sim: error: {a}: 3 step(s) recorded; a calibration needs at least 4 "
        "(more steps, or more runs of the configuration, fit better)"
    )
    assert not (a / "sim_profile.json").exists()
    b = fake_run(tmp_path / "b", batch_prompts=8, steps=2, seed=1)  # pooled: 5 steps fit
    assert sim_main(["--calibrate", str(a), str(b)]) == 0


def test_cli_calibrate_given_twice_pools_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--calibrate A --calibrate B` fitted B alone (argparse kept the last list): A, and a
    missing folder in its place, were dropped without a word. A folder named twice would
    count its steps twice: refused."""
    a = fake_run(tmp_path / "a", batch_prompts=8, steps=4, seed=1)
    b = fake_run(tmp_path / "b", batch_prompts=8, steps=4, seed=2)
    assert sim_main(["--calibrate", str(a), "--calibrate", str(b)]) == 0
    assert load_calibration(a / "sim_profile.json").sources == (str(a), str(b))
    assert sim_main(["--calibrate", str(tmp_path / "no"), "--calibrate", str(b)]) == 2
    assert "no: not a run folder" in capsys.readouterr().err
    assert sim_main(["--calibrate", str(a), "--predict", str(b), "--predict", str(b)]) == 2
    assert f"--predict: {b} is named twice" in capsys.readouterr().err
