"""Soak: hundreds of consecutive bursts in one process, each with a random valid knob combination (issue #9).

Why: a notebook kernel runs burst after burst for hours. Anything one burst leaves behind in the caller
-- an open pipe, a thread, a child process, memory, a temp dir -- adds up until the kernel runs out of
file descriptors or memory. Each burst here draws every knob from the registry (``aw.knobs.KNOBS``;
combinations ``check_config`` refuses are drawn again), trains a tiny model for 2-6 steps, and about a
third run as 2-rank DDP; some are stopped from ``on_event`` after their first step and some fail by
design (the model's forward raises at a drawn call; a ``WorkerError`` naming it is expected). After
every burst the caller's open file descriptors, threads, child processes (the forkserver and the
resource tracker are session-long infrastructure and do not count), RSS and leftover temp files are
recorded. The first ``--settle`` bursts cover every kind of burst at least once and set the baseline,
so one-off setup (imports, the forkserver, lazy pools) lands before it.

Goals, measured from the baseline to the end: no growth in file descriptors, threads or children;
RSS growth <= 5%; no temp file left after any burst; every burst ends as its plan expects.

    .venv/bin/python benchmarks/soak.py [--bursts 200] [--seed 0] [--settle 20]

Compiling is left out of the draw (tens of seconds per burst on a CPU). The memmap data cache writes
under ``$ACCEL_WIDGETS_CACHE``, which the script points at a private temp dir, removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import psutil
import torch
from _common import load_average, positive_int, spread, table, write_json
from torch import nn
from torch.nn import functional as F

import accel_widgets as aw
from accel_widgets.engine.ranks import leftover_temp_files
from accel_widgets.knobs.plan import resolve

Kind = Literal["normal", "stop", "fail"]
KIND_WEIGHTS: dict[Kind, float] = {"normal": 0.6, "stop": 0.2, "fail": 0.2}
DDP_SHARE = 1 / 3
STEPS = (2, 6)
WARMUP_STEPS = 2  # the engine's default without compiling: a failure is drawn within warm-up + steps
FAIL_MARKER = "deliberate failure"
# The first bursts: every kind, on one rank and on two, before the baseline is taken.
COVER: tuple[tuple[Kind, bool], ...] = (("normal", False), ("normal", True), ("stop", False), ("stop", True),
                                        ("fail", False), ("fail", True))
# Values drawn for the numeric knobs, whose registry ranges reach far past a tiny burst. Knobs with
# choices or booleans draw from all their values; a numeric knob missing here stays at its default.
SMALL_VALUES: dict[str, tuple[Any, ...]] = {
    "batch_size": (None, 8, 16),
    "num_workers": (0, 1, 2),
    "prefetch_factor": (1, 2, 4),
    "grad_accum_steps": (1, 2),
    "sync_every": (0, 1, 3),
    "memory_fraction": (None, 0.5),
}
# Held fixed: compiling costs tens of seconds per burst on a CPU; the plan decides parallel/world_size.
FIXED: dict[str, Any] = {"compile_mode": "off", "parallel": "none", "world_size": 1}
BURST_TIMEOUT_S = 120.0
CHILD_GRACE_S = 3.0  # the same grace the test suite's leak check gives a finished burst's processes
RSS_GOAL = 0.05
METRICS = ("fds", "threads", "children", "rss_mb", "temp_files")


# -- the plan -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """One burst of the soak: its config and how it is expected to end."""

    index: int
    kind: Kind
    config: aw.Config
    steps: int
    fail_at: int | None = None  # the forward call that raises (fail plans)
    fail_rank: int | None = None  # the DDP rank that raises; None: every rank
    rejected: int = 0  # combinations check_config refused while drawing this one

    @property
    def ranks(self) -> int:
        return self.config.ranks


def draw_value(rng: random.Random, knob: aw.Knob) -> Any:
    if knob.choices is not None:
        return rng.choice(knob.choices)
    if knob.kind is bool:
        return rng.choice((False, True))
    return rng.choice(SMALL_VALUES.get(knob.name, (knob.default,)))


def draw_config(rng: random.Random, device: aw.DeviceInfo, ddp: bool,
                workload: aw.Workload) -> tuple[aw.Config, int]:
    """A random knob combination this device and ``workload``'s model accept (activation checkpointing needs
    repeated blocks, say), and how many refused ones were drawn before it."""
    rejected = 0
    while True:
        values = {name: draw_value(rng, knob) for name, knob in aw.KNOBS.items()}
        values.update(FIXED)
        if ddp:
            values.update(parallel="ddp", world_size=2)
        config = aw.Config(**values)
        try:
            resolve(config, device, workload)
        except aw.ConfigError:
            rejected += 1
            continue
        return config, rejected


def draw_plan(rng: random.Random, index: int, device: aw.DeviceInfo, kind: Kind, ddp: bool,
              workload: aw.Workload) -> Plan:
    config, rejected = draw_config(rng, device, ddp, workload)
    steps = rng.randint(*STEPS)
    fail_at = fail_rank = None
    if kind == "fail":
        # A forward call that is always reached: every step makes at least one.
        fail_at = rng.randint(1, WARMUP_STEPS + steps)
        fail_rank = rng.choice((None, 0, 1)) if ddp else None
    return Plan(index, kind, config, steps, fail_at, fail_rank, rejected)


def draw_plans(count: int, seed: int, device: aw.DeviceInfo, workload: aw.Workload) -> list[Plan]:
    """``count`` plans from ``seed`` that ``workload`` can run: first one of each kind on one and two ranks, then
    random draws."""
    rng = random.Random(seed)
    plans = []
    for index in range(count):
        if index < len(COVER):
            kind, ddp = COVER[index]
        else:
            kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
            ddp = rng.random() < DDP_SHARE
        plans.append(draw_plan(rng, index, device, kind, ddp, workload))
    return plans


# -- the soak's own tiny workload -----------------------------------------------------------------
FEATURES, CLASSES, SAMPLES = 16, 4, 256


class SoakNet(nn.Module):
    """Two alike residual blocks and a head: a burst's cost is the harness, which is what the soak exercises, and the
    knobs that work per block (activation checkpointing) have blocks to work on."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()) for _ in range(2))
        self.out = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


