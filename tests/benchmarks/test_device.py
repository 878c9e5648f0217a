"""What a GPU call records beside its work (benchmarks/_device.py), on the CPU: dmon's log read and set against the
package's NVML readings at H200 values, the sidecars started and ended with a stand-in nvidia-smi, the host's memory."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark
from tests.measured import H200_FP32_ACTIVITY, h200_result

device = load_benchmark("_device")

#: ``nvidia-smi dmon -s pucm -o DT`` on one H200 under a training step (driver 580's columns), header repeated.
HEADER = ("# Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk"
          "     fb   bar1   ccpm\n"
          "# YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      %      %    MHz    MHz"
          "     MB     MB     MB\n")


def dmon_line(wall: float, sm: float, power: float, gpu: int = 0) -> str:
    stamp = time.strftime("%Y%m%d   %H:%M:%S", time.localtime(wall))
    return (f" {stamp}   {gpu:>4}  {power:>5.0f}     41     48  {sm:>5.0f}     37      0      0      -      -   3201"
            f"   1980  61440      4      0\n")


def test_dmon_rows_are_read_by_their_headers_names():
    start = 1_800_000_000.0
    text = HEADER + dmon_line(start, 0, 76) + HEADER + dmon_line(start + 1, 98, 655) + "garbage line\n"
    rows = device.parse_dmon(text)
    assert [(row.wall, row.gpu, row.values["sm"], row.values["pwr"]) for row in rows] == [
        (start, 0, 0.0, 76.0), (start + 1, 0, 98.0, 655.0)]
    assert rows[1].values["jpg"] is None and rows[1].values["fb"] == 61440.0 and rows[1].values["pclk"] == 1980.0


def test_a_burst_is_set_against_the_dmon_rows_wholly_inside_its_measured_window():
    """The H200 burst: measured from 1.15 s to 4.15 s on its clock, NVML at 98% and 650 W; dmon printed 97% and
    640 W each second. Rows that reach outside the window (warm-up at 76 W) are left out."""
    result = h200_result(activity=H200_FP32_ACTIVITY)
    origin = 1_800_000_000.0
    rows = device.parse_dmon(HEADER + "".join(
        dmon_line(origin + t, 97 if 2 <= t <= 4 else 5, 640 if 2 <= t <= 4 else 76) for t in range(0, 7)))
    compared = device.compare_with_dmon(result, origin, rows)
    assert compared["dmon_rows"] == 2  # rows printed at 3 s and 4 s cover (2, 3] and (3, 4]
    assert compared["nvml_util_pct"] == pytest.approx(98.0) and compared["dmon_sm_pct"] == pytest.approx(97.0)
    assert compared["util_gap_pts"] == pytest.approx(1.0) and compared["window_s"] == pytest.approx(3.0)
    assert compared["nvml_energy_j"] == pytest.approx(650.0 * 3.0)
    assert compared["dmon_energy_j"] == pytest.approx(640.0 * 3.0) and compared["energy_ratio"] == pytest.approx(1.016)
    assert device.compare_with_dmon(result, origin + 100, rows) is None  # dmon printed nothing then
    assert device.compare_with_dmon(result, origin, rows, gpu=1) is None


def fake_nvidia_smi(folder: Path) -> Path:
    """An ``nvidia-smi`` that prints dmon's header and a row every 0.05 s until it is killed, and its plain table."""
    script = folder / "nvidia-smi"
    header = HEADER.replace("\n", "\\n")
    script.write_text(f"""#!{sys.executable}
import sys, time
if sys.argv[1:2] != ["dmon"]:
    print("NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0")
    raise SystemExit(0)
sys.stdout.write("{header}")
while True:
    stamp = time.strftime("%Y%m%d   %H:%M:%S")
    print(f" {{stamp}}      0    650     41     48     98     37      0      0      -      -   3201   1980  61440"
          "      4      0", flush=True)
    time.sleep(0.05)
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_the_sidecars_run_dmon_and_write_the_environment_file_then_end(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    commands = (("nvidia-smi",), ("no-such-program-here",))
    with device.Sidecars(tmp_path / "out", commands=commands) as sidecars:
        time.sleep(0.5)
        assert sidecars.dmon_started
    rows = sidecars.dmon_rows()
    assert len(rows) >= 3 and {row.values["sm"] for row in rows} == {98.0}
    written = (tmp_path / "out" / "environment.txt").read_text()
    assert "$ nvidia-smi\nNVIDIA-SMI 580.159.04" in written and "$ no-such-program-here\n(FileNotFoundError" in written
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in written
    size = (tmp_path / "out" / "dmon.txt").stat().st_size
    time.sleep(0.2)
    assert (tmp_path / "out" / "dmon.txt").stat().st_size == size  # dmon is gone: nothing more is printed


def test_without_nvidia_smi_there_is_no_dmon_and_the_call_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with device.Sidecars(tmp_path / "out", environment=False) as sidecars:
        assert not sidecars.dmon_started
    assert sidecars.dmon_rows() == []


def test_the_hosts_memory_and_dev_shm(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32505856 kB\nMemFree:         1024 kB\nMemAvailable:   30408704 kB\n")
    found = device.host_memory(meminfo, shm=tmp_path)
    assert found["mem_total_bytes"] == 32505856 * 1024 and found["mem_available_bytes"] == 30408704 * 1024
    assert found["shm_total_bytes"] > 0
    missing = device.host_memory(tmp_path / "none", shm=tmp_path / "none")
    assert set(missing.values()) == {None}
