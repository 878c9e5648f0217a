import math

import pytest

from accel_widgets.metrics.stats import summarize


def test_median_quartiles_and_noise_flag():
    summary = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (summary.median, summary.q1, summary.q3, summary.iqr) == (3.0, 2.0, 4.0, 2.0)
    assert summary.noisy  # IQR/median = 0.67
    steady = summarize([10.0, 10.1, 10.0, 9.9, 10.0, 10.05])
    assert steady.relative_iqr < 0.1 and not steady.noisy


def test_outliers_do_not_move_the_median():
    assert summarize([1.0] * 9 + [100.0]).median == 1.0


def test_few_samples_are_flagged_noisy_and_empty_is_an_error():
    assert summarize([1.0, 1.0]).noisy
    assert summarize([2.0]).median == 2.0
    with pytest.raises(ValueError):
        summarize([])
    assert math.isinf(summarize([0.0, 0.0, 0.0, 0.0]).relative_iqr)
