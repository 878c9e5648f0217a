"""Background device/host telemetry for a burst, sampled in the parent process while workers train.

The sampler runs in the notebook kernel, which must stay CUDA-free so it can still launch DDP workers:
GPUs are read through NVML (``pynvml`` never creates a CUDA context) and, where there is no usable GPU,
the workers' CPU and memory use is read from ``/proc`` (one read of each process's stat line a tick: psutil's
objects cost several times that, and every microsecond here is taken from cores that train). Timestamps are
``time.perf_counter()`` minus the burst's ``clock_origin``; on Linux perf_counter is CLOCK_MONOTONIC, shared by
every process on the machine, so samples line up with the step events the workers stamp on the same clock.

Where the GPU has them (Hopper and newer), NVML's GPM metrics ride along too: the share of the interval since the
previous tick that the SMs were busy ("SM active"), their warps' occupancy, the share the tensor cores were busy and
the DRAM bandwidth used, each from two GPM samples (``nvmlGpmMetricsGet``), without a DCGM daemon. Utilisation
alone is the share of time any kernel ran: it reads 100% for a GPU spinning in an NCCL wait or one tiny kernel.

Energy rides along as raw readings: each GPU sample carries NVML's total energy counter (Volta and newer)
and its power, each CPU sample the RAPL packages' counter where it is readable; the result turns them into
joules over its measured window (:mod:`accel_widgets.metrics.energy`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import psutil

from ..inputs.device import usable_cpu_count
from ..metrics.energy import POWERCAP, RaplCounter
from ..results.burst import TelemetrySample

THREAD_NAME = "accel-widgets-telemetry"

#: Every process on the machine is read this often (a few ms for a hundred processes): it is the interval over which
#: other programs' CPU use is attributed, and catches family members the per-tick walk cannot see.
MACHINE_SCAN_S = 2.0
#: Readings a second. NVML refreshes utilisation over 1/6 s to 1 s and a CPU share is a delta, so 5 Hz draws a
#: burst of seconds in detail; each reading is CPU the caller takes from a machine the burst fills
#: (benchmarks/harness_overhead.py: the caller's pump and telemetry together under 1% of a core).
INTERVAL_S = 0.2


class TelemetrySampler:
    """Samples GPUs (NVML) or the watched worker processes (psutil) at a fixed rate on a daemon thread.

    Backend: NVML when ``gpus`` is non-empty and NVML initialises; psutil otherwise (no driver,
    no ``pynvml``, a bad index). ``gpus`` pairs each GPU's CUDA ordinal, as the ranks number it,
    with what NVML finds it by (``GpuInfo.nvml_key``: its UUID, which also names a MIG device, or its
    NVML index); the two differ under CUDA_VISIBLE_DEVICES. Each sample is labelled ``cuda:{ordinal}``,
    so ``cuda:0`` is the device rank 0 trains on. Where a GPU does not report utilisation (a MIG device)
    its samples carry ``util_pct=None`` and still carry memory.

    Energy: a GPU sample carries NVML's energy counter where the GPU has one, except on a MIG device
    (``energy_scope="mig"``: NVML's power and energy there are the whole GPU's, not the instance's). Without
    GPUs, each sample carries the CPU packages' RAPL counter read under ``powercap`` when that is readable
    (usually for root only); with GPUs asked for it is not read, even when NVML fails, since the packages'
    energy is not what a GPU burst spends.

    ``clock`` only stamps samples; the tick schedule runs on ``time.monotonic`` so a fake clock in tests
    cannot stall or race the thread. A tick that falls behind (a stalled machine) re-aligns instead of
    firing a catch-up burst of back-to-back readings.

    ``on_sample`` runs on the sampler thread, once per sample after it is appended to ``samples``: keep it
    quick (hand the sample to a queue or a widget) or it delays the next tick. Anything a tick raises,
    the callback included, is recorded in ``errors`` (each distinct message once, so a persistent fault
    cannot grow the list at every tick for a whole burst) and sampling goes on: telemetry must never end a
    burst. ``errors`` also says why NVML was not used when GPUs were asked for.
    """

    def __init__(
        self,
        *,
        clock_origin: float,
        gpus: Sequence[tuple[int, int | str]] = (),
        interval_s: float = INTERVAL_S,
        on_sample: Callable[[TelemetrySample], None] | None = None,
        nvml: Any | None = None,
        clock: Callable[[], float] = time.perf_counter,
        powercap: Path = POWERCAP,
        caller_pid: int | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.samples: list[TelemetrySample] = []
        self.errors: list[str] = []
        self._origin = clock_origin
        self._interval = interval_s
        self._on_sample = on_sample
        self._clock = clock
        self._stop_event = threading.Event()
        self._sampling = threading.Event()  # cleared while paused; set again by resume() and stop()
        self._sampling.set()
        self._resumed = False  # the thread primes its readings before the first tick after a pause
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Process state, read from /proc on the sampler thread only. Pids handed to watch() wait in _pending.
        self._pending: set[int] = set()
        self._roots: dict[int, int] = {}  # watched pid -> its start time (a recycled pid is another process)
        self._family: set[int] = set()  # the roots and their descendants (DataLoader workers) at the last scan
        self._rates = CpuRates()
        self._loader_pct: float | None = None
        self._workers_pct: float | None = None
        self._cpus = usable_cpu_count()  # 100% must mean all usable cores
        self._host_cpu = HostCpu()
        self._caller_pid = os.getpid() if caller_pid is None else caller_pid
        self._machine = MachineLoad(self._caller_pid)
        self._scan_due = 0.0
        self._mem_total = int(psutil.virtual_memory().total)
        # NVML state: a module with NVML open, and the (CUDA ordinal, handle) pairs to read.
        self._nvml: Any | None = None
        self._handles: list[tuple[int, Any]] = []
        self._gpm: dict[int, GpmReader] = {}  # CUDA ordinal -> its GPM reader, where the GPU has GPM
        self._mig = {ordinal for ordinal, key in gpus if isinstance(key, str) and key.startswith("MIG-")}
        self._rapl = None if gpus else RaplCounter.open(powercap)
        use_nvml = bool(gpus) and self._open_nvml(nvml, gpus)
        self.source: Literal["nvml", "psutil"] = "nvml" if use_nvml else "psutil"

    # -- public API -------------------------------------------------------------------------------
    def watch(self, pid: int) -> None:
        """Include ``pid`` and, from each tick on, all its descendants (DataLoader workers spawn late).

        Safe to call from any thread, before or after ``start()``. A pid that is already gone is
        dropped silently at the next tick: a worker that died fast is the burst's error to report.
        """
        with self._lock:
            self._pending.add(pid)

    def start(self) -> None:
        """Start sampling on a daemon thread (daemon: a kernel that exits must not wait on telemetry)."""
        if self._thread is not None or self._stop_event.is_set():
            raise RuntimeError("a TelemetrySampler runs once; create a new one for each burst")
        self._host_cpu.read()  # primes it: a first reading has nothing to compare with
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop sampling until :meth:`resume`, without waking: ranks held between measured windows
        (:class:`~accel_widgets.engine.launcher.HeldBurst`) are idle while another config measures, and every
        tick of an idle burst's sampler would be taken from that measurement. Takes effect at the next tick."""
        self._sampling.clear()

    def resume(self) -> None:
        """Sample again after :meth:`pause`; the first tick re-reads the counters, so no sample averages over
        the paused time."""
        self._resumed = True
        self._sampling.set()

    def stop(self) -> list[TelemetrySample]:
        """Stop, wait for the thread to end, release NVML and return the samples. Idempotent.

        The join has no timeout on purpose: callers rely on no sampler thread touching NVML or the
        samples once this returns.
        """
        self._stop_event.set()
        self._sampling.set()  # a paused thread wakes to see the stop
        if self._thread is not None:
            self._thread.join()
        for reader in self._gpm.values():
            reader.close()
        self._gpm = {}
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                self._record(f"nvmlShutdown: {_describe(exc)}")
        return self.samples

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- setup ------------------------------------------------------------------------------------
    def _open_nvml(self, nvml: Any | None, gpus: Sequence[tuple[int, int | str]]) -> bool:
        """Initialise NVML and look up every handle; on any failure leave NVML closed and say why."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                self._record(f"NVML unavailable ({_describe(exc)}); sampling worker processes with psutil")
                return False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._record(f"NVML unavailable ({_describe(exc)}); sampling worker processes with psutil")
            return False
        try:
            self._handles = [(ordinal, _handle(nvml, key)) for ordinal, key in gpus]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            self._record(f"NVML device lookup failed ({_describe(exc)}); sampling worker processes with psutil")
            return False
        self._nvml = nvml
        # A MIG instance's GPM is read per GPU instance (nvmlGpmMigSampleGet): left out, as its utilisation is.
        self._gpm = {ordinal: reader for ordinal, handle in self._handles if ordinal not in self._mig
                     and (reader := GpmReader.open(nvml, handle)) is not None}
        return True

    # -- sampler thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop_event.is_set():
            if not self._sampling.is_set():
                self._sampling.wait()
                next_tick = time.monotonic()
                continue
            try:
                if self._resumed:
                    self._resumed = False
                    self._prime()
                self._tick()
            except Exception as exc:
                self._record(_describe(exc))
            next_tick += self._interval
            now = time.monotonic()
            next_tick = max(next_tick, now)
            if self._stop_event.wait(next_tick - now):
                break

    def _prime(self) -> None:
        """Read the counters a sample is a difference of, so the next one covers only the time since."""
        self._host_cpu.read()
        self._read_psutil(self._clock() - self._origin)
        self._stop_event.wait(min(self._interval, 0.05))

    def _tick(self) -> None:
        t = self._clock() - self._origin
        readings = self._read_nvml(t) if self.source == "nvml" else self._read_psutil(t)
        for sample in readings:
            self.samples.append(sample)
            if self._on_sample is not None:
                try:
                    self._on_sample(sample)
                except Exception as exc:
                    self._record(f"on_sample: {_describe(exc)}")

    def _read_nvml(self, t: float) -> list[TelemetrySample]:
        """One sample per GPU; a GPU that fails this tick is skipped so the others still report."""
        nvml = self._nvml
        readings = []
        scan_due = time.monotonic() >= self._scan_due
        self._read_psutil(t)  # refreshes the workers' and loader workers' shares; the GPU sample carries the host side
        host = {**self._host_fields(), "other_processes": self._machine.last if scan_due else None}
        for ordinal, handle in self._handles:
            device = f"cuda:{ordinal}"
            mig = ordinal in self._mig
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util = _unless_unsupported(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)  # None on MIG
                power_mw = _unless_unsupported(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
                sm_clock = _unless_unsupported(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
                limits = _clock_limits(nvml, handle)
                energy_mj = None if mig else _unless_unsupported(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption,
                                                                 handle)
                activity = self._read_gpm(ordinal, device)
                readings.append(
                    TelemetrySample(
                        t=t,
                        source="nvml",
                        util_pct=None if util is None else float(util.gpu),
                        mem_used_bytes=int(memory.used),
                        mem_total_bytes=int(memory.total),
                        power_w=None if power_mw is None else power_mw / 1000.0,
                        sm_clock_mhz=None if sm_clock is None else float(sm_clock),
                        clock_limits=limits,
                        device=device,
                        energy_j=None if energy_mj is None else energy_mj / 1000.0,
                        energy_scope="mig" if mig else "gpu",
                        **activity,
                        **host,
                    )
                )
            except nvml.NVMLError as exc:
                self._record(f"{device}: {_describe(exc)}")
        return readings

    def _read_gpm(self, ordinal: int, device: str) -> dict[str, float | None]:
        """The GPU's GPM metrics since the last tick, or nothing where it has no reader; a reader that fails is
        dropped (said once in ``errors``), so a GPU without them costs no call a tick."""
        reader = self._gpm.get(ordinal)
        if reader is None:
            return {}
        try:
            return reader.read()
        except self._nvml.NVMLError as exc:
            self._record(f"{device}: GPM metrics stopped ({_describe(exc)}); utilisation still read")
            self._gpm.pop(ordinal).close()
            return {}

    def _read_psutil(self, t: float) -> list[TelemetrySample]:
        """One sample for the watched processes and all their descendants, or none before any has a rate.

        Each process's CPU use is its time since the previous tick (:class:`CpuRates`), one ``/proc/<pid>/stat``
        read a tick. A process's first reading only primes it: it is left out of that tick's CPU sum (its RSS
        still counts) rather than adding a meaningless 0, and a tick where no process has a rate yet emits no
        sample at all. RSS is summed per process, so pages shared by forked DataLoader workers count once per
        worker: an upper bound on what the workers hold. Once a second (and when a pid is watched) every
        process on the machine is read once (:meth:`_scan`): the family as it is, and who else used the CPU; between
        scans a process forked by a family member joins at the next tick (:func:`children_below`).
        """
        with self._lock:
            pending, self._pending = self._pending, set()
        for pid in pending:
            stat = proc_stat(pid)
            if stat is not None:
                self._roots[pid] = stat.started
        others = self._scan() if pending or time.monotonic() >= self._scan_due else None
        self._family |= children_below(self._family)  # DataLoader workers join as soon as they are forked
        cpu_pct, loader_pct, rss, rated = 0.0, 0.0, 0, False
        now = time.monotonic()
        for pid in self._family:
            stat = proc_stat(pid)
            if stat is None:
                continue
            rss += stat.rss_bytes
            pct = self._rates.update(pid, stat, now)
            if pct is not None:
                cpu_pct += pct
                loader_pct += 0.0 if pid in self._roots else pct  # descendants of a rank: its loader workers
                rated = True
        self._rates.keep(self._family)
        self._loader_pct = loader_pct / self._cpus if rated else None
        self._workers_pct = cpu_pct / self._cpus if rated else None
        energy_j = self._read_rapl()  # every tick, rated or not, so no counter wraps twice unseen
        if not rated:
            return []
        return [
            TelemetrySample(
                t=t,
                source="psutil",
                util_pct=cpu_pct / self._cpus,
                mem_used_bytes=rss,
                mem_total_bytes=self._mem_total,
                device="cpu",
                energy_j=energy_j,
                energy_scope=None if self._rapl is None else "cpu_package",
                **self._host_fields(others),
            )
        ]

    def _read_rapl(self) -> float | None:
        """The CPU packages' energy in joules since the sampler was made, or None (no RAPL, a failed read)."""
        if self._rapl is None:
            return None
        try:
            return self._rapl.read_j()
        except (OSError, ValueError) as exc:
            self._record(f"RAPL: {_describe(exc)}")
            return None

    def _scan(self) -> dict[str, float] | None:
        """Read every process on the machine once: the roots that are gone leave, the family is the roots and
        their descendants now, and the rest is who else used the CPU since the last scan (% of one core by
        program; None at the first scan). A few ms for a hundred processes, every ``MACHINE_SCAN_S``."""
        self._scan_due = time.monotonic() + MACHINE_SCAN_S
        stats = all_proc_stats()
        self._roots = {pid: started for pid, started in self._roots.items()
                       if pid in stats and stats[pid].started == started}
        self._family = descendants(set(self._roots), stats)
        return self._machine.read(stats, self._family)

    def _host_fields(self, others: dict[str, float] | None = None) -> dict[str, Any]:
        """What ``top -H`` / ``iostat`` would show: per-core use, I/O wait, the loader workers' share; the caller's
        own share every tick, and once a second who else used the CPU."""
        host_pct, per_core_pct, iowait_pct = self._host_cpu.read()
        caller = proc_stat(self._caller_pid)
        caller_pct = self._rates.update(-self._caller_pid, caller, time.monotonic()) if caller else None
        return {
            "host_util_pct": host_pct,
            "cpu_per_core_pct": per_core_pct,
            "iowait_pct": iowait_pct,
            "loader_util_pct": self._loader_pct,
            "workers_util_pct": self._workers_pct,
            "caller_util_pct": None if caller_pct is None else caller_pct / self._cpus,
            "other_processes": others,
        }

    def _record(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of a process, read in one ``read``."""

    ppid: int
    started: int  # clock ticks after boot: with the pid, who the process is (pids are recycled)
    cpu_s: float  # user + system time so far
    rss_bytes: int


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None when it is gone (or this is no Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            line = fh.read()
    except OSError:
        return None
    fields = line[line.rfind(b")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces
    return ProcStat(int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / _TICKS,
                    int(fields[21]) * _PAGE)


def all_proc_stats() -> dict[int, ProcStat]:
    """Every process on the machine that could be read."""
    stats = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit() and (stat := proc_stat(int(name))) is not None:
            stats[int(name)] = stat
    return stats


def children_below(pids: set[int]) -> set[int]:
    """The children of ``pids``, and theirs, as each process's main thread lists them (where a process forks its
    DataLoader workers); empty where /proc cannot say. Cheap enough for every tick, unlike a scan of the machine."""
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                children = {int(child) for child in fh.read().split()}
        except OSError:
            continue
        todo.extend(children - found - pids)
        found |= children
    return found - pids


def descendants(roots: set[int], stats: dict[int, ProcStat]) -> set[int]:
    """``roots`` and every process below them, by the parent pids in ``stats``."""
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat.ppid, []).append(pid)
    family, todo = set(), [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        if pid not in family:
            family.add(pid)
            todo.extend(children.get(pid, ()))
    return family


class CpuRates:
    """Each process's CPU use between two readings, in % of one core; a process's first reading primes it."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, float, float]] = {}  # key -> (start time, CPU seconds, monotonic time)

    def update(self, key: int, stat: ProcStat, now: float) -> float | None:
        last = self._last.get(key)
        self._last[key] = (stat.started, stat.cpu_s, now)
        if last is None or last[0] != stat.started or now <= last[2]:
            return None
        return max(0.0, 100.0 * (stat.cpu_s - last[1]) / (now - last[2]))

    def keep(self, pids: set[int]) -> None:
        """Forget the processes that left (keys below zero are not processes of the family)."""
        self._last = {key: value for key, value in self._last.items() if key < 0 or key in pids}


_PYTHON_PROGRAMS = {"jupyterlab": "jupyter-server", "jupyter_server": "jupyter-server", "notebook": "jupyter-server",
                    "jupyter-lab": "jupyter-server", "jupyter-notebook": "jupyter-server",
                    "ipykernel_launcher": "ipykernel", "ipykernel": "ipykernel"}


_CALLER_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def program_label(name: str, cmdline: Sequence[str]) -> str:
    """What ``top`` would call a process, made readable: Python processes by the module or script they run
    (``python -m jupyterlab`` is the Jupyter server), a browser's helpers by the browser's name."""
    base = os.path.basename(cmdline[0]) if cmdline else name
    if base.startswith(("chrome", "chromium")) or name.startswith(("chrome", "chromium")):
        return "chromium"
    if name in _PYTHON_PROGRAMS:
        return _PYTHON_PROGRAMS[name]
    if not (name.startswith("python") or base.startswith("python")):
        return name
    arguments = iter(cmdline[1:])
    for argument in arguments:
        if argument in ("-m", "-c"):
            module = next(arguments, "").split(".")[0] if argument == "-m" else ""
            return _PYTHON_PROGRAMS.get(module, f"python -m {module}" if module else "python -c")
        if argument in ("-W", "-X", "-Q"):  # options that take a value
            next(arguments, None)
        elif not argument.startswith("-"):
            stem = os.path.splitext(os.path.basename(argument))[0]
            return _PYTHON_PROGRAMS.get(stem, f"python {os.path.basename(argument)}")
    return name


class MachineLoad:
    """Which programs used the CPU between two scans, in % of one core, by :func:`program_label`.

    Fed the scan of every process that the sampler makes once a second. The burst's own processes are left
    out, and so are the caller (reported on its own) and multiprocessing's helper processes that serve it (the
    forkserver the ranks come from, the resource tracker). A process seen for the first time is primed, not
    counted; its label is read once (its ``comm`` and command line).
    """

    def __init__(self, caller_pid: int) -> None:
        self._caller_pid = caller_pid
        self._seen: dict[int, tuple[int, str, float]] = {}  # pid -> (start time, label, CPU seconds)
        self._last_at: float | None = None
        self.last: dict[str, float] | None = None  # the last scan's reading

    def read(self, stats: dict[int, ProcStat], exclude: set[int]) -> dict[str, float] | None:
        now = time.monotonic()
        elapsed = None if self._last_at is None else now - self._last_at
        self._last_at = now
        used: dict[str, float] = {}
        seen: dict[int, tuple[int, str, float]] = {}
        for pid, stat in stats.items():
            if pid in exclude or pid == self._caller_pid:
                continue
            before = self._seen.get(pid)
            same = before is not None and before[0] == stat.started
            label = before[1] if same and before is not None else self._label(pid, stat.ppid)
            seen[pid] = (stat.started, label, stat.cpu_s)
            if label and same and before is not None:
                used[label] = used.get(label, 0.0) + max(0.0, stat.cpu_s - before[2])
        self._seen = seen
        self.last = None if not elapsed else {
            label: round(100.0 * seconds / elapsed, 1) for label, seconds in used.items() if seconds > 0}
        return self.last

    def _label(self, pid: int, ppid: int) -> str:
        """The program's label; "" (never counted) for the multiprocessing helpers that serve the caller."""
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = [part.decode(errors="replace") for part in fh.read().split(b"\0") if part]
        except OSError:
            return "?"
        if ppid == self._caller_pid and any(helper in " ".join(cmdline) for helper in _CALLER_HELPERS):
            return ""
        return program_label(name, cmdline)


class HostCpu:
    """The machine's CPU use since the previous reading, from one snapshot of every core's times.

    ``psutil.cpu_percent``, its per-core form and ``cpu_times_percent`` each read ``/proc/stat`` again;
    this reads it once a tick (each read is time the sampler takes from cores that train).
    """

    def __init__(self) -> None:
        self._last: list[Any] | None = None

    def read(self) -> tuple[float | None, list[float] | None, float | None]:
        """``(whole machine %, each core %, I/O wait %)`` since the last call; Nones on the first."""
        now = psutil.cpu_times(percpu=True)
        last, self._last = self._last, now
        if last is None or len(last) != len(now):
            return None, None, None
        cores = [_core_delta(before, after) for before, after in zip(last, now, strict=True)]
        busy, elapsed, iowait = (sum(column) for column in zip(*cores, strict=True))
        return (_share(busy, elapsed), [_share(core_busy, core_elapsed) for core_busy, core_elapsed, _ in cores],
                _share(iowait, elapsed))


def _core_delta(before: Any, after: Any) -> tuple[float, float, float]:
    """One core's busy, elapsed and I/O-wait seconds between two readings."""
    busy, elapsed, iowait = (now - then for now, then in zip(_counted(after), _counted(before), strict=True))
    return busy, elapsed, iowait


def _counted(times: Any) -> tuple[float, float, float]:
    """A core's busy, total and I/O-wait seconds so far, as psutil counts them (guest time is already in user
    time; I/O wait is idle)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    iowait = getattr(times, "iowait", 0.0)
    return total - times.idle - iowait, total, iowait


def _share(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole``, clipped to 0-100 (counters read a moment apart can overshoot)."""
    return 0.0 if whole <= 0 else min(100.0, max(0.0, 100.0 * part / whole))


#: The GPM metrics sampled beside utilisation, by the telemetry field each fills, as pynvml names their ids.
GPM_METRICS = {
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",  # share of SMs busy, averaged over the interval (DCGM's SM active)
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",  # resident warps against the SMs' maximum
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",  # share of time the tensor cores were busy
    "dram_bw_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",  # DRAM bandwidth used against its peak
}


class GpmReader:
    """One GPU's GPM metrics over the interval between two reads: it keeps the last GPM sample and, at each read,
    takes the next and asks NVML for the metrics between them (two samples, reused in turn, freed by :meth:`close`).
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self._ids = [getattr(nvml, name) for name in GPM_METRICS.values()]
        self._samples = [nvml.nvmlGpmSampleAlloc()]
        try:
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            nvml.nvmlGpmSampleGet(handle, self._samples[0])
        except nvml.NVMLError:
            self.close()
            raise

    @classmethod
    def open(cls, nvml: Any, handle: Any) -> GpmReader | None:
        """A reader where this GPU and this pynvml have GPM (Hopper and newer, nvidia-ml-py 11.525 on); None where
        either has not: utilisation is then what there is."""
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport") or not all(hasattr(nvml, n) for n in GPM_METRICS.values()):
            return None
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None
            return cls(nvml, handle)
        except nvml.NVMLError:
            return None

    def read(self) -> dict[str, float | None]:
        """The metrics since the previous read, in %; a metric NVML could not compute is None."""
        nvml = self._nvml
        previous, current = self._samples
        nvml.nvmlGpmSampleGet(self._handle, current)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._ids)
        request.sample1, request.sample2 = previous, current
        for index, metric in enumerate(self._ids):
            request.metrics[index].metricId = metric
        nvml.nvmlGpmMetricsGet(request)
        self._samples = [current, previous]
        return {field: float(request.metrics[index].value) if request.metrics[index].nvmlReturn == nvml.NVML_SUCCESS
                else None for index, field in enumerate(GPM_METRICS)}

    def close(self) -> None:
        for sample in self._samples:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(sample)
        self._samples = []


def _handle(nvml: Any, key: int | str) -> Any:
    """An NVML handle from a UUID (``GPU-...`` or ``MIG-...``) or an NVML index."""
    return nvml.nvmlDeviceGetHandleByUUID(key) if isinstance(key, str) else nvml.nvmlDeviceGetHandleByIndex(key)


def _unless_unsupported(nvml: Any, read: Callable[..., Any], *args: Any) -> Any | None:
    """``read(*args)``, or None where this GPU does not report the quantity (power/clocks on some boards,
    utilisation on a MIG device)."""
    try:
        return read(*args)
    except nvml.NVMLError_NotSupported:
        return None


#: NVML's clock event reasons (``nvmlClocksEventReason*``, formerly "throttle reasons") that slow a running step, by
#: bit: idle, application clocks, sync boost and the display clock say nothing about a burst's speed and are left out.
CLOCK_LIMITS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "software thermal", 0x40: "hardware thermal",
                0x80: "power brake"}


def _clock_limits(nvml: Any, handle: Any) -> tuple[str, ...] | None:
    """The reasons NVML gives for holding the GPU's clocks down now, named; None where it cannot say (pynvml
    names the call ``ClocksEventReasons`` since 12.2 and ``ClocksThrottleReasons`` before)."""
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    if read is None:
        return None
    mask = _unless_unsupported(nvml, read, handle)
    if mask is None:
        return None
    return tuple(name for bit, name in CLOCK_LIMITS.items() if int(mask) & bit)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
