"""The classic tuning order as a cumulative ladder of configs: each rung keeps the previous rungs' knobs.

Order matters (measured on one H200): a better loader gave 1.4x while fp32 compute dominated, and
2.5x once bf16 had made compute cheap. So the ladder fixes the data pipeline first, then precision,
then memory where it is the limit, then compile, then the small things (:data:`~accel_widgets.knobs.RUNGS`). What
each rung sets is declared by the knobs' owners; rungs that cannot help on this device are left out, not faked, and
so are those that cost speed to address a limit the workload was not found to have.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..engine.launcher import BurstError, run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import CLIMBS, RUNGS, Climb, Symptom
from ..knobs.config import Config
from ..results.burst import BurstResult
from .batchsize import BatchSizeSearch


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: a short name, why it is there, and the cumulative config."""

    name: str
    why: str
    config: Config


#: The rung whose parts address a limit (``Climb.only_when``): where a batch-size search says memory is the limit,
#: it also takes the batch size that then fits.
MEMORY_RUNG = "+memory"


def classic_ladder(workload: Workload, device: DeviceInfo | None = None, *, leave_out: Collection[str] = (),
                   base: Config | None = None, limits: Collection[Symptom] = (),
                   batch_search: BatchSizeSearch | None = None) -> list[Rung]:
    """baseline -> +loader -> +mixed precision -> (+memory) -> +compile -> +the rest, for this workload on this device.

    Each rung is what the knob owners declare for it (:data:`~accel_widgets.knobs.CLIMBS`), on top of the rungs
    before it; a rung no owner sets anything for here is left out, and so is every rung named in ``leave_out``
    (``{"+compile"}``: cold compiles cost tens of seconds). A part that costs speed to address a limit
    (:attr:`~accel_widgets.knobs.Climb.only_when`: activation checkpointing where memory is the limit) is climbed
    only where ``limits`` names that symptom (``{f.symptom for f in diagnose(baseline)}``: "memory_full",
    "out_of_memory") or ``batch_search`` found memory to limit the speed (the fastest size that fit was the
    largest); that search's size that then fit with the room made joins the +memory rung.
    """
    unknown = set(leave_out) - set(RUNGS)
    if unknown:
        raise ValueError(f"leave_out names no rung: {sorted(unknown)}; the rungs are {', '.join(RUNGS)}")
    device = device or probe_device()
    found = {*limits, *(("memory_full",) if batch_search is not None and batch_search.memory_limited else ())}
    config = base or Config()
    rungs = [Rung("baseline", "the plain loop: no loader workers, fp32, eager", config)]
    for name in RUNGS:
        if name in leave_out:
            continue
        parts = [(climb, climb.changes(device, workload)) for climb in CLIMBS if climb.rung == name
                 and _called_for(climb, found)]
        parts = [(climb, changes) for climb, changes in parts if changes]
        if not parts:
            continue
        changes = {knob: value for _, part in parts for knob, value in part.items()}
        why = ", ".join(climb.why for climb, _ in parts)
        room = batch_search.room_changes() if name == MEMORY_RUNG and batch_search is not None else {}
        if room:
            changes.update(room)
            why += f"; the batch size that then fits ({batch_search.room_setting}, find_batch_size)"
        config = config.replace(**changes)
        title = next((climb.title(changes) for climb, _ in parts if climb.title is not None), name)
        rungs.append(Rung(title, why, config))
    return rungs


def _called_for(climb: Climb, found: set[str]) -> bool:
    """Whether the ladder climbs this part: always, unless it addresses a limit the workload was not found to have."""
    return not climb.only_when or bool(set(climb.only_when) & found)


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
