"""The classic tuning order as a cumulative ladder of configs: each rung keeps the previous rungs' knobs.

Order matters (measured on one H200): a better loader gave 1.4x while fp32 compute dominated, and
2.5x once bf16 had made compute cheap. So the ladder fixes the data pipeline first, then precision,
then compile, then the small things (:data:`~accel_widgets.knobs.RUNGS`). What each rung sets is declared by the
knobs' owners; rungs that cannot help on this device are left out, not faked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..engine.launcher import BurstError, run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import CLIMBS, RUNGS
from ..knobs.config import Config
from ..results.burst import BurstResult


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: a short name, why it is there, and the cumulative config."""

    name: str
    why: str
    config: Config


def classic_ladder(workload: Workload, device: DeviceInfo | None = None, *, leave_out: Collection[str] = (),
                   base: Config | None = None) -> list[Rung]:
    """baseline -> +loader -> +mixed precision -> +compile -> +the rest, for this workload on this device.

    Each rung is what the knob owners declare for it (:data:`~accel_widgets.knobs.CLIMBS`), on top of the rungs
    before it; a rung no owner sets anything for here is left out, and so is every rung named in ``leave_out``
    (``{"+compile"}``: cold compiles cost tens of seconds).
    """
    unknown = set(leave_out) - set(RUNGS)
    if unknown:
        raise ValueError(f"leave_out names no rung: {sorted(unknown)}; the rungs are {', '.join(RUNGS)}")
    device = device or probe_device()
    config = base or Config()
    rungs = [Rung("baseline", "the plain loop: no loader workers, fp32, eager", config)]
    for name in RUNGS:
        if name in leave_out:
            continue
        parts = [(climb, climb.changes(device, workload)) for climb in CLIMBS if climb.rung == name]
        parts = [(climb, changes) for climb, changes in parts if changes]
        if not parts:
            continue
        changes = {knob: value for _, part in parts for knob, value in part.items()}
        config = config.replace(**changes)
        title = next((climb.title(changes) for climb, _ in parts if climb.title is not None), name)
        rungs.append(Rung(title, ", ".join(climb.why for climb, _ in parts), config))
    return rungs


def run_ladder(
    workload: Workload,
    rungs: list[Rung] | None = None,
    *,
    on_result: Callable[[Rung, BurstResult], None] | None = None,
    **burst_kwargs: Any,
) -> list[BurstResult]:
    """Run each rung as a burst (``burst_kwargs`` go to :func:`~accel_widgets.engine.launcher.run_burst`); a failing
    rung is kept as a failed result and the ladder goes on."""
    results = []
    for rung in rungs or classic_ladder(workload):
        try:
            result = run_burst(workload, rung.config, label=rung.name, **burst_kwargs)
        except BurstError as exc:
            result = exc.result
        results.append(result)
        if on_result is not None:
            on_result(rung, result)
    return results
