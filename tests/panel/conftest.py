"""The panel's tests share one warm estimator."""

from __future__ import annotations

import pytest

from accel_widgets import Config
from accel_widgets.analysis.estimate import estimate
from tests.workloads import tiny_workload


@pytest.fixture(scope="session", autouse=True)
def warm_estimator() -> None:
    """Every panel traces its settings on fake tensors in the background (the fit line) a moment after it opens.
    A process's first trace pays for torch's fake-tensor machinery (~1 s here, several under load) and would outlive
    a quick test and fail its leak check; later traces take milliseconds. So the first one is paid here, once."""
    estimate(tiny_workload(), Config())
