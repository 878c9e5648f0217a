"""The batch-size finder: its search against a fake engine with a known memory line, then once for real on a CPU."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import accel_widgets
from accel_widgets import (
    BatchSizeSearch,
    BurstEngine,
    BurstOptions,
    BurstResult,
    Config,
    DeviceInfo,
    StepRecord,
    WorkerCrashed,
    WorkerError,
    WorkerOutOfMemory,
    Workload,
    find_batch_size,
    run_burst,
)
from accel_widgets.inputs.device import GpuInfo
from accel_widgets.knobs.rules import ConfigError
from accel_widgets.results.batchsize import BatchTry
from accel_widgets.results.burst import ErrorInfo, RankSummary, TelemetrySample
from accel_widgets.search.batchsize import DEFAULT_CPU_SHARE, batch_scope, parse_memory_size
from accel_widgets.views.figures import batch_size_figure
from accel_widgets.views.text import summary
from tests.workloads import TinyNet, WideBlocks, tensors

CPU = DeviceInfo(cpu_count=8, cpu_name="Fake CPU")
GPU_MEMORY = 80 * 2**30
GPU = DeviceInfo(cpu_count=8, cpu_name="Fake CPU", gpus=(GpuInfo(0, 0, "Fake GPU", GPU_MEMORY),), driver="1.0")
MiB = 2**20
BASE, PER_SAMPLE = 300 * MiB, 1 * MiB  # the fake's memory line: BASE + PER_SAMPLE x batch size
STEPS, WARMUP = 8, 2


def workload(items: int = 4096, batch_size: int | None = 64) -> Workload:
    return Workload(model=TinyNet, dataset=tensors(items), loss_fn=F.cross_entropy, batch_size=batch_size,
                    name="fake")


@dataclass
class FakeEngine:
    """``run_burst``'s signature, with memory BASE + PER_SAMPLE x batch and samples/s that saturate with the batch.

    On a CPU (``kind="rss"``) it streams one telemetry sample at that memory to ``on_event`` and, if the stop it
    was given is then set, ends "stopped" as the real engine does; ``telemetry=False`` is a sampler that
    missed a short peak (only the ranks' own peak after the burst shows it). On a GPU (``kind="cuda_allocator"``)
    a batch past ``capacity`` bytes raises WorkerOutOfMemory. ``raise_at`` maps sizes to an exception class and
    message; ``during`` runs mid-burst (a user pressing Stop).
    """

    kind: str = "rss"
    capacity: int | None = None
    telemetry: bool = True
    raise_at: dict[int, tuple[type, str]] = field(default_factory=dict)
    during: Any = None
    calls: list[Config] = field(default_factory=list)
    stopped_live: list[int] = field(default_factory=list)

    @staticmethod
    def memory(size: int) -> int:
        return BASE + PER_SAMPLE * size

    @staticmethod
    def rate(size: int) -> float:
        return 10_000.0 * size / (size + 100)  # more per step, less overhead per sample, never quite 10k

    def __call__(self, workload: Workload, config: Config, *, steps: int, seconds: float | None = None,
                 label: str = "", on_event: Any = None, stop: threading.Event | None = None) -> BurstResult:
        self.calls.append(config)
        size = config.batch_size
        assert label == f"batch size {size}" and steps == STEPS
        if self.during is not None:
            self.during(size)
        if size in self.raise_at:
            cls, message = self.raise_at[size]  # the error kind the engine puts on the result it raises with
            kind = "crash" if cls is WorkerCrashed else "oom" if cls is WorkerOutOfMemory else "exception"
            raise cls(message, self.failed(workload, config, message, kind))
        if self.kind == "cuda_allocator" and self.memory(size) > (self.capacity or GPU_MEMORY):
            raise WorkerOutOfMemory("rank 0 failed: CUDA out of memory",
                                    self.failed(workload, config, "CUDA OOM", "oom"))
        if self.telemetry and on_event is not None:
            on_event(TelemetrySample(t=0.5, source="psutil", util_pct=50.0, mem_used_bytes=self.memory(size)))
        if stop is not None and stop.is_set():
            self.stopped_live.append(size)
            return BurstResult(workload=workload.name, config=config, status="stopped", label=label,
                               error=ErrorInfo("stopped", "stopped before the end of the burst"))
        step_s = size / self.rate(size)
        records = [StepRecord(rank=0, step=i, t=i * step_s, data_s=0.0, h2d_s=0.0, compute_s=step_s, total_s=step_s,
                              samples=size, warmup=i < WARMUP) for i in range(WARMUP + steps)]
        rank = RankSummary(0, size * steps, step_s * steps, self.memory(size), self.kind, 0.1, step_s, "cpu")
        return BurstResult(workload=workload.name, config=config, status="ok", warmup_steps=WARMUP, steps=records,
                           ranks=[rank], label=label)

    @staticmethod
    def failed(workload: Workload, config: Config, message: str, kind: str) -> BurstResult:
        return BurstResult(workload=workload.name, config=config, status="failed", error=ErrorInfo(kind, message, 0))

    def sizes(self) -> list[int]:
        return [c.batch_size for c in self.calls]


def search(engine: FakeEngine, *, device: DeviceInfo = CPU, wl: Workload | None = None, **kwargs: Any,
           ) -> tuple[BatchSizeSearch, list[BatchTry]]:
    seen: list[BatchTry] = []
    kwargs.setdefault("memory_cap", BASE + 700 * PER_SAMPLE if device is CPU else None)
    kwargs.setdefault("margin", 0.0)  # the bracket on running out of memory itself; the margin has tests of its own
    wl = wl or workload()
    # the fake's memory is a line of its own, not the model's: start where the config does (the estimate's start has
    # a test of its own)
    kwargs.setdefault("start", wl.batch_size or 1)
    result = find_batch_size(wl, device=device, engine=engine, steps=STEPS, on_try=seen.append, **kwargs)
    return result, seen


# -- the search ---------------------------------------------------------------------------------------------
def test_doubles_until_over_the_cap_then_bisects_to_the_largest_fit():
    engine = FakeEngine()
    result, seen = search(engine)  # the cap sits at 700 samples
    assert engine.sizes() == [64, 128, 256, 512, 1024, 768, 640, 704, 672]
    assert [(t.batch_size, t.fits, t.stage) for t in result.tries] == [
        (64, True, "grow"), (128, True, "grow"), (256, True, "grow"), (512, True, "grow"), (1024, False, "grow"),
        (768, False, "refine"), (640, True, "refine"), (704, False, "refine"), (672, True, "refine")]
    assert seen == list(result.tries)
    assert result.largest_fitting == 672
    assert result.fastest == 672  # the fake's samples/s only grows with the batch
    assert result.stopped_reason == "704 does not fit; 672 does"
    assert engine.stopped_live == [1024, 768, 704]  # the cap stopped them during the burst
    for t in result.tries:
        assert t.peak_memory_bytes == FakeEngine.memory(t.batch_size)
        if t.fits:
            assert t.samples_per_s == pytest.approx(FakeEngine.rate(t.batch_size))
            assert t.step_median_s == pytest.approx(t.batch_size / FakeEngine.rate(t.batch_size)) and t.step_iqr_s == 0
        else:
            assert t.failure == "memory_cap" and t.samples_per_s is None
            assert t.why_not.endswith(" > 1,000 MiB, seen live: the burst was stopped")
    assert result.tries[4].why_not.startswith("over the memory cap: 1,324 MiB > 1,000 MiB")  # 300 MiB + 1024 x 1 MiB
    assert result.cap_bytes == BASE + 700 * PER_SAMPLE and result.memory_kind == "rss"


def test_refine_tries_bound_the_bisection():
    engine = FakeEngine()
    result, _ = search(engine, refine_tries=1)
    assert engine.sizes() == [64, 128, 256, 512, 1024, 768]
    assert result.largest_fitting == 512 and result.stopped_reason == "768 does not fit; 512 does"
    engine = FakeEngine()
    result, _ = search(engine, refine_tries=0)
    assert engine.sizes() == [64, 128, 256, 512, 1024] and result.stopped_reason == "1,024 does not fit"


def test_a_peak_the_telemetry_missed_still_counts_from_the_ranks_own_peak():
    engine = FakeEngine(telemetry=False)
    result, _ = search(engine, refine_tries=0)
    assert engine.stopped_live == []  # nothing was seen live, so every burst ran to its end
    over = result.tries[-1]
    assert (over.batch_size, over.fits, over.failure) == (1024, False, "memory_cap")
    assert over.peak_memory_bytes == FakeEngine.memory(1024) and result.largest_fitting == 512
    assert over.why_not == "over the memory cap: 1,324 MiB > 1,000 MiB"  # after the burst, from the ranks' peak


def test_a_start_that_does_not_fit_halves_then_bisects():
    engine = FakeEngine()
    result, _ = search(engine, start=4096, refine_tries=2)
    assert [(t.batch_size, t.stage) for t in result.tries] == [
        (4096, "grow"), (2048, "shrink"), (1024, "shrink"), (512, "shrink"), (768, "refine"), (640, "refine")]
    assert result.largest_fitting == 640


def test_even_a_batch_of_one_over_the_cap_is_reported():
    engine = FakeEngine()
    result, _ = search(engine, start=4, memory_cap=BASE // 2)
    assert engine.sizes() == [4, 2, 1]
    assert result.largest_fitting is None and result.fastest is None
    assert result.stopped_reason == "even a batch of 1 does not fit"
    assert "largest that fits –" in summary(result)


def test_the_dataset_and_max_batch_size_bound_the_growth():
    engine = FakeEngine()
    result, _ = search(engine, wl=workload(items=300), memory_cap=10 * 2**30)
    assert engine.sizes() == [64, 128, 256, 300]
    assert result.largest_fitting == 300
    assert result.stopped_reason == "every size up to the limit fit: the dataset's 300 items"

    engine = FakeEngine()
    result, _ = search(engine, max_batch_size=200, memory_cap=10 * 2**30)
    assert engine.sizes() == [64, 128, 200]
    assert result.stopped_reason == "every size up to the limit fit: max_batch_size=200"


def test_under_ddp_the_batch_is_per_rank_and_so_is_the_dataset_limit():
    engine = FakeEngine()
    config = Config(parallel="ddp", world_size=2)
    result, _ = search(engine, wl=workload(items=300), config=config, memory_cap=10 * 2**30)
    assert engine.sizes() == [64, 128, 150]  # one full batch per rank: 300 items // 2 ranks
    assert all(c.parallel == "ddp" and c.world_size == 2 for c in engine.calls)
    assert result.stopped_reason == "every size up to the limit fit: the dataset's 300 items (150 per rank)"
    assert result.batch_scope.startswith("per DDP rank: each of the 2 ranks trains on batch_size samples")
    assert "2 x batch_size per optimizer step" in result.batch_scope
    assert batch_scope(Config(grad_accum_steps=4)) == "per micro-batch; 4 micro-batches per optimizer step"
    assert batch_scope(Config()) == "per step"


def test_the_fastest_size_need_not_be_the_largest():
    class Peaked(FakeEngine):
        @staticmethod
        def rate(size: int) -> float:
            return {64: 1000.0, 128: 1500.0, 256: 1200.0}.get(size, 900.0)

    result, _ = search(Peaked(), refine_tries=0)
    assert result.largest_fitting == 512 and result.fastest == 128


# -- stopping and failing -------------------------------------------------------------------------------------
def test_the_stop_event_ends_the_search_between_tries():
    stop = threading.Event()
    engine = FakeEngine()
    seen: list[BatchTry] = []

    def on_try(outcome: BatchTry) -> None:
        seen.append(outcome)
        if len(seen) == 2:
            stop.set()

    result = find_batch_size(workload(), device=CPU, engine=engine, steps=STEPS, memory_cap=10 * 2**30, stop=stop,
                             on_try=on_try, start=64)
    assert engine.sizes() == [64, 128] and len(result.tries) == 2
    assert result.stopped_reason == "stopped: the stop event was set"


def test_the_stop_event_ends_a_running_try_and_a_cap_never_sets_the_callers_stop():
    stop = threading.Event()
    engine = FakeEngine(during=lambda size: stop.set() if size == 256 else None)
    result, _ = search(engine, stop=stop)
    assert engine.sizes() == [64, 128, 256] and engine.stopped_live == [256]
    last = result.tries[-1]
    assert (last.fits, last.failure, last.samples_per_s) == (False, "stopped", None)
    assert result.largest_fitting == 128 and result.stopped_reason == "stopped: the stop event was set"

    stop = threading.Event()
    result, _ = search(FakeEngine(), stop=stop, refine_tries=0)
    assert result.tries[-1].failure == "memory_cap" and not stop.is_set()


def test_a_failure_that_is_not_about_memory_ends_the_search():
    engine = FakeEngine(raise_at={256: (WorkerError, "ValueError: deliberate failure")})
    result, _ = search(engine)
    assert engine.sizes() == [64, 128, 256]
    assert result.tries[-1].failure == "error" and result.largest_fitting == 128
    assert result.stopped_reason == ("batch size 256 failed for a reason other than memory: ValueError: deliberate "
                                     "failure")


def test_a_cpu_allocation_failure_and_a_killed_rank_do_not_fit():
    cpu_oom = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
               "tried to allocate 1125899906842624 bytes")
    engine = FakeEngine(raise_at={512: (WorkerError, cpu_oom), 384: (WorkerCrashed, "rank 0 was killed by SIGKILL")})
    result, _ = search(engine, memory_cap=10 * 2**30, refine_tries=1)
    assert engine.sizes() == [64, 128, 256, 512, 384]
    assert [t.failure for t in result.tries[-2:]] == ["oom", "crash"]
    assert result.tries[-2].why_not.startswith("out of memory: RuntimeError")
    assert result.largest_fitting == 256


# -- on a GPU ---------------------------------------------------------------------------------------------------
def test_on_a_gpu_out_of_memory_is_the_limit():
    engine = FakeEngine(kind="cuda_allocator", capacity=BASE + 700 * PER_SAMPLE)
    result, _ = search(engine, device=GPU)
    assert engine.sizes() == [64, 128, 256, 512, 1024, 768, 640, 704, 672]
    assert result.largest_fitting == 672
    assert {t.failure for t in result.tries if not t.fits} == {"oom"}
    assert all(t.why_not.startswith("out of memory: CUDA OOM") for t in result.tries if not t.fits)
    assert (result.memory_kind, result.cap_bytes, result.device) == ("cuda_allocator", None, "Fake GPU")
    assert all(c.memory_fraction is None for c in engine.calls)
    assert all(t.peak_memory_bytes == FakeEngine.memory(t.batch_size) for t in result.tries if t.fits)


def test_a_gpu_cap_becomes_the_memory_fraction_knob():
    engine = FakeEngine(kind="cuda_allocator")
    result, _ = search(engine, device=GPU, memory_cap=0.25, refine_tries=0)
    assert {c.memory_fraction for c in engine.calls} == {0.25}
    assert result.cap_bytes == GPU_MEMORY // 4 and "memory_fraction=0.25" in result.cap_note
    assert result.config.memory_fraction == 0.25

    result, _ = search(FakeEngine(kind="cuda_allocator"), device=GPU, memory_cap="40GiB", refine_tries=0)
    assert result.config.memory_fraction == 0.5 and result.cap_bytes == 40 * 2**30

    result, _ = search(FakeEngine(kind="cuda_allocator"), device=GPU, config=Config(memory_fraction=0.5),
                       refine_tries=0)
    assert result.cap_bytes == GPU_MEMORY // 2 and result.cap_note == "the config's memory_fraction=0.5"


H200_MIB, H100_MIB = 143_771, 81_559  # what NVML reports for an H200 and an H100 (80 GB)


@pytest.mark.parametrize("mib", [H200_MIB, H100_MIB])
def test_a_share_of_a_real_sized_gpu_is_the_fraction_itself(mib):
    """0.05 of 143,771 MiB through bytes came back as 0.0499999999947, under the knob's minimum: a crash."""
    gpu = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "NVIDIA H200", mib * MiB),))
    engine = FakeEngine(kind="cuda_allocator")
    result, _ = search(engine, device=gpu, memory_cap=0.05, refine_tries=0, max_batch_size=128)
    assert {c.memory_fraction for c in engine.calls} == {0.05} and result.config.memory_fraction == 0.05
    assert result.cap_bytes == int(0.05 * mib * MiB) and "memory_fraction=0.05" in result.cap_note

    result, _ = search(FakeEngine(kind="cuda_allocator"), device=gpu, memory_cap=f"{mib // 2}MiB", refine_tries=0,
                       max_batch_size=128)
    assert result.config.memory_fraction == pytest.approx((mib // 2) / mib) and result.cap_bytes == mib // 2 * MiB


def test_a_gpu_cap_outside_the_knobs_range_is_refused_before_any_burst():
    engine = FakeEngine(kind="cuda_allocator")
    with pytest.raises(ValueError, match=r"1.25% of the GPU's 80.00 GiB: memory_fraction=0.0125 is out of range: "
                       r"use a number in \[0.05, 1\]"):
        search(engine, device=GPU, memory_cap="1GiB")
    with pytest.raises(ValueError, match=r"125\.00% of the GPU's"):
        search(engine, device=GPU, memory_cap="100GiB")
    assert engine.calls == []


@dataclass
class CudaTotalEngine(FakeEngine):
    """A GPU whose ranks read CUDA's total memory (``cudaMemGetInfo``), less than NVML's, as a real rank does."""

    cuda_total: int = 0

    def __call__(self, workload: Workload, config: Config, **kwargs: Any) -> BurstResult:
        result = super().__call__(workload, config, **kwargs)
        result.environment["cuda_memory_bytes"] = self.cuda_total
        return result


def test_the_reported_gpu_cap_is_the_fraction_of_cudas_total_the_allocator_enforces():
    nvml_total = H200_MIB * MiB
    cuda_total = nvml_total - 560 * MiB
    gpu = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "NVIDIA H200", nvml_total),))
    engine = CudaTotalEngine(kind="cuda_allocator", cuda_total=cuda_total)
    result, _ = search(engine, device=gpu, memory_cap=0.25, refine_tries=0, max_batch_size=128)
    assert result.cap_bytes == int(0.25 * cuda_total) < int(0.25 * nvml_total)
    assert result.cap_note.endswith("enforced on CUDA's total of 139.85 GiB")
    unknown, _ = search(FakeEngine(kind="cuda_allocator"), device=gpu, memory_cap=0.25, refine_tries=0,
                        max_batch_size=128)
    assert unknown.cap_bytes == int(0.25 * nvml_total) and "CUDA" not in unknown.cap_note


