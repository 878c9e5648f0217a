"""Background device/host telemetry for a burst, sampled in the parent process while workers train.

The sampler runs in the notebook kernel, which must stay CUDA-free so it can still launch DDP workers:
GPUs are read through NVML (``pynvml`` never creates a CUDA context) and, where there is no usable GPU,
the workers' CPU and memory use is read through psutil. Timestamps are ``time.perf_counter()`` minus the
burst's ``clock_origin``; on Linux perf_counter is CLOCK_MONOTONIC, shared by every process on the
machine, so samples line up with the step events the workers stamp on the same clock.

Energy rides along as raw readings: each GPU sample carries NVML's total energy counter (Volta and newer)
and its power, each CPU sample the RAPL packages' counter where it is readable; the result turns them into
joules over its measured window (:mod:`accel_widgets.energy`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import psutil

from ..device import usable_cpu_count
from ..energy import POWERCAP, RaplCounter
from ..results import TelemetrySample

THREAD_NAME = "accel-widgets-telemetry"

FAMILY_REFRESH_S = 1.0  # new DataLoader workers are picked up within this long
ATTRIBUTION_INTERVAL_S = 1.0  # who else used the CPU: every process on the machine is read this often
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess


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
    cannot grow the list at 10 Hz for a whole burst) and sampling goes on: telemetry must never end a
    burst. ``errors`` also says why NVML was not used when GPUs were asked for.
    """

    def __init__(
        self,
        *,
        clock_origin: float,
        gpus: Sequence[tuple[int, int | str]] = (),
        interval_s: float = 0.1,
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
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # psutil state. Pids handed to watch() wait in _pending until the sampler thread opens them, so
        # every psutil.Process is created and read on that one thread.
        self._pending: set[int] = set()
        self._roots: dict[int, psutil.Process] = {}
        self._known: dict[int, psutil.Process] = {}
        self._loader_pct: float | None = None
        self._family: dict[int, psutil.Process] = {}
        self._family_due = 0.0
        self._cpus = usable_cpu_count()  # psutil's percent is per core; 100% must mean all usable cores
        self._host_cpu = HostCpu()
        self._caller = _CallerCpu(os.getpid() if caller_pid is None else caller_pid, self._cpus)
        self._machine = MachineLoad(self._caller.pid)
        self._attribution_due = 0.0
        self._workers_pct: float | None = None
        self._mem_total = int(psutil.virtual_memory().total)
        # NVML state: a module with NVML open, and the (CUDA ordinal, handle) pairs to read.
        self._nvml: Any | None = None
        self._handles: list[tuple[int, Any]] = []
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
        self._host_cpu.read()  # primes them: a first reading has nothing to compare with
        self._caller.read()
        self._machine.read(set())
        self._attribution_due = time.monotonic() + ATTRIBUTION_INTERVAL_S
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> list[TelemetrySample]:
        """Stop, wait for the thread to end, release NVML and return the samples. Idempotent.

        The join has no timeout on purpose: callers rely on no sampler thread touching NVML or the
        samples once this returns.
        """
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
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
        return True

    # -- sampler thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop_event.is_set():
            try:
                self._tick()
            except Exception as exc:
                self._record(_describe(exc))
            next_tick += self._interval
            now = time.monotonic()
            next_tick = max(next_tick, now)
            if self._stop_event.wait(next_tick - now):
                break

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
        self._read_psutil(t)  # refreshes the loader workers' share; the GPU sample carries the host side
        host = self._host_fields()
        for ordinal, handle in self._handles:
            device = f"cuda:{ordinal}"
            mig = ordinal in self._mig
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util = _unless_unsupported(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)  # None on MIG
                power_mw = _unless_unsupported(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
                sm_clock = _unless_unsupported(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
                energy_mj = None if mig else _unless_unsupported(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption,
                                                                 handle)
                readings.append(
                    TelemetrySample(
                        t=t,
                        source="nvml",
                        util_pct=None if util is None else float(util.gpu),
                        mem_used_bytes=int(memory.used),
                        mem_total_bytes=int(memory.total),
                        power_w=None if power_mw is None else power_mw / 1000.0,
                        sm_clock_mhz=None if sm_clock is None else float(sm_clock),
                        device=device,
                        energy_j=None if energy_mj is None else energy_mj / 1000.0,
                        energy_scope="mig" if mig else "gpu",
                        **host,
                    )
                )
            except nvml.NVMLError as exc:
                self._record(f"{device}: {_describe(exc)}")
        return readings

    def _read_psutil(self, t: float) -> list[TelemetrySample]:
        """One sample for the watched processes and all their descendants, or none before any has a rate.

        ``cpu_percent`` reports use since the previous call on the same ``psutil.Process``, so objects are
        kept across ticks, keyed by pid and checked against the creation time so a recycled pid counts as
        a new process. A process's first reading only primes it: it is left out of that tick's CPU sum
        (its RSS still counts) rather than adding a meaningless 0, and a tick where no process has a
        rate yet emits no sample at all. Cost: up to one interval of a new process's CPU use goes
        unreported. RSS is summed per process, so pages shared by forked DataLoader workers count once
        per worker: an upper bound on what the workers hold.
        """
        with self._lock:
            pending, self._pending = self._pending, set()
        for pid in pending:
            with contextlib.suppress(*_GONE):
                self._roots[pid] = psutil.Process(pid)
        if pending or time.monotonic() >= self._family_due:
            self._family = self._walk_family()
            self._family_due = time.monotonic() + FAMILY_REFRESH_S
        family = self._family

        cpu_pct, loader_pct, rss, rated = 0.0, 0.0, 0, False
        known: dict[int, psutil.Process] = {}
        for pid, proc in family.items():
            cached = self._known.get(pid)
            primed = cached is not None and cached == proc
            if primed:
                proc = cached
            try:
                pct = proc.cpu_percent(interval=None)
                rss += proc.memory_info().rss
            except _GONE:
                continue
            known[pid] = proc
            if primed:
                cpu_pct += pct
                loader_pct += 0.0 if pid in self._roots else pct  # descendants of a rank: its loader workers
                rated = True
        self._known = known
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
                **self._host_fields(),
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

    def _walk_family(self) -> dict[int, psutil.Process]:
        """The watched ranks and all their descendants (DataLoader workers).

        Listing descendants scans every process on the machine (~1.5 ms of CPU): on a 2-core machine
        whose cores the ranks' threads fill, that stalls training. So it runs when a rank is added and
        then once per ``FAMILY_REFRESH_S``, not on every tick.
        """
        family: dict[int, psutil.Process] = {}
        for pid, root in list(self._roots.items()):
            try:
                if not root.is_running():  # exited and reaped, its pid maybe reused
                    raise psutil.NoSuchProcess(pid)
                members = [root, *root.children(recursive=True)]
            except _GONE:
                del self._roots[pid]
                continue
            for proc in members:
                family.setdefault(proc.pid, proc)
        return family

    def _host_fields(self) -> dict[str, Any]:
        """What ``top -H`` / ``iostat`` would show: per-core use, I/O wait, the loader workers' share; the caller's
        own share every tick, and once per ``ATTRIBUTION_INTERVAL_S`` who else used the CPU."""
        host_pct, per_core_pct, iowait_pct = self._host_cpu.read()
        return {
            "host_util_pct": host_pct,
            "cpu_per_core_pct": per_core_pct,
            "iowait_pct": iowait_pct,
            "loader_util_pct": self._loader_pct,
            "workers_util_pct": self._workers_pct,
            "caller_util_pct": self._caller.read(),
            "other_processes": self._attribute(),
        }

    def _attribute(self) -> dict[str, float] | None:
        """Every other program's CPU since the last attribution, in % of one core (the burst's own processes and
        the caller's excluded); None between attributions."""
        now = time.monotonic()
        if now < self._attribution_due:
            return None
        self._attribution_due = now + ATTRIBUTION_INTERVAL_S
        return self._machine.read(set(self._family))

    def _record(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)


class _CallerCpu:
    """The launching process's own CPU (the kernel: its pump, this sampler, a panel's rendering), % of the machine.

    One ``cpu_times`` of one process per tick: the burst's cost in the caller, told apart from other programs.
    """

    def __init__(self, pid: int, cpus: int) -> None:
        self.pid, self._cpus = pid, cpus
        self._process: psutil.Process | None = None
        with contextlib.suppress(*_GONE):
            self._process = psutil.Process(pid)
        self._last: tuple[float, float] | None = None

    def read(self) -> float | None:
        if self._process is None:
            return None
        try:
            times = self._process.cpu_times()
        except _GONE:
            return None
        now = (time.monotonic(), times.user + times.system)
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None
        return _share(now[1] - last[1], (now[0] - last[0]) * self._cpus)


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
    """Which programs used the CPU between two readings, in % of one core, by :func:`program_label`.

    Reads every process's CPU times (one ``/proc/<pid>/stat`` each: ~1.5 ms for a couple of hundred processes,
    so it runs once a second, not per tick). The burst's own processes are left out, and so are the caller
    (reported on its own) and multiprocessing's helper processes that serve it (the forkserver the ranks come
    from, the resource tracker). A process seen for the first time is primed, not counted.
    """

    def __init__(self, caller_pid: int) -> None:
        self._caller_pid = caller_pid
        self._seen: dict[int, tuple[float, str, float]] = {}  # pid -> (create time, label, CPU seconds)
        self._last_at: float | None = None

    def read(self, exclude: set[int]) -> dict[str, float] | None:
        now = time.monotonic()
        elapsed = None if self._last_at is None else now - self._last_at
        self._last_at = now
        used: dict[str, float] = {}
        seen: dict[int, tuple[float, str, float]] = {}
        for proc in psutil.process_iter(["ppid", "create_time", "cpu_times"]):
            info = proc.info
            times, created = info.get("cpu_times"), info.get("create_time")
            if times is None or created is None or proc.pid in exclude or proc.pid == self._caller_pid:
                continue
            before = self._seen.get(proc.pid)
            label = before[1] if before is not None and before[0] == created else self._label(proc, info["ppid"])
            cpu = times.user + times.system
            seen[proc.pid] = (created, label, cpu)
            if label and before is not None and before[0] == created:
                used[label] = used.get(label, 0.0) + max(0.0, cpu - before[2])
        self._seen = seen
        if not elapsed:
            return None
        return {label: round(100.0 * seconds / elapsed, 1) for label, seconds in used.items() if seconds > 0}

    def _label(self, proc: psutil.Process, ppid: int | None) -> str:
        """The program's label; "" (never counted) for the multiprocessing helpers that serve the caller."""
        try:
            cmdline = proc.cmdline()
            name = proc.name()
        except _GONE:
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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
