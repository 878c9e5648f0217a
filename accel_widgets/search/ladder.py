"""The classic tuning order as a cumulative ladder of configs: each rung keeps the previous rungs' knobs.

Order matters (measured on one H200): a better loader gave 1.4x while fp32 compute dominated, and
2.5x once bf16 had made compute cheap. So the ladder fixes the data pipeline first, then precision,
then memory where it is the limit, then compile, then the small things (:data:`~accel_widgets.knobs.RUNGS`). What
each rung sets is declared by the knobs' owners; rungs that cannot help on this device are left out, not faked, and
so are those that cost speed to address a limit the workload was not found to have.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..engine.launcher import Engine, run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs import CLIMBS, RUNGS, Climb, Symptom
from ..knobs.config import Config
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.headspace import Ceiling, Headspace
from .batchsize import BatchSizeSearch
from .compare import DEFAULT_BUDGET_S, DEFAULT_MIN_EFFECT, Progress, measure_pairs


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
                   batch_search: BatchSizeSearch | None = None, headspace: Headspace | None = None) -> list[Rung]:
    """baseline -> +loader -> +mixed precision -> (+memory) -> +compile -> +the rest, for this workload on this device.

    Each rung is what the knob owners declare for it (:data:`~accel_widgets.knobs.CLIMBS`), on top of the rungs
    before it; a rung no owner sets anything for here is left out, and so is every rung named in ``leave_out``
    (``{"+compile"}``: cold compiles cost tens of seconds). A part that costs speed to address a limit
    (:attr:`~accel_widgets.knobs.Climb.only_when`: activation checkpointing where memory is the limit) is climbed
    only where ``limits`` names that symptom (``{f.symptom for f in diagnose(baseline)}``: "memory_full",
    "out_of_memory") or ``batch_search`` found memory to limit the speed (the fastest size that fit was the
    largest); that search's size that then fit with the room made joins the +memory rung. A rung whose every knob
    belongs to a part whose ``headspace`` ceiling reads "same" is not climbed (:func:`closed_rungs` says which and why).
    """
    climbs = _climbs(workload, device, leave_out, base, limits, batch_search)
    rungs = [Rung("baseline", "the plain loop: no loader workers, fp32, eager", base or Config())]
    for title, why, changes in climbs:
        if headspace is None or headspace.closes_changes(changes) is None:
            rungs.append(Rung(title, why, rungs[-1].config.replace(**changes)))
    return rungs


def closed_rungs(workload: Workload, device: DeviceInfo | None = None, *, headspace: Headspace,
                 leave_out: Collection[str] = (), base: Config | None = None, limits: Collection[Symptom] = (),
                 batch_search: BatchSizeSearch | None = None) -> list[tuple[str, Ceiling]]:
    """The rungs :func:`classic_ladder` leaves out because ``headspace`` says their part has nothing to win, each
    with the ceiling that closed it (its ``closed_text`` says why)."""
    return [(title, closed) for title, _, changes in _climbs(workload, device, leave_out, base, limits, batch_search)
            if (closed := headspace.closes_changes(changes)) is not None]


def _climbs(workload: Workload, device: DeviceInfo | None, leave_out: Collection[str], base: Config | None,
            limits: Collection[Symptom], batch_search: BatchSizeSearch | None
            ) -> list[tuple[str, str, dict[str, Any]]]:
    """Each rung the owners set something for here: its title, why, and the knobs it changes."""
    unknown = set(leave_out) - set(RUNGS)
    if unknown:
        raise ValueError(f"leave_out names no rung: {sorted(unknown)}; the rungs are {', '.join(RUNGS)}")
    device = device or probe_device()
    found = {*limits, *(("memory_full",) if batch_search is not None and batch_search.memory_limited else ())}
    climbs = []
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
        title = next((climb.title(changes) for climb, _ in parts if climb.title is not None), name)
        climbs.append((title, why, changes))
    return climbs


def _called_for(climb: Climb, found: set[str]) -> bool:
    """Whether the ladder climbs this part: always, unless it addresses a limit the workload was not found to have."""
    return not climb.only_when or bool(set(climb.only_when) & found)


@dataclass(frozen=True)
class Ladder:
    """A ladder measured: each rung's first burst (``results``, in the rungs' order), and the comparison engine's
    reading of each rung against the rung before it and against the baseline (``comparisons``, by the pair of rung
    indices ``(reference, subject)``)."""

    rungs: list[Rung]
    results: list[BurstResult]
    comparisons: dict[tuple[int, int], Comparison]
    headspace: Headspace | None = None

    def ceiling(self, index: int) -> Ceiling | None:
        """The measured ceiling that bounds what rung ``index`` added (its knobs all of one part: +loader's, the
        data ceiling), None where no one ceiling does."""
        if self.headspace is None or index < 1:
            return None
        return self.headspace.bounding(self.rungs[index].config.diff(self.rungs[index - 1].config))

    def step(self, index: int) -> Comparison | None:
        """Rung ``index`` against the rung before it: what that rung's knobs added."""
        return self.comparisons.get((index - 1, index))

    def overall(self, index: int) -> Comparison | None:
        """Rung ``index`` against the baseline: what the ladder has gained up to it."""
        return self.comparisons.get((0, index))

    @property
    def compared(self) -> dict[int, Comparison]:
        """Each rung's comparison with the baseline, by its index in ``results``: what the comparison table takes
        (``comparison_rows(ladder.results, compared=ladder.compared)``)."""
        return {index: found for index in range(1, len(self.results)) if (found := self.overall(index)) is not None}