# -- the cap and bad arguments ----------------------------------------------------------------------------------
def test_memory_cap_forms():
    assert parse_memory_size("2GiB") == 2 * 2**30
    assert parse_memory_size(" 512 mib ") == 512 * 2**20
    assert parse_memory_size("1.5GB") == 1_500_000_000
    assert parse_memory_size("1000") == 1000
    with pytest.raises(ValueError, match="not understood"):
        parse_memory_size("2 gigs")

    result, _ = search(FakeEngine(), memory_cap="1000MiB", refine_tries=0)
    assert result.cap_bytes == 1000 * MiB and result.largest_fitting == 512


def test_the_default_cpu_cap_is_a_share_of_the_available_ram(monkeypatch):
    @dataclass
    class Memory:
        available: int = 8 * 2**30

    monkeypatch.setattr(accel_widgets.search.batchsize.psutil, "virtual_memory", Memory)
    result, _ = search(FakeEngine(), memory_cap=None, refine_tries=0, max_batch_size=64)
    assert result.cap_bytes == int(8 * 2**30 * DEFAULT_CPU_SHARE)
    assert result.cap_note == "default: 50% of the 8.00 GiB RAM available at the start"
    result, _ = search(FakeEngine(), memory_cap=0.25, refine_tries=0, max_batch_size=64)
    assert result.cap_bytes == 2 * 2**30


