"""What a GPU call records beside its own work: the host's memory (/dev/shm and MemTotal), an environment file, and
``nvidia-smi dmon``'s readings taken on the side, compared with the package's own NVML telemetry.

The lent H200 machine is a VM whose RAM starts small and grows as it is used, and whose /dev/shm (where DataLoader
workers hand their batches over) has a size of its own: a call that fails for memory needs both numbers from its
start. ``nvidia-smi dmon`` reads the same NVML counters through another program, once a second: where the package's
utilisation or energy disagrees with it, the package's reading (its window, its averaging) is what to look at.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

#: ``-s pucm``: power and temperatures, utilisation (sm, mem, enc, dec), clocks, frame-buffer memory; ``-o DT``: each
#: row stamped with the date and time it was printed; one row per GPU a second.
DMON_COMMAND = ("nvidia-smi", "dmon", "-s", "pucm", "-o", "DT", "-d", "1")
DMON_FILE, ENVIRONMENT_FILE = "dmon.txt", "environment.txt"
#: What the environment file holds, each command's output under its own header (each at most COMMAND_TIMEOUT_S).
ENVIRONMENT_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("nvidia-smi",),
    ("nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE,MEMORY,COMPUTE"),
    (sys.executable, "-m", "pip", "list"),
    ("df", "-h", "/dev/shm", "/tmp"),
    ("cat", "/proc/meminfo"),
    ("nproc",),
    ("uname", "-a"),
)
COMMAND_TIMEOUT_S = 20.0
ENVIRONMENT_PREFIXES = ("CUDA_", "PYTORCH_", "NCCL_", "NVIDIA_", "TORCH", "OMP_", "ACCEL_WIDGETS_")


# -- the host's memory ------------------------------------------------------------------------------------------------
def host_memory(meminfo: Path = Path("/proc/meminfo"), shm: Path = Path("/dev/shm")) -> dict[str, int | None]:
    """MemTotal and MemAvailable (bytes) as the kernel says now, and /dev/shm's size and free bytes; None for what
    cannot be read here."""
    found: dict[str, int | None] = {"mem_total_bytes": None, "mem_available_bytes": None}
    with contextlib.suppress(OSError):
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            key = {"MemTotal": "mem_total_bytes", "MemAvailable": "mem_available_bytes"}.get(name)
            if key is not None and value.split():
                found[key] = int(value.split()[0]) * 1024  # the kernel counts kB
    try:
        usage = shutil.disk_usage(shm)
        found |= {"shm_total_bytes": usage.total, "shm_free_bytes": usage.free}
    except OSError:
        found |= {"shm_total_bytes": None, "shm_free_bytes": None}
    return found


# -- the environment file ---------------------------------------------------------------------------------------------
def write_environment_file(path: Path, commands: Sequence[Sequence[str]] = ENVIRONMENT_COMMANDS,
                           timeout_s: float = COMMAND_TIMEOUT_S) -> None:
    """Each command's output (or why there is none) under ``$ command``, then the environment variables that steer
    CUDA, torch, NCCL and threads: what a result needs to be read on another day."""
    parts = []
    for command in commands:
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
            exit_note = "" if done.returncode == 0 else f"\n(exit {done.returncode})"
            text = (done.stdout + done.stderr).rstrip() + exit_note
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"({type(exc).__name__}: {exc})"
        parts.append(f"$ {' '.join(command)}\n{text}\n")
    variables = sorted(f"{name}={value}" for name, value in os.environ.items() if name.startswith(ENVIRONMENT_PREFIXES))
    parts.append("$ env (CUDA, torch, NCCL, threads)\n" + "\n".join(variables) + "\n")
    path.write_text("\n".join(parts))


# -- nvidia-smi dmon --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DmonRow:
    """One GPU's line of ``nvidia-smi dmon -o DT``: when it was printed (seconds since the epoch, this machine's
    clock), the GPU's NVML index, and its columns by dmon's names ("sm" %, "pwr" W, "fb" MB; None for "-")."""

    wall: float
    gpu: int
    values: dict[str, float | None]


def parse_dmon(text: str) -> list[DmonRow]:
    """The rows of a dmon log, by the names of the header line above them (dmon repeats its header; the columns
    depend on the driver and on ``-s``)."""
    rows, names = [], []
    for line in text.splitlines():
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if "gpu" in tokens:
                names = tokens
            continue
        tokens = line.split()
        if not names or len(tokens) != len(names) or "Date" not in names or "Time" not in names:
            continue
        try:
            wall = time.mktime(time.strptime(f"{tokens[names.index('Date')]} {tokens[names.index('Time')]}",
                                             "%Y%m%d %H:%M:%S"))
            gpu = int(tokens[names.index("gpu")])
        except ValueError:
            continue
        values = {name: _number(token) for name, token in zip(names, tokens, strict=True)
                  if name not in ("Date", "Time", "gpu")}
        rows.append(DmonRow(wall, gpu, values))
    return rows


def _number(token: str) -> float | None:
    return float(token) if re.fullmatch(r"-?\d+(\.\d+)?", token) else None


def compare_with_dmon(result: Any, wall_origin: float, rows: Sequence[DmonRow], gpu: int = 0) -> dict[str, Any] | None:
    """NVML utilisation and energy over a burst's measured window, as the package read them, beside what dmon printed
    for GPU ``gpu`` over the same seconds (``wall_origin``: this machine's clock when the burst's clock read 0). Each
    dmon row covers the second before it was printed; rows wholly inside the window count. None when no dmon row
    does (a window under a second) or the burst has no window."""
    from accel_widgets.analysis import usage  # here: this module imports nothing of the package until a burst is read

    window = result.measured_window()
    if window is None:
        return None
    start, end = wall_origin + window[0], wall_origin + window[1]
    inside = [row for row in rows if row.gpu == gpu and start <= row.wall - 1.0 and row.wall <= end]
    if not inside:
        return None
    sm = [row.values["sm"] for row in inside if row.values.get("sm") is not None]
    power = [row.values["pwr"] for row in inside if row.values.get("pwr") is not None]
    util, energy = usage.mean_utilisation_pct(result), usage.energy(result).joules
    dmon_util = sum(sm) / len(sm) if sm else None
    dmon_energy = sum(power) / len(power) * (end - start) if power else None
    return {
        "window_s": round(end - start, 2), "dmon_rows": len(inside),
        "nvml_util_pct": util, "dmon_sm_pct": dmon_util,
        "util_gap_pts": None if util is None or dmon_util is None else round(util - dmon_util, 1),
        "nvml_energy_j": energy, "dmon_energy_j": dmon_energy,
        "energy_ratio": None if not energy or not dmon_energy else round(energy / dmon_energy, 3),
    }


class Sidecars:
    """Beside a GPU call: ``nvidia-smi dmon`` printing into ``out_dir/dmon.txt`` (when nvidia-smi is here and
    ``dmon`` is asked for) and the environment file written on a thread, both started on entry and ended on exit,
    however the call ends: dmon's process group is killed, the thread joined."""

    def __init__(self, out_dir: Path, *, dmon: bool = True, environment: bool = True,
                 commands: Sequence[Sequence[str]] = ENVIRONMENT_COMMANDS) -> None:
        self.dmon_path, self.environment_path = out_dir / DMON_FILE, out_dir / ENVIRONMENT_FILE
        self._want_dmon = dmon and shutil.which(DMON_COMMAND[0]) is not None
        self._thread = threading.Thread(target=write_environment_file, args=(self.environment_path, commands),
                                        name="gpu-call-environment", daemon=True) if environment else None
        self._dmon: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __enter__(self) -> Sidecars:
        self.dmon_path.parent.mkdir(parents=True, exist_ok=True)
        if self._want_dmon:
            self._log = open(self.dmon_path, "wb")  # held until __exit__ closes it
            self._dmon = subprocess.Popen(DMON_COMMAND, stdout=self._log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._dmon is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._dmon.pid, signal.SIGTERM)
            try:
                self._dmon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._dmon.pid, signal.SIGKILL)
                self._dmon.wait()
            self._log.close()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=len(ENVIRONMENT_COMMANDS) * COMMAND_TIMEOUT_S)

    @property
    def dmon_started(self) -> bool:
        return self._dmon is not None

    def dmon_rows(self) -> list[DmonRow]:
        """What dmon has printed so far."""
        if not self.dmon_path.exists():
            return []
        return parse_dmon(self.dmon_path.read_text(errors="replace"))
