"""observe.censored: a run that never reached the target is censored at its budget, so a
speedup in time to target is known within bounds and a seed is never dropped."""

from __future__ import annotations

import math

from slipstream.observe.censored import finite_or_none, median_bounds, point, ratio_bounds


def test_ratio_bounds_censor_an_unreached_run_at_its_budget():
    assert ratio_bounds(10.0, 50.0, 5.0, 20.0) == (2.0, 2.0)  # both reached
    assert ratio_bounds(None, 50.0, 5.0, 20.0) == (10.0, math.inf)  # base needed > 50 s
    assert ratio_bounds(10.0, 50.0, None, 20.0) == (0.0, 0.5)  # other needed > 20 s
    assert ratio_bounds(None, 50.0, None, 20.0) == (0.0, math.inf)
    # reached at the start (0 s): other's at once is infinitely faster; both at once, unknown
    assert ratio_bounds(3.0, 50.0, 0.0, 20.0) == (math.inf, math.inf)
    assert ratio_bounds(0.0, 50.0, 0.0, 20.0) == (0.0, math.inf)
    assert ratio_bounds(None, 50.0, 0.0, 20.0) == (math.inf, math.inf)


def test_the_median_is_a_point_only_where_its_bounds_meet():
    # (2, 3, <= 1.33): the median is 2 whatever seed 3's ratio; (2, 3, <= 4): within [2, 3]
    assert median_bounds([(2.0, 2.0), (3.0, 3.0), (0.0, 4 / 3)]) == [2.0, 2.0]
    assert point([2.0, 2.0]) == 2.0
    assert median_bounds([(2.0, 2.0), (3.0, 3.0), (0.0, 4.0)]) == [2.0, 3.0]
    assert point([2.0, 3.0]) is None and point(None) is None
    assert point([math.inf, math.inf]) is None  # not a figure JSON can hold, nor a median
    assert median_bounds([]) is None
    assert finite_or_none([0.0, math.inf]) == [0.0, None] and finite_or_none(None) is None
