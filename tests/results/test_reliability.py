"""Whether a burst's numbers can rank a knob, and whose load it shared the machine with, read from its records."""

import dataclasses

import pytest

from accel_widgets.results.burst import TelemetrySample
from accel_widgets.results.reliability import (
    Reliability,
    caller_cpu_pct,
    foreign_cpu_pct,
    load_attribution,
    other_load_pct,
    other_processes,
    reliability,
)
from tests.results.test_burst import HOST_AFTER, HOST_MEASURED, HOST_SETUP, _windowed, make_result


def test_the_load_of_others_is_read_over_the_measured_window_only():
    result = _windowed(HOST_SETUP + HOST_MEASURED + HOST_AFTER)
    # the machine's use less the burst's own in each measured sample: 90-80, 70-60, 95-70
    assert foreign_cpu_pct(result) == pytest.approx((10.0 + 10.0 + 25.0) / 3)
    assert caller_cpu_pct(result) is None and other_load_pct(result) == foreign_cpu_pct(result)
    assert load_attribution(result) == "not attributed"  # no program readings, no caller share


def test_programs_and_the_caller_are_named_above_the_notice_level():
    def sample(t: float) -> TelemetrySample:
        return TelemetrySample(t, "psutil", 40.0, 1 << 20, "cpu", host_util_pct=70.0, workers_util_pct=40.0,
                               caller_util_pct=5.0, other_processes={"chromium": 44.0, "sshd": 1.0})

    result = dataclasses.replace(_windowed([sample(10.0), sample(10.2)]), environment={"cpu_count": 2})
    assert other_processes(result) == [("chromium", 44.0), ("sshd", 1.0)]
    assert other_load_pct(result) == pytest.approx(25.0 + 5.0)
    assert load_attribution(result) == "chromium 44% of a core; the calling process 10% of a core"
    assert reliability(result) == Reliability((f"other load took 30% of the machine ({load_attribution(result)})",))


def test_a_run_without_measured_steps_or_load_readings_has_nothing_against_it():
    assert reliability(make_result(steps=[])).reliable
    assert other_load_pct(make_result()) is None and reliability(make_result()).text() == ""
