"""Energy over a burst's measured window, and the CPU packages' RAPL energy counters.

A device's energy between two instants comes from its cumulative energy counter where it has one (NVML's
total energy on Volta and newer, RAPL on the CPU): the counter, interpolated at the window's two edges, and
the difference taken. That is exact however the power swung between two telemetry ticks. Without a counter
the power readings are integrated instead (trapezoid rule, with the power at each edge interpolated), which
misses whatever happened between ticks. Either way only values between two readings are used, never an
extrapolation: a window the readings do not cover on both sides has no energy, rather than a guessed one.

Pure functions over (time, value) points on the burst's clock, plus :class:`RaplCounter`, which reads sysfs.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

#: (t, value) readings of one device, in time order.
Points = Sequence[tuple[float, float]]

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_DIR = re.compile(r"intel-rapl:\d+")  # intel-rapl:N; its subdomains (core, uncore, dram) are :N:M


def value_at(points: Points, t: float) -> float | None:
    """The readings linearly interpolated at ``t``; None outside the span they cover."""
    if not points or not points[0][0] <= t <= points[-1][0]:
        return None
    i = bisect_right([p[0] for p in points], t)
    if i == len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def counter_energy_j(counter_j: Points, start: float, end: float) -> float | None:
    """Joules between ``start`` and ``end`` from a cumulative counter (in joules): its value at the end less
    its value at the start, both interpolated; None when the readings do not span the window."""
    first, last = value_at(counter_j, start), value_at(counter_j, end)
    return None if first is None or last is None else last - first


def integrated_energy_j(power_w: Points, start: float, end: float) -> float | None:
    """Joules between ``start`` and ``end`` from power readings (in watts): the trapezoid rule over the
    readings inside the window, clipped to its edges with the interpolated power there; None when the
    readings do not span the window."""
    first, last = value_at(power_w, start), value_at(power_w, end)
    if first is None or last is None:
        return None
    inside = [(start, first), *((t, w) for t, w in power_w if start < t < end), (end, last)]
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in pairwise(inside))


@dataclass
class _Package:
    energy_file: Path
    max_uj: int
    last_uj: int


class RaplCounter:
    """The CPU packages' RAPL counters summed, as joules since the counter was opened.

    Each package's ``energy_uj`` wraps to 0 past its ``max_energy_range_uj`` (every few minutes under
    load); a reading below the previous one is taken as one wrap. So read it more often than the fastest
    package wraps (the telemetry's 5 Hz is ample). Only package domains are summed: their core/uncore/dram
    subdomains are parts of them, and a ``psys`` domain covers the whole platform. RAPL measures the whole
    package, every process on it, not only a burst's workers.
    """

    def __init__(self, packages: list[_Package]) -> None:
        self._packages = packages
        self._total_uj = 0

    @classmethod
    def open(cls, root: Path = POWERCAP) -> RaplCounter | None:
        """The counter over every package domain under ``root``, or None when there is none or one cannot be
        read (since 2020 Linux lets only root read ``energy_uj``)."""
        packages = []
        try:
            for domain in sorted(root.glob("intel-rapl:*")):
                if _PACKAGE_DIR.fullmatch(domain.name) and (domain / "name").read_text().startswith("package"):
                    energy = domain / "energy_uj"
                    packages.append(_Package(energy, _read_int(domain / "max_energy_range_uj"), _read_int(energy)))
        except (OSError, ValueError):
            return None
        return cls(packages) if packages else None

    def read_j(self) -> float:
        """Joules used by all packages since :meth:`open`. Raises OSError when a counter cannot be read."""
        for package in self._packages:
            now = _read_int(package.energy_file)
            delta = now - package.last_uj
            self._total_uj += delta if delta >= 0 else delta + package.max_uj
            package.last_uj = now
        return self._total_uj / 1e6


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())