class FailingNet(SoakNet):
    """Raises at its ``at_call``-th forward call (on one DDP rank when ``rank`` is set)."""

    def __init__(self, at_call: int, rank: int | None) -> None:
        super().__init__()
        self.at_call, self.rank, self.calls = at_call, rank, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.at_call and (self.rank is None or torch.distributed.get_rank() == self.rank):
            raise RuntimeError(f"{FAIL_MARKER} at forward call {self.calls}")
        return super().forward(x)


def soak_workload(plan: Plan | None = None) -> aw.Workload:
    """The workload of ``plan`` (None: of a plan that does not fail)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x[:, :CLASSES].argmax(dim=1)
    fails = plan is not None and plan.kind == "fail"
    model: Any = FailingNet(plan.fail_at or 1, plan.fail_rank) if fails else SoakNet
    return aw.Workload(model=model, dataset=(x, y), loss_fn=F.cross_entropy, batch_size=16, name="soak")


# -- what the caller holds --------------------------------------------------------------------------
def infrastructure_pids() -> set[int]:
    """The forkserver and the resource tracker: started once per session, like a kernel's, so allowed."""
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    return {pid for pid in (server, tracker) if pid}


def live_children() -> int:
    """Running descendants of this process, infrastructure and zombies (already dead) not counted."""
    allowed, count = infrastructure_pids(), 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.pid not in allowed and child.status() != psutil.STATUS_ZOMBIE:
                count += 1
    return count


def snapshot(owner_pid: int) -> dict[str, float]:
    """What this process holds now, after garbage collection (a cycle the collector frees is no leak).

    Children get the test suite's grace to exit: teardown is asynchronous by a few hundred ms.
    """
    gc.collect()
    deadline = time.monotonic() + CHILD_GRACE_S
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    me = psutil.Process()
    return {"fds": me.num_fds(), "threads": me.num_threads(), "children": live_children(),
            "rss_mb": round(me.memory_info().rss / 2**20, 1), "temp_files": len(leftover_temp_files(owner_pid))}