def ladder_pairs(count: int) -> list[tuple[int, int]]:
    """The pairs a ladder of ``count`` rungs is read by: each rung against the one before, then against the
    baseline (where that is another pair)."""
    return [*((i - 1, i) for i in range(1, count)), *((0, i) for i in range(2, count))]


#: A ladder's windows are shorter than a lone comparison's: it measures every rung at once, and the drift between
#: windows, not the steps within one, is what its intervals are made of.
LADDER_WINDOW_S = 0.5


def run_ladder(
    workload: Workload,
    rungs: list[Rung] | None = None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    steps: int | None = None,
    timeout_s: float | None = None,
    engine: Engine = run_burst,
    stop: threading.Event | None = None,
    on_result: Callable[[Rung, BurstResult], None] | None = None,
    on_event: Callable[[Any], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    headspace: Headspace | None = None,
) -> Ladder:
    """Run each rung's first burst in order (``on_result`` is told of each as it ends, ``on_event`` sees their live
    events), then measure the rungs interleaved with the comparison engine until each rung's verdict against the
    one before and the baseline is settled or ``budget_s`` (after the first bursts) is spent. A failing rung keeps
    its failed result and the ladder goes on; its comparisons say why they could not be made. ``headspace``: the
    baseline's ceilings (:func:`~accel_widgets.search.headspace.headspace`): the classic ladder leaves out the rungs
    they close, and each rung is read against its ceiling (:meth:`Ladder.ceiling`)."""
    rungs = rungs or classic_ladder(workload, headspace=headspace)
    told = 0

    def progress(now: Progress) -> None:
        nonlocal told
        while on_result is not None and told < len(now.firsts):
            on_result(rungs[told], now.firsts[told])
            told += 1
        if on_progress is not None:
            on_progress(now)

    pairs = ladder_pairs(len(rungs))
    measured = measure_pairs(workload, [r.config for r in rungs], pairs, budget_s=budget_s, min_effect=min_effect,
                             steps=steps, engine=engine, stop=stop, labels=[r.name for r in rungs],
                             on_event=on_event, on_progress=progress, window_s=LADDER_WINDOW_S, timeout_s=timeout_s,
                             budget_covers_firsts=False)
    results = [first for first in measured.firsts if first is not None]
    return Ladder(rungs[:len(results)], results, dict(zip(pairs, measured.comparisons, strict=True)), headspace)
