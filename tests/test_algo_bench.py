"""bench/algorithms.py's measurement: crossings, smoothing, savings and the mean over seeds."""

from __future__ import annotations

import pytest

from benchload import load_bench

bench = load_bench("algorithms")

CURVE = [(0, 0.1), (100, 0.2), (200, 0.4), (300, 0.3)]


def test_tokens_to_reach_first_evaluation_or_interpolated():
    assert bench.tokens_to_reach(CURVE, 0.3) == 200  # first evaluation at or above
    # the line from (100, 0.2) to (200, 0.4) crosses 0.3 halfway: 150
    assert bench.tokens_to_reach(CURVE, 0.3, interpolate=True) == 150
    assert bench.tokens_to_reach(CURVE, 0.5, interpolate=True) is None
    # the start is not a crossing, and a start already above does not interpolate backwards
    assert bench.tokens_to_reach([(0, 0.5), (100, 0.6)], 0.4, interpolate=True) == 100


def test_smooth_is_a_trailing_mean_of_three():
    smoothed = bench.smooth(CURVE)
    assert [t for t, _ in smoothed] == [0, 100, 200, 300]
    assert [a for _, a in smoothed] == pytest.approx([0.1, 0.15, 0.7 / 3, 0.3])


def _run(curve: list[tuple[int, float]], steps: int = 10) -> dict:
    return {
        "comparison": "filters", "overrides": [], "steps": steps, "final_acc": curve[-1][1],
        "generated_tokens": curve[-1][0], "wall_s": 1.0, "filtered_groups": 0,
        "trained_groups": 0, "prompts_skipped": 0, "curve": curve,
        "smoothed": bench.smooth(curve),
    }  # fmt: skip


def test_savings_on_raw_and_smoothed_curves():
    base = _run([(0, 0.1), (100, 0.2), (200, 0.3), (300, 0.4)])
    other = _run([(0, 0.1), (50, 0.2), (100, 0.3), (150, 0.4)])  # the same, at half the tokens
    assert bench.savings(base, other, 0.4) == pytest.approx(0.5)
    assert bench.savings(base, other, 0.3, "smoothed") == pytest.approx(0.5)
    assert bench.savings(base, _run([(0, 0.1), (100, 0.2)]), 0.4) is None


def test_mean_over_seeds_averages_evaluations_and_cuts_to_the_shortest():
    a = {"r": _run([(0, 0.1), (100, 0.3), (200, 0.5)]), "only_a": _run([(0, 0.1)])}
    b = {"r": _run([(0, 0.1), (200, 0.1)], steps=5)}
    mean = bench.mean_over_seeds([a, b])
    assert list(mean) == ["r"]
    assert [t for t, _ in mean["r"]["curve"]] == [0, 150]
    assert [a for _, a in mean["r"]["curve"]] == pytest.approx([0.1, 0.2])
    assert mean["r"]["steps"] == 5 and mean["r"]["final_acc"] == pytest.approx(0.2)


def test_bootstrap_over_seeds_spreads_the_headline_by_which_seeds_were_run():
    base = _run([(0, 0.1), (100, 0.2), (200, 0.3), (300, 0.4)])
    half = _run([(0, 0.1), (50, 0.2), (100, 0.3), (150, 0.4)])  # seed A: 50 % saved
    flat = _run([(0, 0.1), (50, 0.1), (100, 0.1), (150, 0.1)])  # seed B: never gets there
    a = {"no_filters": base, "zv+pass_rate_band": half}
    b = {"no_filters": base, "zv+pass_rate_band": flat}
    out = bench.bootstrap([a, b], n=1000)
    assert list(out) == ["zv+pass_rate_band"]  # no soft band in these runs
    band = out["zv+pass_rate_band"]
    # only a resample of A twice saves (a mixed mean curve stays below the target): 1 in 4
    assert band["p95"] == pytest.approx(0.5)
    assert band["p50"] is None and band["p5"] is None
    assert 0.2 < band["share_at_least_goal"] < 0.3
    assert bench.bootstrap([a, a], n=50)["zv+pass_rate_band"]["p5"] == pytest.approx(0.5)


def test_per_seed_summary_counts_never_as_zero_and_counts_them():
    def by(hard, soft):
        runs = {"zv+pass_rate_band": {"headline": hard}, "zv+soft_band": {"headline": soft}}
        return {"filter_savings_by_run": runs}

    lines = [by(0.4, 0.3), by(None, 0.1), by(0.2, 0.2)]
    out = bench.per_seed_summary(lines)
    # hard: (0.4 + 0 + 0.2) / 3 = 0.2, one seed never; soft: 0.6 / 3 = 0.2, none
    assert out["zv+pass_rate_band"] == {"mean": pytest.approx(0.2), "never": 1, "seeds": 3}
    assert out["zv+soft_band"] == {"mean": pytest.approx(0.2), "never": 0, "seeds": 3}


def test_default_invocation_says_quick_and_prints_the_headline_command():
    assert "--seeds 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15" in bench.HEADLINE_CMD
    assert "--steps 160" in bench.HEADLINE_CMD and "smoothed curves averaged" in bench.HEADLINE


def test_bootstrap_percentiles_interpolate_between_order_statistics(monkeypatch):
    """Resample i's headline saving made i (0 to 999): the p-th percentile lies at rank
    999 p / 100 (statistics.quantiles' inclusive method, numpy's default), so p5 = 49.95
    (between 49 and 50), p50 = 499.5, p95 = 949.05; v[p n // 100] gave 50, 500, 950, each
    one rank high."""

    def headlines(values: list[float | None]) -> None:
        it = iter(values)
        monkeypatch.setattr(bench, "savings_pair", lambda *a: {"headline": next(it)})

    monkeypatch.setattr(bench, "mean_over_seeds", lambda sample: {"zv+pass_rate_band": {}})
    headlines([float(i) for i in range(1000)])
    b = bench.bootstrap([{}], n=1000)["zv+pass_rate_band"]
    assert b["p5"] == pytest.approx(49.95) and b["p50"] == pytest.approx(499.5)
    assert b["p95"] == pytest.approx(949.05)
    # 50 resamples never reach the target (the lowest, -inf): p5 at rank 49.95 lies between
    # a never and the saving 50, so it is not a figure; p50 is unmoved
    headlines([None] * 50 + [float(i) for i in range(50, 1000)])
    b = bench.bootstrap([{}], n=1000)["zv+pass_rate_band"]
    assert b["p5"] is None and b["p50"] == pytest.approx(499.5)
    # hand-derived on 5 values (1, 2, 4, 8, 16): ranks 0.2, 2 and 3.8 -> 1 + 0.2 x 1,
    # 4, 8 + 0.8 x 8
    assert bench.percentiles([1.0, 2.0, 4.0, 8.0, 16.0], (5, 50, 95)) == pytest.approx(
        [1.2, 4.0, 14.4]
    )
    assert bench.percentiles([0.3], (5, 95)) == [0.3, 0.3]