# -- running --------------------------------------------------------------------------------------
def expected(plan: Plan, status: str, error: str) -> bool:
    """Whether a burst ended as its plan says: ok; stopped (or done before the stop landed); its failure."""
    if plan.kind == "normal":
        return status == "ok"
    if plan.kind == "stop":
        return status in ("stopped", "ok")
    return status == "WorkerError" and FAIL_MARKER in error


def run_plan(plan: Plan, workload: aw.Workload, timeout_s: float = BURST_TIMEOUT_S) -> dict[str, Any]:
    """Run one planned burst; a stop plan sets ``stop`` from ``on_event`` at its first step."""
    stop = threading.Event()

    def on_event(event: Any) -> None:
        if plan.kind == "stop" and isinstance(event, aw.StepRecord):
            stop.set()

    started = time.perf_counter()
    try:
        result = aw.run_burst(workload, plan.config, steps=plan.steps, on_event=on_event, stop=stop,
                              options=aw.BurstOptions(timeout_s=timeout_s))
        status, error = result.status, result.error.message if result.error is not None else ""
    except aw.BurstError as exc:
        status, error = type(exc).__name__, str(exc)
    first = error.strip().splitlines()[0] if error.strip() else ""
    return {"index": plan.index, "kind": plan.kind, "ranks": plan.ranks, "steps": plan.steps,
            "config": plan.config.label(), "fail_at": plan.fail_at, "fail_rank": plan.fail_rank,
            "rejected": plan.rejected, "status": status, "expected": expected(plan, status, error),
            "error": first, "wall_s": round(time.perf_counter() - started, 3)}