def test_bad_arguments_raise_before_any_burst():
    engine = FakeEngine()
    for cap, error in ((1.5, ValueError), (0.0, ValueError), (True, TypeError), (0, ValueError), ("lots", ValueError)):
        with pytest.raises(error):
            search(engine, memory_cap=cap)
    with pytest.raises(ValueError, match="start=0"):
        search(engine, start=0)
    with pytest.raises(ValueError, match="max_batch_size=0"):
        search(engine, max_batch_size=0)
    with pytest.raises(ConfigError):
        search(engine, config=Config(world_size=2))  # world_size without parallel="ddp"
    x, y = tensors(64)
    batched = DataLoader(TensorDataset(x, y), batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="batch_sampler"):
        search(engine, wl=Workload(model=TinyNet, dataset=batched, loss_fn=F.cross_entropy))
    assert engine.calls == []


# -- the result as data, text and figure ----------------------------------------------------------------------
def test_the_result_round_trips_through_json_and_reads_as_text():
    result, _ = search(FakeEngine(), config=Config(num_workers=2))
    again = BatchSizeSearch.from_json(result.to_json())
    assert again == result and isinstance(again.tries[0], BatchTry) and again.config == Config(num_workers=2)
    assert json.loads(result.to_json())["tries"][4]["failure"] == "memory_cap"
    text = summary(result).splitlines()
    assert text[0] == "batch size per step: largest that fits 672, fastest 672 (8,705 samples/s)"
    assert text[1].startswith("CPU (Fake CPU), memory cap 1,000 MiB (RSS of the burst's processes; memory_cap=")
    assert "9 tries in" in text[1] and text[1].endswith("704 does not fit; 672 does")
    assert text[2] == "started at 64 (no estimate: a start was given)"
    assert [line.split()[0] for line in text[4:]] == ["64", "128", "256", "512", "640", "672", "704", "768", "1,024"]
    assert text[4].split()[1:3] == ["yes", "3,902"] and text[4].endswith("364 MiB")
    assert text[-1].endswith("no    over the memory cap: 1,324 MiB > 1,000 MiB, seen live: the burst was stopped")


