"""Energy over a burst's measured window, and the CPU packages' RAPL energy counters.

A device's energy between two instants comes from its cumulative energy counter where it has one (NVML's
total energy on Volta and newer, RAPL on the CPU): the counter, interpolated at the window's two edges, and
the difference taken. That is exact however the power swung between two telemetry ticks. Without a counter
the power readings are integrated instead (trapezoid rule, with the power at each edge interpolated), which
misses whatever happened between ticks. Either way only values between two readings are used, never an
extrapolation: a window the readings do not cover on both sides has no energy, rather than a guessed one.

Pure functions over (time, value) points on the burst's clock; :func:`window_energy`, which reads a burst's
telemetry samples (any objects with a :class:`PowerReading`'s fields) into the one energy every face shows; and
:class:`RaplCounter`, which reads sysfs.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Literal, Protocol

from .thresholds import THRESHOLDS

#: (t, value) readings of one device, in time order.
Points = Sequence[tuple[float, float]]

#: What a telemetry sample's power and energy readings cover: "gpu" one GPU; "mig" a MIG instance, for which NVML's
#: power is the whole GPU's, so no energy is derived from it; "cpu_package" RAPL's CPU packages, every process on them.
EnergyScope = Literal["gpu", "mig", "cpu_package"]

#: NVML's power is averaged over the past second on GA10x (compute capability 8.6) and newer, Hopper
#: included; GA100 (8.0) and older report it instantaneously.
NVML_POWER_PERIOD_S = 1.0

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


def power_period_s(capability: str | None) -> float:
    """NVML's power averaging period for a GPU of compute capability ``capability`` ("9.0"): 1 s from GA10x
    (8.6) on, 0 (instantaneous) up to GA100 (8.0); the 1 s of current GPUs where it is not known."""
    try:
        major, minor = (int(part) for part in str(capability).split(".")[:2])
    except ValueError:
        return NVML_POWER_PERIOD_S
    return NVML_POWER_PERIOD_S if (major, minor) > (8, 0) else 0.0


class PowerReading(Protocol):
    """What the energy reading needs of one telemetry sample (a burst's ``TelemetrySample`` is one): when, from
    where, and the device's power and cumulative energy where it reported them."""

    @property
    def t(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def power_w(self) -> float | None: ...
    @property
    def energy_j(self) -> float | None: ...
    @property
    def energy_scope(self) -> EnergyScope | None: ...


@dataclass(frozen=True)
class WindowEnergy:
    """The energy a burst's devices used over its measured window (``joules``, summed over every GPU in use or the
    CPU packages; None where it was not measured) and ``note``: what it covers and how it was read, or why there is
    none (the table's hover). ``seconds`` is the window's length and ``samples`` what was trained over it."""

    joules: float | None
    note: str
    seconds: float = 0.0
    samples: int = 0

    @property
    def joules_per_sample(self) -> float | None:
        return self.joules / self.samples if self.joules is not None and self.samples > 0 else None

    @property
    def samples_per_joule(self) -> float | None:
        per_sample = self.joules_per_sample
        return 1.0 / per_sample if per_sample else None

    @property
    def mean_power_w(self) -> float | None:
        return self.joules / self.seconds if self.joules is not None and self.seconds > 0 else None


def window_energy(readings: Sequence[PowerReading], window: tuple[float, float] | None, *, samples: int,
                  capability: str | None) -> WindowEnergy:
    """The energy over ``window`` from every device's readings on both sides of it: each device's energy counter
    where it spans the window, else its power readings (:func:`power_energy_j`); no number unless every device in
    use has one. ``samples``: trained over the window; ``capability``: the GPU's compute capability, which says how
    NVML averages its power."""
    if window is None:
        return WindowEnergy(None, "energy not measured: no measured steps")
    start, end = window
    scopes = {r.energy_scope for r in readings}
    if "mig" in scopes:
        return WindowEnergy(None, "energy not measured: NVML reports power for the whole GPU, not per MIG instance")
    if not scopes - {None}:
        return WindowEnergy(None, "energy not measured here (no NVML, RAPL not readable)")
    total, methods, devices = 0.0, set[str](), _by_device(readings)
    for device, own in devices.items():
        joules = counter_energy_j([(r.t, r.energy_j) for r in own if r.energy_j is not None], start, end)
        method = "NVML's energy counter"
        if joules is None:
            nvml = any(r.source == "nvml" for r in own)
            joules, method = power_energy_j([(r.t, r.power_w) for r in own if r.power_w is not None], window,
                                            power_period_s(capability) if nvml else 0.0)
        if joules is None:
            return WindowEnergy(None, method or f"energy not measured: {device}'s readings do not cover the "
                                                "measured window")
        total += joules
        methods.add(method)
    if scopes == {"cpu_package"}:
        note = ("CPU packages' energy (RAPL) over the measured window: the whole package, every process on it, not "
                "only the burst")
    else:
        gpus = f", summed over {len(devices)} GPUs" if len(devices) > 1 else ""
        note = f"GPU energy over the measured window{gpus}, from {' and '.join(sorted(methods))}"
    return WindowEnergy(total, note, end - start, samples)


def power_energy_j(power_w: Points, window: tuple[float, float], period_s: float) -> tuple[float | None, str]:
    """(joules from one device's power readings, how): integrated where they are instantaneous (``period_s`` 0);
    where each is a trailing average of ``period_s``, the readings settled inside the window averaged over its
    length; none from a window too short for its periods (the method says so) or readings that do not span it (the
    method is empty)."""
    if not period_s:
        return integrated_energy_j(power_w, *window), "NVML's power readings integrated"
    start, end = window
    if value_at(power_w, start) is None or value_at(power_w, end) is None:
        return None, ""
    if end - start < THRESHOLDS.min_periods_per_window * period_s:
        return None, (f"energy not measured: too short to read, NVML's power averages the last {period_s:g} s "
                      f"and the measured window is {end - start:.1f} s")
    settled = [w for t, w in power_w if start + period_s <= t <= end]
    return (sum(settled) / len(settled) * (end - start) if settled else None,
            f"NVML's power readings ({period_s:g} s averages) settled in the window, times its length")


def _by_device(readings: Sequence[PowerReading]) -> dict[str, list[PowerReading]]:
    groups: dict[str, list[PowerReading]] = {}
    for reading in readings:
        groups.setdefault(reading.device, []).append(reading)
    return groups


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
