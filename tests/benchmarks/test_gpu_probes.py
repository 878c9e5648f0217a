"""The second run's probes on the CPU: their plan for an H200, the runner that gives each its own process and
timeout, and the probes a CPU can answer (the GPU ones say so and skip)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.benchmark_scripts import load_benchmark

gp = load_benchmark("gpu_probes")


def test_the_dry_run_plans_every_probe_within_its_share_of_the_second_run():
    run = subprocess.run([sys.executable, str(gp.ROOT / "benchmarks" / "gpu_probes.py"), "--dry-run"], cwd=gp.ROOT,
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHONPATH": str(gp.ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "budget 85 s of the second run's 280 s" in run.stdout
    assert "ends at 67 s of 85 s (18 s to spare); skipped: nothing" in run.stdout
    assert [name for name in gp.PROBES] == ["is_available before import", "expandable segments",
                                           "reduce-overhead own loss", "bf16 matmul ceiling", "shm and ram"]
    assert gp.planned_total_s() == 67.0


def test_a_gpu_probe_on_a_cpu_answers_from_its_own_process_that_it_skips():
    found = gp.run_probe("bf16 matmul ceiling", 60.0, gp.child_environment())
    assert found["status"] == "SKIP" and found["message"] == "no CUDA GPU" and found["seconds"] > 0
    assert gp.ANSWER in found["output_tail"]


def test_a_probe_that_does_not_answer_in_time_is_killed_and_fails():
    found = gp.run_probe("expandable segments", 0.3, gp.child_environment())  # importing torch takes longer
    assert found == {**found, "status": "FAIL", "message": "no answer within 0 s (killed)"}
    assert found["seconds"] < 10


def test_is_available_before_the_import_then_a_burst_trains(monkeypatch):
    """On this CPU is_available() loads no driver; the probe's burst must still train from that order of imports."""
    found = gp.run_probe("is_available before import", 90.0, gp.child_environment())
    assert found["status"] == "PASS", found
    assert found["cuda_available"] is False and found["message"].startswith("3 steps on ")


def test_the_probes_get_the_users_environment_not_the_planners_switch(monkeypatch):
    monkeypatch.setenv("ACCEL_WIDGETS_PRESTART", "0")
    monkeypatch.setenv("_GPU_PROBES_SET_PRESTART", "1")
    env = gp.child_environment()
    assert "ACCEL_WIDGETS_PRESTART" not in env and "_GPU_PROBES_SET_PRESTART" not in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(gp.ROOT)
    monkeypatch.delenv("_GPU_PROBES_SET_PRESTART")
    assert gp.child_environment()["ACCEL_WIDGETS_PRESTART"] == "0"  # the user's own setting stays


@pytest.mark.parametrize(("log", "expected"), [
    ("noise\nPROBE-ANSWER {\"status\": \"PASS\"}\n", {"status": "PASS"}),
    ("PROBE-ANSWER {\"status\": \"FAIL\"}\nPROBE-ANSWER {\"status\": \"INFO\", \"tflops\": 781.5}\n",
     {"status": "INFO", "tflops": 781.5}),
    ("Segmentation fault\n", None),
])
def test_a_probes_answer_is_its_last_answer_line(log, expected):
    assert gp.read_answer(log) == expected
