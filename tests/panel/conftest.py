"""The panel's tests share one warm estimator, and every panel a test opens is closed when it ends."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from accel_widgets import Config
from accel_widgets.analysis.estimate import estimate
from accel_widgets.panel import TuningPanel
from tests.workloads import tiny_workload


@pytest.fixture(scope="session", autouse=True)
def warm_estimator() -> None:
    """Every panel traces its settings on fake tensors in the background (the fit line) a moment after it opens.
    A process's first trace pays for torch's fake-tensor machinery (~1 s here, several under load) and would outlive
    a quick test and fail its leak check; later traces take milliseconds. So the first one is paid here, once."""
    estimate(tiny_workload(), Config())


@pytest.fixture(autouse=True)
def panels_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every panel the test opened before the leak check looks: an action's end schedules a fit estimate
    FIT_DELAY_S later, and a test that ends then would leave that timer's thread running (on a loaded CI host it
    outlived the leak check's one-second grace). A user's panel keeps it; the test is over."""
    opened: list[TuningPanel] = []
    init = TuningPanel.__init__

    @functools.wraps(init)  # the signature tests read stays the panel's
    def recording_init(self: TuningPanel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(TuningPanel, "__init__", recording_init)
    yield
    for panel in opened:
        panel.close()
