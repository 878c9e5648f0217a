"""Measure a run again against its baseline: the comparison engine (:mod:`.compare`) on the two configs.

A run measured once, against a baseline measured once minutes before, says little on a machine whose speed drifts
(the same loop moves 0.91-1.24x from burst to burst here): this measures both again, interleaved, until the
verdict is settled or the budget is spent, and the interval replaces the lone ratio.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..engine.launcher import Engine, run_burst
from ..inputs.workload import Workload
from ..knobs.config import Config
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from .compare import DEFAULT_BUDGET_S, DEFAULT_MIN_EFFECT, Progress, measure_pairs

MIN_STEPS = 20  # a re-measure's first bursts get at least this many measured steps, whatever the run had


def remeasure(
    workload: Workload,
    run: BurstResult | Config,
    baseline: BurstResult | Config,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    min_effect: float = DEFAULT_MIN_EFFECT,
    engine: Engine = run_burst,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> Comparison:
    """``run``'s config against ``baseline``'s (results or configs), measured again by :func:`.compare.compare`.

    The first bursts measure as many steps as the run did (at least ``MIN_STEPS``); the comparison's windows are
    sized from them. Labels name the two as the run and its baseline.
    """
    config = run.config if isinstance(run, BurstResult) else run
    reference = baseline.config if isinstance(baseline, BurstResult) else baseline
    measured = len(run.step_times()) if isinstance(run, BurstResult) else 0
    return measure_pairs(workload, [reference, config], [(0, 1)], budget_s=budget_s, min_effect=min_effect,
                         steps=max(MIN_STEPS, measured), engine=engine, stop=stop,
                         labels=["re-measure: baseline", "re-measure: run"], on_progress=on_progress).comparisons[0]
