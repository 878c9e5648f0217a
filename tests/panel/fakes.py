"""Fake devices, synthetic results and a fake engine with ``run_burst``'s signature, for panel tests.

The fake engine emits StepRecords and TelemetrySamples through ``on_event`` on the calling thread, as
the real engine does, and returns a BurstResult built from exactly those events, so a test can compare
what the plots received with what was emitted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from accel_widgets import BurstOptions, BurstResult, Config, DeviceInfo, StepRecord, WorkerError
from accel_widgets.inputs.device import GpuInfo
from accel_widgets.results.burst import ErrorInfo, OperatorTime, ProfileCapture, RankSummary, Status, TelemetrySample
from tests.measured import as_measured

CPU = DeviceInfo(cpu_count=2, cpu_name="Fake CPU", cpu_flags=frozenset({"avx2"}))
GPU1 = DeviceInfo(cpu_count=8, cpu_name="Fake CPU", gpus=(GpuInfo(0, 0, "Fake GPU", 80 * 2**30),), driver="1.0")
WARMUP = 2
MIB = 2**20


def step_record(rank: int, step: int, *, step_s: float = 0.05, data_s: float = 0.001,
                warmup: bool = False) -> StepRecord:
    """One step; the very first also pays a second of one-off cost, like a compile."""
    total = step_s + (1.0 if step == 0 else 0.0)
    return StepRecord(rank=rank, step=step, t=0.5 + step * step_s, data_s=data_s, h2d_s=0.0,
                      compute_s=total - data_s, total_s=total, samples=32, loss=1.0 / (step + 1), warmup=warmup)


def sample(t: float, *, util: float = 90.0, foreign: float = 0.0, source: str = "psutil",
           mem_mib: float = 100.0, total_mib: float = 16 * 1024) -> TelemetrySample:
    return TelemetrySample(t=t, source=source, util_pct=util, mem_used_bytes=int(mem_mib * MIB),
                           device="cpu" if source == "psutil" else "cuda:0", mem_total_bytes=int(total_mib * MIB),
                           host_util_pct=util + foreign)


def synthetic_result(config: Config | None = None, *, steps: int = 10, step_s: float = 0.05, data_s: float = 0.001,
                     h2d_s: float = 0.0, util: float = 90.0, foreign: float = 0.0, source: str = "psutil",
                     peak_mib: float = 100.0, total_mib: float = 16 * 1024, jitter: float = 0.0, ranks: int = 1,
                     status: Status = "ok", error: ErrorInfo | None = None, warnings: list[str] | None = None,
                     label: str = "") -> BurstResult:
    """A BurstResult as the engine would return it, with chosen shares, utilisation and memory."""
    config = config or Config()
    records = []
    for rank in range(ranks):
        for step in range(WARMUP + steps):
            wobble = step_s * jitter * (1 if step % 2 else -1)
            total = step_s + wobble
            records.append(StepRecord(rank=rank, step=step, t=0.5 + step * step_s, data_s=data_s * total / step_s,
                                      h2d_s=h2d_s * total / step_s, compute_s=total * (1 - (data_s + h2d_s) / step_s),
                                      total_s=total, samples=32, loss=1.0, warmup=step < WARMUP))
    span = (WARMUP + steps) * step_s  # ten samples from the burst's start, most inside its measured window
    telemetry = [sample(0.5 + span * i / 10, util=util, foreign=foreign, source=source, mem_mib=peak_mib,
                        total_mib=total_mib) for i in range(10)]
    summaries = [RankSummary(rank, 32 * steps, steps * step_s, int(peak_mib * MIB), "rss", 0.1, step_s, "cpu")
                 for rank in range(ranks)] if status == "ok" else []
    return as_measured(BurstResult(workload="fake", config=config, status=status, world_size=ranks,
                                   warmup_steps=WARMUP, steps=records, telemetry=telemetry, ranks=summaries,
                                   error=error, warnings=list(warnings or []), label=label))


@dataclass
class Call:
    config: Config
    kwargs: dict[str, Any]


@dataclass
class FakeEngine:
    """Emits a burst's events through ``on_event`` and returns the matching result.

    ``pace_s`` sleeps between events (to exercise batching and Stop); ``until_stop`` keeps emitting
    until the stop event is set; ``fail`` raises: "worker" a WorkerError carrying a failed result,
    "plain" an exception without one; ``fail_times`` limits how many calls fail. ``options.profile_steps`` > 0
    puts a :class:`ProfileCapture` (two operators, a trace path under ``options.profile_dir``) on rank 0, as the
    real engine does after a finished burst. ``speedups`` makes a config's bursts that many times faster than the
    others' (their measured seconds shrink), for the comparisons that follow a run; ``freed_speedups`` a headspace
    variant's (by the part it frees), as the real engine's ``options.freed`` asks. A call's ``options`` are recorded as
    the engine reads them (None: the defaults). With ``options.cluster`` its ranks ran on Ray nodes, one each.
    """

    steps_default: int = 10
    pace_s: float = 0.0
    until_stop: bool = False
    fail: str | None = None
    fail_times: int = 1
    calls: list[Call] = field(default_factory=list)
    emitted: list[list[StepRecord | TelemetrySample]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    speedups: dict[Config, float] = field(default_factory=dict)
    freed_speedups: dict[str, float] = field(default_factory=dict)

    def __call__(self, workload: Any, config: Config, *, steps: int | None = None, seconds: float | None = None,
                 on_event: Any = None, stop: threading.Event | None = None, label: str = "",
                 options: BurstOptions | None = None) -> BurstResult:
        options = options or BurstOptions()
        self.calls.append(Call(config, {"steps": steps, "seconds": seconds, "on_event": on_event, "stop": stop,
                                        "label": label, "options": options}))
        events: list[StepRecord | TelemetrySample] = []
        self.emitted.append(events)
        self.started.set()
        if self.fail and len(self.calls) <= self.fail_times:
            return self._fail(config, label)
        count = steps or self.steps_default
        step = 0
        while self.until_stop or step < WARMUP + count:
            if stop is not None and stop.is_set():
                break
            for rank in range(config.ranks):
                events.append(step_record(rank, step, warmup=step < WARMUP))
            events.append(sample(0.5 + step * 0.05, mem_mib=100 + step))
            for event in events[-(config.ranks + 1):]:
                if on_event is not None:
                    on_event(event)
            step += 1
            if self.pace_s:
                time.sleep(self.pace_s)
        stopped = stop is not None and stop.is_set()
        why = ErrorInfo("stopped", "stopped before the end of the burst (Stop or an interrupt)") if stopped else None
        steps_done = [e for e in events if isinstance(e, StepRecord)]
        measured = [e for e in steps_done if not e.warmup and e.rank == 0]
        profile = None
        if options.profile_steps and not stopped:
            profile = ProfileCapture(options.profile_steps, f"{options.profile_dir}/fake-trace.json", [
                OperatorTime("aten::addmm", 3 * options.profile_steps, 1.5, 0.0),
                OperatorTime("aten::relu", options.profile_steps, 0.25, 0.0)])
        return BurstResult(
            workload=workload.name, config=config, status="stopped" if stopped else "ok", world_size=config.ranks,
            warmup_steps=WARMUP, steps=steps_done, telemetry=[e for e in events if isinstance(e, TelemetrySample)],
            ranks=[RankSummary(r, 32 * len(measured), 0.05 * max(1, len(measured)) / self.speedups.get(config, 1.0)
                               / (self.freed_speedups.get(options.freed, 1.0) if options.freed is not None else 1.0),
                               150 * MIB, "rss", 0.1, 0.05,
                               "cpu", profile=profile if r == 0 else None,
                               node=f"fake-node-{r}" if options.cluster is not None else "")
                   for r in range(config.ranks)],
            error=why,
            label=label,
            freed=options.freed,
            # as the real engine says of a burst whose ranks were Ray actors (analysis.compare.where_ran reads it)
            environment={"start_method": "ray actor"} if options.cluster is not None else {},
        )

    def _fail(self, config: Config, label: str) -> BurstResult:
        if self.fail == "plain":
            raise RuntimeError("the fake engine broke\nsecond line of the message")
        error = ErrorInfo("exception", "ValueError: deliberate failure at call 3", 0, "Traceback...")
        result = BurstResult(workload="fake", config=config, status="failed", label=label, error=error)
        raise WorkerError("rank 0 failed: ValueError: deliberate failure at call 3\n\n-- traceback --", result)