def test_the_figure_draws_samples_per_s_by_batch_size_with_failures_and_the_cap():
    pytest.importorskip("plotly")
    result, _ = search(FakeEngine())
    figure = batch_size_figure(result)
    traces = {t.meta["kind"]: t for t in figure.data}
    assert list(traces["samples_per_s"].x) == [64, 128, 256, 512, 640, 672]
    assert list(traces["samples_per_s"].y) == pytest.approx([FakeEngine.rate(b) for b in (64, 128, 256, 512, 640, 672)])
    assert list(traces["does_not_fit"].x) == [704, 768, 1024] and set(traces["does_not_fit"].y) == {0}
    assert traces["does_not_fit"].text[0].startswith("over the memory cap")
    assert traces["peak_memory"].y[0] == FakeEngine.memory(64) / MiB
    assert figure.layout.xaxis.type == "log" and list(figure.layout.xaxis.tickvals) == [64, 128, 256, 512, 1024]
    notes = [a.text for a in figure.layout.annotations]
    assert "cap 1,000 MiB" in notes and "largest fit 672" in notes


# -- for real -------------------------------------------------------------------------------------------------
class Hoard(TinyNet):
    """TinyNet that keeps ``per_sample`` bytes per sample of its first batch for the whole burst (as activations
    grow with the batch, but steady, so the 10 Hz telemetry sees it), and ~50 ms per step so there is a window
    to see it in."""

    def __init__(self, per_sample: int = 256 * 1024) -> None:
        super().__init__()
        self.per_sample = per_sample
        self.held: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.held is None:  # ones, not empty: untouched pages are not RSS
            self.held = torch.ones(x.shape[0], self.per_sample // 4, device=x.device)
        time.sleep(0.05)
        return super().forward(x)


@pytest.mark.slow
def test_stops_at_a_real_rss_cap_the_growth_crosses():
    wl = Workload(model=Hoard, dataset=tensors(2048), loss_fn=F.cross_entropy, batch_size=128, name="hoard")
    baseline = run_burst(wl, Config(batch_size=16), steps=2).peak_memory_bytes
    cap = baseline + 192 * MiB  # 512 samples hold 128 MiB more than the baseline, 1024 hold 256 MiB more
    statuses: dict[int, str] = {}

    def engine(workload: Workload, config: Config, **kwargs: Any) -> BurstResult:
        result = run_burst(workload, config, **kwargs)
        statuses[config.batch_size] = result.status
        return result

    seen: list[BatchTry] = []
    result = find_batch_size(wl, memory_cap=cap, steps=6, refine_tries=2, engine=engine, on_try=seen.append,
                             start=128)
    sizes = [t.batch_size for t in result.tries]
    assert sizes[:4] == [128, 256, 512, 1024] and len(sizes) == 6 and seen == list(result.tries)
    assert [t.fits for t in result.tries[:4]] == [True, True, True, False]
    assert result.tries[3].failure == "memory_cap" and statuses[1024] == "stopped"  # stopped live, not at the end
    assert 512 <= result.largest_fitting < min(t.batch_size for t in result.tries if not t.fits) <= 1024
    for t in result.tries:
        assert t.peak_memory_bytes is not None and (t.peak_memory_bytes <= cap) == t.fits
        assert (t.samples_per_s is not None and t.samples_per_s > 0) == t.fits
    assert result.memory_kind == "rss" and result.cap_bytes == cap


@pytest.mark.gpu
@pytest.mark.timeout(45)  # the GPU check's plan holds each GPU test to 45 s and each burst to 60 s
def test_on_a_real_gpu_running_out_of_memory_under_a_cap_is_the_limit():
    per_sample = 4 * MiB
    wl = Workload(model=lambda: Hoard(per_sample), dataset=tensors(8192), loss_fn=F.cross_entropy, batch_size=256,
                  name="hoard")
    result = find_batch_size(wl, memory_cap=0.05, steps=4, refine_tries=2,  # the knob's smallest memory_fraction
                             engine=BurstEngine(BurstOptions(timeout_s=20)))
    assert result.memory_kind == "cuda_allocator" and result.config.memory_fraction == 0.05
    assert result.largest_fitting is not None and result.largest_fitting * per_sample <= result.cap_bytes
    assert {t.failure for t in result.tries if not t.fits} == {"oom"}
    assert min(t.batch_size for t in result.tries if not t.fits) * per_sample > result.cap_bytes * 0.8
    assert all(t.peak_memory_bytes <= result.cap_bytes for t in result.tries if t.fits)


# -- the margin, making room, a target batch ---------------------------------------------------------------------
def test_the_margin_brackets_the_largest_size_that_leaves_it_free():
    """Cap 1,000 MiB, margin 10%: a size fits when its peak stays under 900 MiB (600 samples of the fake's line);
    640 ran, but left less."""
    engine = FakeEngine()
    result, _ = search(engine, margin=0.1)
    assert engine.sizes() == [64, 128, 256, 512, 1024, 768, 640, 576, 608]
    assert result.largest_within_margin == 576 and result.largest_fitting == 640
    assert result.stopped_reason == "608 does not fit with 10% of the memory left; 576 does"
    assert result.limit_bytes == BASE + 700 * PER_SAMPLE and result.margin == 0.1
    over = next(t for t in result.tries if t.batch_size == 640)
    assert over.fits and not over.within_margin and over.samples_per_s is not None
    assert result.fastest == 576  # the sizes that leave the margin free are the ones to use
    text = summary(result).splitlines()
    assert text[0].startswith("batch size per step: largest that fits with 10% of the memory left 576 (at all: 640)")
    assert text[2] == "margin: a size fits when its peak leaves 10% of 1,000 MiB free (peak <= 900 MiB)"
    assert any(line.startswith("      640  no    ran (") and "leaves less than 10% of 1,000 MiB free" in line
               for line in text)


H200_CUDA_TOTAL = (H200_MIB - 560) * MiB  # what a rank's cudaMemGetInfo reads: a little under NVML's 143,771 MiB


@dataclass
class H200Engine(FakeEngine):
    """An H200's allocator: 300 MiB + 100 MiB per sample allocated, 5% more reserved, out of memory past CUDA's
    total, which the ranks report."""

    kind: str = "cuda_allocator"
    capacity: int | None = H200_CUDA_TOTAL

    @staticmethod
    def memory(size: int) -> int:
        return BASE + 100 * MiB * size

    def __call__(self, workload: Workload, config: Config, **kwargs: Any) -> BurstResult:
        result = super().__call__(workload, config, **kwargs)
        rank = result.ranks[0]
        reserved = int(rank.peak_memory_bytes * 1.05)
        result.ranks = [dataclasses.replace(rank, peak_reserved_bytes=reserved)]
        result.environment["cuda_memory_bytes"] = H200_CUDA_TOTAL
        return result


def test_on_an_h200_the_margin_is_judged_on_the_reserved_peak_against_cudas_total():
    gpu = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "NVIDIA H200", H200_MIB * MiB),))
    engine = H200Engine()
    result, _ = search(engine, device=gpu, margin=0.1, wl=workload(items=1 << 14))
    # 90% of 143,211 MiB is 128,890 MiB reserved: 122,752 MiB allocated, 1,224 samples; past 1,429 it is OOM
    assert engine.sizes() == [64, 128, 256, 512, 1024, 2048, 1536, 1280, 1152, 1216]
    assert result.largest_within_margin == 1216 and result.largest_fitting == 1280
    assert result.limit_bytes == H200_CUDA_TOTAL and result.cap_bytes is None
    edge = next(t for t in result.tries if t.batch_size == 1280)
    assert edge.reserved_bytes == int(H200Engine.memory(1280) * 1.05) > 0.9 * H200_CUDA_TOTAL
    assert "peak <= 125.87 GiB" in summary(result)