def soak(plans: list[Plan], workload_for: Callable[[Plan], aw.Workload],
         on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run ``plans`` one after another in this process; each record carries the snapshot taken after it."""
    owner = os.getpid()
    records = []
    for plan in plans:
        record = run_plan(plan, workload_for(plan))
        record["snapshot"] = snapshot(owner)
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


@dataclass
class Growth:
    """One metric from the first burst through the baseline to the end."""

    first: float
    baseline: float
    final: float
    max_after: float

    @property
    def growth(self) -> float:
        """The most the metric rose above the baseline at any later burst."""
        return self.max_after - self.baseline


def growth(snapshots: list[dict[str, float]], baseline_index: int) -> dict[str, Growth]:
    """Per metric: values at the first burst, at ``baseline_index``, at the end, and the max after the baseline."""
    if not 0 <= baseline_index < len(snapshots) - 1:
        raise ValueError(f"the baseline ({baseline_index}) needs at least one snapshot after it ({len(snapshots)})")
    base, later = snapshots[baseline_index], snapshots[baseline_index + 1:]
    return {m: Growth(snapshots[0][m], base[m], snapshots[-1][m], max(s[m] for s in later)) for m in METRICS}


def goals(grown: dict[str, Growth], records: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    """Each goal's text and whether it is met."""
    rss = grown["rss_mb"]
    rss_growth = rss.final / rss.baseline - 1 if rss.baseline else 0.0
    return {
        "fds": ("no growth", grown["fds"].growth <= 0),
        "threads": ("no growth", grown["threads"].growth <= 0),
        "children": ("no growth", grown["children"].growth <= 0),
        "rss_mb": (f"final <= baseline + {RSS_GOAL:.0%} (measured {rss_growth:+.1%})", rss_growth <= RSS_GOAL),
        "temp_files": ("none after any burst", all(r["snapshot"]["temp_files"] == 0 for r in records)),
        "outcomes": ("every burst as planned", all(r["expected"] for r in records)),
    }


# -- output ---------------------------------------------------------------------------------------
def print_record(record: dict[str, Any], total: int) -> None:
    s = record["snapshot"]
    verdict = "as planned" if record["expected"] else f"UNEXPECTED: {record['error'][:80]}"
    print(f"{record['index'] + 1:>4}/{total} {record['ranks']} rank(s) {record['kind']:<6} {record['status']:<12} "
          f"{record['wall_s']:6.2f} s  fds {s['fds']:>3.0f} threads {s['threads']:>3.0f} children "
          f"{s['children']:.0f} rss {s['rss_mb']:7.1f} MB temp {s['temp_files']:.0f}  {verdict}", flush=True)


def summary_tables(records: list[dict[str, Any]], grown: dict[str, Growth], met: dict[str, tuple[str, bool]],
                   settle: int) -> str:
    rows = [[m, f"{g.first:g}", f"{g.baseline:g}", f"{g.final:g}", f"{g.max_after:g}", f"{g.growth:+g}",
             met[m][0], "met" if met[m][1] else "NOT MET"] for m, g in grown.items()]
    metric_table = table(["metric", "after burst 1", f"after burst {settle}", "final", f"max after {settle}",
                          "growth", "goal", ""], rows)
    by_kind: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        by_kind.setdefault((r["kind"], r["ranks"]), []).append(r)
    kind_rows = []
    for (kind, ranks), group in sorted(by_kind.items()):
        statuses = Counter(r["status"] for r in group)
        wall = spread([r["wall_s"] for r in group])
        kind_rows.append([kind, ranks, len(group), sum(r["expected"] for r in group),
                          ", ".join(f"{k} {n}" for k, n in statuses.most_common()),
                          f"{wall['median']:.2f} ({wall['min']:.2f}-{wall['max']:.2f})"])
    kind_table = table(["kind", "ranks", "bursts", "as planned", "statuses", "wall s median (min-max)"], kind_rows)
    return f"{metric_table}\n\n{kind_table}\n\noutcomes: {met['outcomes'][0]}: " \
           f"{'met' if met['outcomes'][1] else 'NOT MET'}"


def knob_coverage(plans: list[Plan]) -> dict[str, dict[str, int]]:
    """How often each value of each knob was drawn: the soak covers the registry, not a corner of it."""
    coverage: dict[str, Counter[str]] = {name: Counter() for name in aw.KNOBS}
    for plan in plans:
        for name, value in plan.config.to_dict().items():
            coverage[name][repr(value)] += 1
    return {name: dict(sorted(c.items())) for name, c in coverage.items()}


@contextlib.contextmanager
def private_temp_and_cache() -> Iterator[str]:
    """A private TMPDIR and cache root for the run: leftovers are ours alone, and the memmap cache goes too."""
    path = tempfile.mkdtemp(prefix="accel-widgets-soak-")
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "ACCEL_WIDGETS_CACHE")}
    os.environ["TMPDIR"], os.environ["ACCEL_WIDGETS_CACHE"] = path, os.path.join(path, "cache")
    tempfile.tempdir = path
    try:
        yield path
    finally:
        tempfile.tempdir = None
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bursts", type=positive_int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle", type=positive_int, default=20,
                        help="bursts before the baseline (at most half the bursts; at least one of each kind)")
    args = parser.parse_args()
    if args.bursts < 2:
        parser.error("--bursts must be >= 2: growth needs a baseline and a burst after it")
    settle = min(args.settle, args.bursts // 2)
    device = aw.probe_device()
    plans = draw_plans(args.bursts, args.seed, device, soak_workload())
    print(f"soak: {args.bursts} bursts (seed {args.seed}) on {device.name}; baseline after burst {settle}", flush=True)
    started, load_at_start = time.perf_counter(), load_average()
    with private_temp_and_cache():
        records = soak(plans, soak_workload, on_record=lambda r: print_record(r, args.bursts))
    elapsed = time.perf_counter() - started
    grown = growth([r["snapshot"] for r in records], settle - 1)
    met = goals(grown, records)
    print("\n" + summary_tables(records, grown, met, settle))
    path = write_json("soak", {
        "bursts": args.bursts, "seed": args.seed, "settle": settle, "elapsed_s": round(elapsed, 1),
        "load_average_at_start": load_at_start, "rejected_draws": sum(p.rejected for p in plans),
        "wall_s": spread([r["wall_s"] for r in records]),
        "growth": {m: {**vars(g), "growth": g.growth} for m, g in grown.items()},
        "goals": {k: {"goal": text, "met": ok} for k, (text, ok) in met.items()},
        "knob_coverage": knob_coverage(plans), "records": records, "load_average_at_end": load_average(),
    })
    print(f"\n{len(records)} bursts in {elapsed:.0f} s ({statistics.median(r['wall_s'] for r in records):.2f} s "
          f"median); {sum(p.rejected for p in plans)} refused combinations redrawn; wrote {path}")
    return 0 if all(ok for _, ok in met.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
