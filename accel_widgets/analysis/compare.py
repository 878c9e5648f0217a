"""Runs against their baselines: one result against another (speed-up, memory, scaling over ranks), each workload's
baseline, every run's numbers against it, and the correctness guard's verdict against that same run, so a row's
speed-up and its "changes training" always refer to one baseline. Plain data: the views
(:mod:`accel_widgets.views.table`) decide how a row reads.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..knobs.config import Config
from ..results.burst import BurstResult
from ..results.comparison import Comparison
from ..results.noise import NoiseBand
from ..results.reliability import reliability
from .guard import GuardVerdict, check_training
from .usage import energy, mean_utilisation_pct, mfu, mfu_basis, utilisation_note

Row = dict[str, Any]


def speedup(result: BurstResult, baseline: BurstResult) -> float | None:
    """``result``'s samples/s over ``baseline``'s: one burst against one burst, with the drift between bursts in no
    number (the comparison engine's interval is what settles a speed-up); None when either has no throughput."""
    mine, theirs = result.samples_per_s, baseline.samples_per_s
    return mine / theirs if mine and theirs else None


def where_ran(result: BurstResult) -> str:
    """Where a burst's ranks ran, as a row says it beside the knobs it changed: "" on the caller's own machine, else
    "on 2 Ray nodes". The same config run somewhere else is another measurement, never the noise floor of the first."""
    if result.environment.get("start_method") != "ray actor":
        return ""
    nodes = {rank.node for rank in result.ranks if rank.node}
    return f"on {len(nodes)} Ray node{'s' if len(nodes) != 1 else ''}" if nodes else "on a Ray cluster"


def changes(result: BurstResult, baseline: BurstResult | None) -> str:
    """What differs from the baseline run: its knobs (``batch_size=64``, or ``baseline``), and where it ran when that
    was a cluster (``baseline, on 2 Ray nodes``), or this machine against a baseline on a cluster."""
    knobs = result.config.label(baseline.config if baseline is not None else None)
    if place := where_ran(result):
        return f"{knobs}, {place}"
    if baseline is not None and where_ran(baseline):
        return "on this machine" if knobs == "baseline" else f"{knobs}, on this machine"
    return knobs


def memory_ratio(result: BurstResult, baseline: BurstResult) -> float | None:
    """Peak memory per rank (the busiest rank's) over ``baseline``'s, when both measured it the same way: what FSDP
    saves against DDP, activation checkpointing against none. None when either lacks it."""
    mine, theirs = result.peak_memory_bytes, baseline.peak_memory_bytes
    if not mine or not theirs or result.memory_kind != baseline.memory_kind:
        return None
    return mine / theirs


def scaling_efficiency(result: BurstResult, single_rank: BurstResult) -> float | None:
    """Throughput per rank relative to a 1-rank burst of the same config (1.0 = perfect scaling)."""
    mine, theirs = result.samples_per_s, single_rank.samples_per_s
    return mine / (result.world_size * theirs) if mine and theirs else None


@dataclass(frozen=True)
class Straggler:
    """The rank that sets a group's pace: its own work per measured step (``busy_step_s``: the time its stepping thread
    ran or waited for a core, :attr:`~accel_widgets.results.burst.RankSummary.busy_s`) against the median of the other
    ranks' (``others_step_s``), and the node it ran on ("" on the caller's machine)."""

    rank: int
    node: str
    busy_step_s: float
    others_step_s: float

    @property
    def ratio(self) -> float:
        return self.busy_step_s / self.others_step_s if self.others_step_s else float("inf")


def straggler(result: BurstResult) -> Straggler | None:
    """The rank whose own work per step is the most, when several ranks measured theirs.

    Under DDP every rank's step ends at the same all-reduce, so their step times and throughputs agree whatever their
    pace: the rank the others wait for is the one that spent the most of its step working, and the others the rest
    of theirs waiting for it."""
    paced = [(r, r.busy_s / steps) for r in result.ranks
             if r.busy_s is not None and (steps := len(result.measured_steps(rank=r.rank)))]
    if len(paced) < 2 or len(paced) < len(result.ranks):
        return None
    slowest, busy = max(paced, key=lambda pair: pair[1])
    others = sorted(step for r, step in paced if r is not slowest)
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    return Straggler(slowest.rank, slowest.node, busy, median)


def straggler_rank(result: BurstResult) -> int | None:
    """The rank the others wait for at every step, when there are several: the one with the most work of its own per
    step (:func:`straggler`), else, for a result without it, the one with the lowest throughput."""
    if len(result.ranks) < 2:
        return None
    if (found := straggler(result)) is not None:
        return found.rank
    return min(result.ranks, key=lambda r: r.measured_samples / r.measured_s if r.measured_s else 0).rank


def comparison_rows(results: Sequence[BurstResult], baseline: BurstResult | None = None, *,
                    compared: Mapping[int, Comparison] | None = None) -> list[Row]:
    """One plain dict of numbers per run: what the terminal table, the CSV and every other face start from.

    Speed-ups are only meaningful within one workload, so each workload gets its own baseline: the
    first ok run whose config is ``Config()`` (the plain loop), else its first ok run, chosen among the runs of the
    run's own place (this machine, a Ray cluster) where there is one, since a comparison interleaves its bursts in one
    place, and else among the other place's. An explicit
    ``baseline`` replaces the default for its own workload only. ``baseline`` in a row is the index of
    the run its speed-up refers to (``None`` when there is none among ``results``). Unknown numbers are
    ``None``; ``noisy`` is always a bool (False when there are no measured steps to judge). ``compared`` maps a
    run to its comparison with its baseline: its interval and verdict replace the lone ratio (:func:`with_comparison`).
    """
    rows = _rows(results, _baselines(results, baseline))
    return [with_comparison(row, (compared or {}).get(i)) for i, row in enumerate(rows)]


def _rows(results: Sequence[BurstResult], baselines: Sequence[BurstResult | None]) -> list[Row]:
    index = {id(result): i for i, result in enumerate(results)}
    return [_row(i, result, chosen, index.get(id(chosen)))
            for i, (result, chosen) in enumerate(zip(results, baselines, strict=True))]


def _baselines(results: Sequence[BurstResult], baseline: BurstResult | None) -> list[BurstResult | None]:
    """Each run's baseline: per workload and place, the first ok plain-loop run, else the first ok run; where its
    place has none, the other place's."""
    chosen: dict[tuple[str, bool], BurstResult] = {}
    plain = Config()
    for result in results:
        if not result.ok:
            continue
        key = (result.workload, bool(where_ran(result)))
        current = chosen.get(key)
        if current is None or (result.config == plain and current.config != plain):
            chosen[key] = result

    def of(result: BurstResult) -> BurstResult | None:
        if baseline is not None and baseline.workload == result.workload:
            return baseline
        on_cluster = bool(where_ran(result))
        return chosen.get((result.workload, on_cluster)) or chosen.get((result.workload, not on_cluster))

    return [of(result) for result in results]


def _row(index: int, result: BurstResult, baseline: BurstResult | None, baseline_index: int | None) -> Row:
    step, used, trusted = result.step_time, energy(result), reliability(result)
    return {
        "run": index,
        "workload": result.workload,
        "label": result.label or result.config.label(),
        "changes": changes(result, baseline),
        "baseline": baseline_index,
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "tokens_per_s": result.tokens_per_s,
        "speedup": speedup(result, baseline) if baseline is not None else None,
        "speedup_interval": None,
        "verdict": None,
        "min_effect": None,
        "comparing": False,
        "blocks": 0,
        "same_config": (baseline is not None and baseline is not result and result.config == baseline.config
                        and where_ran(result) == where_ran(baseline)),
        "step_ms_median": step.median * 1e3 if step is not None else None,
        "step_ms_iqr": step.iqr * 1e3 if step is not None else None,
        "noisy": bool(step is not None and step.noisy),
        # Measured on a shared or stalling machine: not ranked, not shown as a plain speed-up (thresholds.py).
        "unreliable": result.status == "ok" and not trusted.reliable,
        "unreliable_why": trusted.text(),
        "util_pct": mean_utilisation_pct(result),
        "util_note": utilisation_note(result),
        "data_wait_pct": result.data_wait_share * 100 if result.data_wait_share is not None else None,
        "peak_mem_mib": result.peak_memory_bytes / 2**20 if result.peak_memory_bytes is not None else None,
        "compile_s": result.compile_s,
        "tflops": result.achieved_flops_per_s / 1e12 if result.achieved_flops_per_s else None,
        "mfu_pct": share * 100 if (share := mfu(result)) is not None else None,
        "mfu_basis": mfu_basis(result),
        "joules_per_sample": used.joules_per_sample,
        "samples_per_joule": used.samples_per_joule,
        "mean_power_w": used.mean_power_w,
        "energy_note": used.note,
        "error": _first_line(result.error.message) if result.error is not None else "",
    }


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class RunRow:
    """One run judged against its baseline, as the panel's and the report's tables show it
    (:mod:`accel_widgets.views.table` decides how it reads).

    ``values`` are its :func:`comparison_rows` numbers, ``baseline`` the run they are measured against
    and ``verdict`` the correctness guard's reading against that same run (its reading is
    ``diagnose(result, baseline, verdict=verdict)``). ``loaded`` is the hover note of a run loaded from
    the run history; ``comparison`` the comparison engine's measurement of it against that baseline, when it has one.
    """

    result: BurstResult
    baseline: BurstResult | None
    values: Row
    verdict: GuardVerdict
    loaded: str | None = None
    comparison: Comparison | None = None

    @property
    def run(self) -> int:
        return int(self.values["run"])

    @property
    def changes_training(self) -> bool:
        return self.verdict.status == "changes_training"


def run_rows(results: Sequence[BurstResult], *, loaded: Mapping[int, str] | None = None,
             judged: Sequence[RunRow] = (),
             noise_of: Callable[[BurstResult], NoiseBand | None] | None = None,
             compared: Mapping[int, Comparison] | None = None,
             comparing: Collection[int] = ()) -> list[RunRow]:
    """Every run's table row, each judged by the guard against the baseline of its own speed-up.

    ``loaded`` maps the index of each run loaded from the run history to its hover note. ``judged`` are
    rows built before from the same runs (the panel's table before its latest run): a run whose baseline
    is still the same keeps its verdict, so the guard judges each run once, not once per table update.
    ``noise_of(baseline)`` gives the baseline's measured noise band when one is known (the guard then
    tolerates what reseeding the data moves the loss by, not only the precision's floor). ``compared`` maps a
    run measured against its baseline by the comparison engine to that comparison: its interval and verdict replace
    the row's lone ratio (:func:`with_comparison`); ``comparing`` names those whose repeats are still arriving.
    """
    notes = loaded or {}
    baselines = _baselines(results, None)
    rows = [with_comparison(values, (compared or {}).get(i), comparing=i in comparing)
            for i, values in enumerate(_rows(results, baselines))]
    return [RunRow(result, chosen, values, _verdict(result, chosen, judged[i] if i < len(judged) else None,
                                                    noise_of),
                   notes.get(i), (compared or {}).get(i))
            for i, (result, chosen, values) in enumerate(zip(results, baselines, rows, strict=True))]


def with_comparison(values: Row, comparison: Comparison | None, *, comparing: bool = False) -> Row:
    """A row whose speed-up is the comparison engine's: the ratio of its interleaved blocks with the 95% anytime-valid
    interval and the verdict. The interval is what says whether the run can be ranked, so a run whose own burst
    looked unreliable is ranked by it once its comparison has a bounded interval."""
    if comparison is None or comparison.ratio is None:
        return {**values, "comparing": comparing} if comparing else values
    found = comparison.interval
    bounded = found.bounded
    return {**values, "speedup": comparison.ratio, "speedup_interval": (found.low, found.high) if bounded else None,
            "verdict": comparison.verdict, "min_effect": comparison.min_effect, "comparing": comparing,
            "blocks": len(comparison.counted),
            "same_config": comparison.same_config,
            "unreliable": values["unreliable"] and not bounded, "unreliable_why": "" if bounded
            else values["unreliable_why"]}


def _verdict(result: BurstResult, baseline: BurstResult | None, before: RunRow | None,
             noise_of: Callable[[BurstResult], NoiseBand | None] | None) -> GuardVerdict:
    if before is not None and before.result is result and before.baseline is baseline:
        return before.verdict
    noise = noise_of(baseline) if noise_of is not None and baseline is not None else None
    return check_training(result, baseline, noise)


def best_run(rows: Sequence[RunRow]) -> RunRow | None:
    """The run to take into the user's own code: of those that finished, measured reliably and train as their
    baseline does (the guard's verdict), one whose comparison says "faster" first, then the fastest against its
    baseline; None when no run qualifies."""
    candidates = [row for row in rows if row.result.ok and not row.values["unreliable"] and not row.changes_training
                  and row.values["samples_per_s"] is not None and row.values.get("verdict") != "slower"]
    if not candidates:
        return None
    return max(candidates, key=lambda row: (row.values.get("verdict") == "faster", row.values["speedup"] or 0.0,
                                            row.values["samples_per_s"]))