def blocks_workload() -> Workload:
    """A model with repeated blocks (read on the meta device; the fake engine never runs it) and plenty of items."""
    return Workload(model=functools.partial(WideBlocks, 16, 2), dataset=tensors(8192), loss_fn=F.cross_entropy,
                    batch_size=64, name="blocks")


@dataclass
class Checkpointable(FakeEngine):
    """Activations of a quarter of a MiB per sample under activation checkpointing (1 MiB without), at three quarters
    of the samples/s (the recompute); any label (a target's tries name their accumulation), and accumulation
    costing 1% per extra micro-batch."""

    def __call__(self, workload: Workload, config: Config, *, steps: int, seconds: float | None = None,
                 label: str = "", on_event: Any = None, stop: threading.Event | None = None) -> BurstResult:
        self.calls.append(config)
        size, recompute = config.batch_size, config.activation_checkpointing != "off"
        memory = BASE + (PER_SAMPLE // 4 if recompute else PER_SAMPLE) * size
        if on_event is not None:
            on_event(TelemetrySample(t=0.5, source="psutil", util_pct=50.0, mem_used_bytes=memory))
        if stop is not None and stop.is_set():
            return BurstResult(workload=workload.name, config=config, status="stopped", label=label,
                               error=ErrorInfo("stopped", "stopped before the end of the burst"))
        rate = self.rate(size) * (0.75 if recompute else 1.0) * (1 - 0.01 * (config.grad_accum_steps - 1))
        step_s = size * config.grad_accum_steps / rate
        records = [StepRecord(0, i, i * step_s, 0.0, 0.0, step_s, step_s, size * config.grad_accum_steps,
                              warmup=i < WARMUP) for i in range(WARMUP + steps)]
        rank = RankSummary(0, size * config.grad_accum_steps * steps, step_s * steps, memory, "rss", 0.1, step_s, "cpu")
        return BurstResult(workload=workload.name, config=config, status="ok", warmup_steps=WARMUP, steps=records,
                           ranks=[rank], label=label)


def test_where_the_next_size_does_not_fit_activation_checkpointing_is_tried_and_reported():
    engine = Checkpointable()
    result, seen = search(engine, wl=blocks_workload())
    plain = [t for t in result.tries if not t.setting]
    roomy = [t for t in result.tries if t.setting]
    assert [t.batch_size for t in plain] == [64, 128, 256, 512, 1024, 768, 640, 704, 672]
    # from the first size that did not fit, under checkpointing: 704 and 1,408 fit, 2,816 is over the cap
    assert [t.batch_size for t in roomy] == [704, 1408, 2816, 2112, 2464, 2640, 2728]
    assert {t.setting for t in roomy} == {"activation_checkpointing=blocks"} and seen == list(result.tries)
    assert result.largest_within_margin == 672 and result.largest_with_room == 2728
    assert result.room_setting == "activation_checkpointing=blocks"
    assert result.stopped_reason == "704 does not fit; 672 does; with activation_checkpointing=blocks: 2,816 does " \
                                    "not fit; 2,728 does"
    assert result.memory_limited  # samples/s still rose when the memory ran out
    assert result.room_changes() == {"activation_checkpointing": "blocks", "batch_size": 2728}
    assert "with activation_checkpointing=blocks: largest that fits 2,728" in summary(result)
    again = BatchSizeSearch.from_json(result.to_json())
    assert again == result and again.room_config == Config(activation_checkpointing="blocks")
    if _plotly():
        traces = {t.meta["kind"]: t for t in batch_size_figure(result).data}
        assert list(traces["samples_per_s_with_room"].x) == [704, 1408, 2112, 2464, 2640, 2728]

    nothing, _ = search(Checkpointable(), wl=blocks_workload(), make_room=False)
    assert not any(t.setting for t in nothing.tries) and nothing.room_config is None


def _plotly() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_target_batch_is_reached_by_the_fastest_micro_batch_and_accumulation_measured():
    """Target 1,024 per step on one rank: 1,024 itself fits only with checkpointing (slower by its recompute);
    512 x 2 fits as it is and is the fastest of the three largest ways measured."""
    engine = Checkpointable()
    result, _ = search(engine, wl=blocks_workload(), target_batch=1024, refine_tries=0)
    target = result.target
    assert [(t.micro_batch, t.accumulation, t.setting) for t in target.tries] == [
        (1024, 1, "activation_checkpointing=blocks"), (512, 2, ""), (256, 4, "")]
    assert (target.best.micro_batch, target.best.accumulation) == (512, 2)
    assert target.best.samples_per_s == pytest.approx(Checkpointable.rate(512) * 0.99)
    measured = engine.calls[-3:]
    assert [(c.batch_size, c.grad_accum_steps, c.activation_checkpointing) for c in measured] == [
        (1024, 1, "blocks"), (512, 2, "off"), (256, 4, "off")]
    assert summary(result).splitlines()[3].startswith("target global batch 1,024 = micro-batch x grad_accum_steps: "
                                                       "fastest 512 x 2 (1,024 x 1 with activation_checkpointing")
    assert BatchSizeSearch.from_json(result.to_json()).target == target


def test_a_target_batch_and_a_margin_are_checked_before_any_burst():
    engine = FakeEngine()
    with pytest.raises(ValueError, match="no multiple of the 2 ranks"):
        search(engine, config=Config(parallel="ddp", world_size=2), target_batch=1001)
    for margin in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="margin="):
            search(engine, margin=margin)
    with pytest.raises(ValueError, match="target_batch=0"):
        search(engine, target_batch=0)
    assert engine.calls == []


def test_the_search_starts_at_the_estimate_and_says_how_far_it_was():
    """Without a start, the step traced on fake tensors says which size leaves the margin of the cap free, and the
    search starts there; the result compares it with what the bursts found (here a fake whose memory grows faster
    than the tiny model's, so the estimate is high)."""
    engine = FakeEngine()
    result, _ = search(engine, start=None, margin=0.1)
    assert result.estimated is not None and engine.sizes()[0] == min(result.estimated, 4096)
    assert result.largest_within_margin is not None and result.estimate_error == pytest.approx(
        result.estimated / result.largest_within_margin - 1)
    assert f"started at the estimate, {result.estimated:,} (a step traced on fake tensors); it found " \
           f"{result.largest_within_margin:,}: the estimate was" in summary(result)
    assert BatchSizeSearch.from_json(result.to_json()).estimated == result.estimated
