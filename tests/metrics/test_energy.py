"""Energy: the window arithmetic, the window's energy from any readings, and RAPL over a fake sysfs tree.

Every expected value is worked out by hand from the traces below, so the tests pin the arithmetic itself:
counters differenced at the interpolated window edges, power integrated by the trapezoid rule and
clipped to the window. A burst's energy (devices summed, NVML's averaging, no number where none can be honest) is
tests/analysis/test_usage.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from accel_widgets.metrics.energy import (
    EnergyScope,
    RaplCounter,
    counter_energy_j,
    integrated_energy_j,
    power_period_s,
    value_at,
    window_energy,
)


# -- the arithmetic --------------------------------------------------------------------------------
def test_value_at_interpolates_inside_the_readings_and_never_extrapolates() -> None:
    points = [(0.0, 10.0), (1.0, 20.0), (3.0, 0.0)]
    assert [value_at(points, t) for t in (0.0, 0.25, 1.0, 2.0, 3.0)] == [10.0, 12.5, 20.0, 10.0, 0.0]
    assert value_at(points, -0.1) is None and value_at(points, 3.1) is None and value_at([], 0.0) is None


def test_a_counter_is_differenced_at_the_interpolated_window_edges() -> None:
    counter = [(0.0, 1000.0), (1.0, 1100.0), (2.0, 1300.0), (3.0, 1300.0)]  # joules since the driver loaded
    assert counter_energy_j(counter, 0.5, 2.5) == pytest.approx(1300.0 - 1050.0)
    assert counter_energy_j(counter, 1.0, 2.0) == pytest.approx(200.0)
    assert counter_energy_j(counter, 0.5, 3.5) is None  # the readings stop before the window ends


def test_power_is_integrated_by_trapezoids_clipped_to_the_window() -> None:
    flat = [(float(t), 100.0) for t in range(11)]
    assert integrated_energy_j(flat, 2.5, 7.5) == pytest.approx(500.0)
    ramp = [(float(t), 10.0 * t) for t in range(11)]  # linear: the trapezoid rule is exact
    assert integrated_energy_j(ramp, 2.5, 4.5) == pytest.approx(5 * (4.5**2 - 2.5**2))
    peak = [(0.0, 100.0), (1.0, 200.0), (2.0, 100.0), (3.0, 1000.0)]  # the 1000 W after the window is left out
    # Edges at 0.5 s and 1.5 s read 150 W; two half-second trapezoids (150 + 200) / 2 * 0.5 each.
    assert integrated_energy_j(peak, 0.5, 1.5) == pytest.approx(175.0)
    assert integrated_energy_j(peak, -0.5, 1.5) is None


@dataclass(frozen=True)
class Reading:
    """Any object with a power reading's fields will do: the energy reading knows no ``TelemetrySample``."""

    t: float
    device: str
    power_w: float | None = None
    energy_j: float | None = None
    energy_scope: EnergyScope | None = "gpu"
    source: str = "nvml"


def test_the_windows_energy_comes_from_plain_readings_and_counts_per_sample_and_per_second() -> None:
    readings = [Reading(float(t), "cuda:0", energy_j=100.0 * t) for t in range(5)]
    found = window_energy(readings, (1.0, 3.0), samples=50, capability="9.0")
    assert (found.joules, found.seconds, found.samples) == (pytest.approx(200.0), 2.0, 50)
    assert found.joules_per_sample == pytest.approx(4.0) and found.samples_per_joule == pytest.approx(0.25)
    assert found.mean_power_w == pytest.approx(100.0)
    assert found.note == "GPU energy over the measured window, from NVML's energy counter"
    nothing = window_energy(readings, None, samples=50, capability="9.0")
    assert (nothing.joules, nothing.joules_per_sample, nothing.mean_power_w) == (None, None, None)


def test_nvml_averages_power_over_a_second_from_ga10x_on() -> None:
    assert [power_period_s(c) for c in ("7.0", "8.0", "8.6", "9.0", None, "")] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


# -- RAPL over a fake sysfs tree -------------------------------------------------------------------
def _domain(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 10**9) -> Path:
    domain = root / name
    domain.mkdir(parents=True)
    (domain / "name").write_text(label + "\n")
    (domain / "energy_uj").write_text(f"{energy_uj}\n")
    (domain / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return domain


def _set(domain: Path, energy_uj: int) -> None:
    (domain / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> dict[str, Path]:
    """Two packages (package 0 near its wrap), a core subdomain and a psys domain that must not be added."""
    return {
        "package-0": _domain(tmp_path, "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000),
        "core": _domain(tmp_path, "intel-rapl:0:0", "core", 5_000),
        "package-1": _domain(tmp_path, "intel-rapl:1", "package-1", 2_000_000),
        "psys": _domain(tmp_path, "intel-rapl:2", "psys", 7_000_000),
    }


def test_rapl_sums_the_packages_and_unwraps_a_counter_that_wrapped(powercap: dict[str, Path]) -> None:
    counter = RaplCounter.open(powercap["package-0"].parent)
    assert counter is not None
    assert counter.read_j() == 0.0
    _set(powercap["package-0"], 100_000)  # wrapped past 1 J: 0.1 J to the wrap, 0.1 J after it
    _set(powercap["package-1"], 2_500_000)
    _set(powercap["core"], 9_000_000)  # a subdomain: part of package 0, never added
    _set(powercap["psys"], 9_000_000)  # the whole platform: never added
    assert counter.read_j() == pytest.approx(0.2 + 0.5)
    _set(powercap["package-0"], 400_000)
    assert counter.read_j() == pytest.approx(0.2 + 0.5 + 0.3)


def test_rapl_is_none_where_it_cannot_be_read(powercap: dict[str, Path], tmp_path: Path) -> None:
    assert RaplCounter.open(tmp_path / "no-powercap") is None
    (powercap["package-1"] / "energy_uj").unlink()
    (powercap["package-1"] / "energy_uj").mkdir()  # unreadable even for root, as energy_uj is for users
    assert RaplCounter.open(powercap["package-0"].parent) is None


