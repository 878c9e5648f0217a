"""Headspace: how much each part of the step could possibly win, measured before any knob is tuned.

``headspace(workload, config)`` runs the config as it is and, for each part of its step that is there to free
(:mod:`accel_widgets.knobs.parts`: the data, the gradients' exchange under DDP/FSDP, the host's per-step work on a
GPU), the config with that part made free, and hands them to the comparison engine
(:func:`~accel_widgets.search.compare.measure_pairs`), interleaved, each variant against the config as it is. Each
comparison is a ceiling: with the data free the step runs as if the loader and the copy cost nothing, so no data knob
can win more, at the interval's confidence (Meta's SPDL calls the data one "headspace"). A ceiling that reads "same"
closes its knobs' family: the ladder does not climb it, the tuner does not search it, the diagnosis offers none of its
knobs ("data loading costs at most 3% here: the loader knobs cannot help").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from ..engine.launcher import Engine, run_burst
from ..inputs.device import DeviceInfo, probe_device
from ..inputs.workload import Workload
from ..knobs.base import Part
from ..knobs.config import Config
from ..knobs.parts import FREE_PARTS, PARTS, check_part, why_not_free
from ..knobs.plan import resolve
from ..results.comparison import Comparison
from ..results.headspace import Ceiling, Headspace
from .compare import DEFAULT_BUDGET_S, DEFAULT_MIN_EFFECT, WINDOW_S, Progress, measure_pairs

#: The config as it is, as a ceiling's comparison names it.
AS_IT_IS = "as it is"


def measurable_parts(config: Config, device: DeviceInfo, parts: Sequence[Part] | None = None) -> list[Part]:
    """The parts of ``parts`` (default: every part) that ``config`` has to free on ``device``, in their order."""
    return [part for part in (parts if parts is not None else PARTS) if not why_not_free(part, config, device)]


def headspace(
    workload: Workload,
    config: Config | None = None,
    *,
    parts: Sequence[Part] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    steps: int | None = None,
    device: DeviceInfo | None = None,
    engine: Engine = run_burst,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    timeout_s: float | None = None,
    window_s: float = WINDOW_S,
) -> Headspace:
    """The ceilings of ``config`` (default ``Config()``) for ``workload``: per part of the step, the config with that
    part free against the config as it is, measured interleaved by the comparison engine within ``budget_s``.

    ``parts``: which (default every part: ``"data"``, ``"communication"``, ``"host"``); a part the config has nothing
    of here (communication without DDP/FSDP, host work on a CPU, where the host is the device) gets a ceiling that
    says why instead. ``min_effect``: the smallest speed-up worth the name ("same" when the interval stays within
    1 ± it). ``steps``: the first bursts' measured steps, later windows sized to last ``window_s``; ``engine`` is
    called like :func:`~accel_widgets.run_burst` (and given options with ``freed``); ``stop`` ends it after the
    running window. Bad arguments and a config that cannot run here raise before any process starts.
    """
    config = config or Config()
    if not isinstance(config, Config):
        raise TypeError(f"config must be an accel_widgets.Config, got {type(config).__name__}")
    wanted = [check_part(part) for part in parts] if parts is not None else list(PARTS)
    device = device or probe_device()
    resolve(config, device, workload)  # a config that cannot run here is refused before any process starts
    measured = measurable_parts(config, device, wanted)
    ceilings = {part: Ceiling(part, why_not=why_not_free(part, config, device)) for part in wanted}
    started = time.perf_counter()
    stopped = ""
    if measured:
        found = measure_pairs(workload, [config] * (1 + len(measured)), [(0, i + 1) for i in range(len(measured))],
                              budget_s=budget_s, min_effect=min_effect, steps=steps, engine=engine, stop=stop,
                              labels=[AS_IT_IS, *(FREE_PARTS[part].title for part in measured)],
                              freed=[None, *measured], on_progress=on_progress, timeout_s=timeout_s,
                              window_s=window_s)
        for part, comparison in zip(measured, found.comparisons, strict=True):
            ceilings[part] = Ceiling(part, comparison, "" if comparison.counted else _unmeasured(comparison))
        stopped = "; ".join(sorted({c.stopped for c in found.comparisons}))
    return Headspace(workload.name, config, ceilings, time.perf_counter() - started, stopped)


def _unmeasured(comparison: Comparison) -> str:
    """Why a variant's comparison has no block: it failed, or the budget or a stop came first (a ceiling's line puts
    "not measured: " before it)."""
    return f"it failed: {comparison.error}" if comparison.error else comparison.stopped or "no block was counted"
