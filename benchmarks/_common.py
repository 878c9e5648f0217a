"""Helpers shared by the benchmark scripts: robust spreads, an environment stamp, JSON output, tables.

Kept free of torch and accel_widgets imports at module level so that importing it costs nothing in
the child processes the benchmarks start (a cold ``spawn`` child re-imports the main script and
everything it imports, and that time must not be charged to the thing being measured).

Numbers on a shared 2-core machine are noisy, so every script reports medians with their spread and
compares variants by ratios measured side by side in the same run, never by absolute times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEMOS: tuple[str, ...] = ("mlp", "lm", "image")
# Machine-wide CPU use (all processes, % of all cores) under which the machine counts as quiet. Two
# intra-op threads on two cores stall whenever another process takes a core, so a run that shares the
# machine can be several times slower: such runs are flagged, and runs start only once it is quiet.
QUIET_PCT = 15.0
QUIET_MAX_WAIT_S = 15.0
QUIET_WAIT_BUDGET_S = 60.0


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, quartiles and relative IQR of ``values``.

    Quartiles use the same "inclusive" method as ``accel_widgets.metrics.stats.summarize``, so a relative IQR
    printed here means what the package's ``Summary.relative_iqr`` means.
    """
    if not values:
        raise ValueError("cannot summarise an empty list")
    ordered = sorted(float(v) for v in values)
    median = statistics.median(ordered)
    if len(ordered) > 1:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "n": len(ordered),
        "median": median,
        "min": ordered[0],
        "max": ordered[-1],
        "q1": q1,
        "q3": q3,
        "relative_iqr": (q3 - q1) / median if median > 0 else float("inf"),
        "relative_range": (ordered[-1] - ordered[0]) / median if median > 0 else float("inf"),
    }


def usable_cpus() -> int:
    """Cores this process may use (affinity included), the number the engine sizes its threads by."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> list[float]:
    """1/5/15-minute load averages: a record of how busy the machine was while measuring."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_busy_pct(interval_s: float = 0.5) -> float:
    """Machine-wide CPU use over the next ``interval_s`` seconds, every process included."""
    import psutil

    return float(psutil.cpu_percent(interval=interval_s))


class QuietGate:
    """Waits for a quiet machine before each run, within a total waiting budget for the whole script.

    Why: on a shared machine another job's burst of work would land on one variant and not the
    other; starting each run on a quiet machine makes that less likely (it cannot rule it out, so runs
    also record the foreign load they saw). When the machine stays busy the budget runs out and runs
    go ahead without waiting, so a busy machine makes a script noisier, never much longer.
    """

    def __init__(self, threshold_pct: float = QUIET_PCT, budget_s: float = QUIET_WAIT_BUDGET_S,
                 max_wait_s: float = QUIET_MAX_WAIT_S) -> None:
        self.threshold_pct, self.budget_s, self.max_wait_s = threshold_pct, budget_s, max_wait_s
        self.waited_s = 0.0

    def wait(self) -> float:
        """Block until machine-wide CPU use is under the threshold (or the wait/budget runs out)."""
        started = time.monotonic()
        limit = min(self.max_wait_s, self.budget_s - self.waited_s)
        while time.monotonic() - started < limit and machine_busy_pct() >= self.threshold_pct:
            pass
        waited = time.monotonic() - started
        self.waited_s += waited
        return waited


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, Any]:
    """Where and when the numbers were measured; torch is imported here, not at module level."""
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_name": cpu_name(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "load_average_at_end": load_average(),
        "argv": sys.argv,
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus the environment stamp to ``benchmarks/results/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {"benchmark": name, "environment": environment(), **payload}
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (also valid as a Markdown table)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def workloads_arg(text: str) -> list[str]:
    """Parse ``--workloads mlp,lm`` and reject names that are not small demos."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DEMOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown or text!r}; choose from {', '.join(DEMOS)}")
    return names


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def fmt_ratio(stats: dict[str, float]) -> str:
    """``0.987 (0.951-1.012)``: median with min-max."""
    return f"{stats['median']:.3f} ({stats['min']:.3f}-{stats['max']:.3f})"
