"""How a burst used the machine over its measured window, read from its records.

A :class:`~accel_widgets.results.burst.BurstResult` holds what the burst measured; what its telemetry says about
the devices is read here, once, for every face: the table's cells, the diagnosis's findings and the summary all call
these functions, so they cannot disagree.
"""

from __future__ import annotations

from ..metrics.energy import WindowEnergy, window_energy
from ..results.burst import BurstResult


def energy(result: BurstResult) -> WindowEnergy:
    """The energy the burst's devices used over its measured window, per sample trained in it, and what that covers
    or why there is none (:func:`~accel_widgets.metrics.energy.window_energy`)."""
    return window_energy(result.telemetry, result.measured_window(),
                         samples=sum(s.samples for s in result.measured_steps()),
                         capability=result.environment.get("capability"))
