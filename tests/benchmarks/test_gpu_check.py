"""The GPU check script's pure parts, on CPU: its checks over synthetic results, its budget, its test parsing.

A lent GPU is rare and short, so a check that misjudges a result, or a budget that overruns, must be
caught here rather than on the device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from accel_widgets import BurstResult, Config, StepRecord
from accel_widgets.analysis import usage
from accel_widgets.results.burst import OperatorTime, ProfileCapture, RankSummary, TelemetrySample
from tests.benchmark_scripts import load_benchmark
from tests.measured import as_measured

gc = load_benchmark("gpu_check")
GiB = 2**30


def make_result(
    steps: list[tuple[float, float, float, float]] | None = None,
    *,
    measured_s: float | None = None,
    losses: list[float | None] | None = None,
    config: Config | None = None,
    warmup: int = 1,
    peak: int = GiB,
    memory_kind: str = "cuda_allocator",
    flops_per_sample: float | None = None,
    telemetry: list[TelemetrySample] | None = None,
    scaler_skipped: int | None = None,
    profile: ProfileCapture | None = None,
) -> BurstResult:
    """A finished one-rank CUDA burst: ``steps`` are ``(data, h2d, compute, total)`` of the measured steps."""
    steps = steps if steps is not None else [(0.001, 0.001, 0.008, 0.010)] * 10
    losses = losses if losses is not None else [1.0] * (warmup + len(steps))
    timings = [(0.0, 0.0, 0.05, 0.05)] * warmup + steps
    records, t = [], 0.0
    for i, ((data, h2d, compute, total), loss) in enumerate(zip(timings, losses, strict=True)):
        t += total
        records.append(StepRecord(0, i, t, data, h2d, compute, total, 32, loss, warmup=i < warmup))
    window = measured_s if measured_s is not None else sum(s[3] for s in steps)
    rank = RankSummary(0, 32 * len(steps), window, peak, memory_kind, 0.5, 0.2, "NVIDIA H200",
                       scaler_skipped_steps=scaler_skipped, flops_per_sample=flops_per_sample, profile=profile)
    return as_measured(BurstResult(workload="synthetic", config=config or Config(), status="ok", warmup_steps=warmup,
                                   steps=records, ranks=[rank], telemetry=telemetry or [],
                                   environment={"device_kind": "cuda", "device_name": "NVIDIA H200",
                                                "gpus": ["NVIDIA H200"]}))


def nvml_sample(device: str = "cuda:0", source: str = "nvml") -> TelemetrySample:
    return TelemetrySample(t=0.1, source=source, util_pct=90.0, mem_used_bytes=GiB, device=device,
                           mem_total_bytes=141 * GiB)


# -- timing consistency ---------------------------------------------------------------------------
def test_consistent_steps_that_tile_the_window_pass():
    ok, message = gc.check_timing(make_result())
    assert ok, message
    assert "10 steps" in message and "+0.00%" in message


def test_a_step_whose_parts_exceed_its_total_fails():
    """A clamped compute share (host data wait longer than the GPU-side step) breaks the identity."""
    steps = [(0.001, 0.001, 0.008, 0.010)] * 9 + [(0.015, 0.001, 0.0, 0.010)]
    ok, message = gc.check_step_breakdown(make_result(steps))
    assert not ok and "rank 0 step 10" in message and "60.00%" in message


def test_parts_within_one_percent_of_the_total_pass():
    ok, _ = gc.check_step_breakdown(make_result([(0.001, 0.001, 0.00805, 0.010)] * 4))
    assert ok


def test_steps_that_do_not_tile_the_window_fail_beyond_two_percent():
    steps = [(0.001, 0.001, 0.008, 0.010)] * 10  # 0.100 s of steps
    assert gc.check_window_tiling(make_result(steps, measured_s=0.1019))[0]
    ok, message = gc.check_window_tiling(make_result(steps, measured_s=0.110))
    assert not ok and "-9.09%" in message


def test_warmup_steps_are_left_out_of_the_timing():
    ok, message = gc.check_timing(make_result(warmup=3))
    assert ok and "10 steps" in message


def test_timing_without_measured_steps_fails():
    assert gc.check_timing(make_result([]))[0] is False


def test_timing_over_several_bursts_names_the_inconsistent_one():
    good, bad = make_result(), make_result(measured_s=0.2)
    ok, message = gc.check_timing_over({"probe": good, "fp16": bad})
    assert not ok and message.startswith("1 of 2 bursts inconsistent: fp16:") and "probe" not in message
    ok, message = gc.check_timing_over({"probe": good, "no-sync": good})
    assert ok and message.endswith("probe 0.00%/+0.00%, no-sync 0.00%/+0.00%")


# -- memory, MFU, telemetry -----------------------------------------------------------------------
@pytest.mark.parametrize(("peak", "kind", "ok"), [(GiB, "cuda_allocator", True), (0, "cuda_allocator", False),
                                                  (200 * GiB, "cuda_allocator", False), (GiB, "rss", False)])
def test_peak_memory_must_be_device_memory_within_the_device(peak, kind, ok):
    assert gc.check_peak_memory(make_result(peak=peak, memory_kind=kind), 141 * GiB)[0] is ok


def _flops_for_mfu(mfu: float) -> float:
    """FLOPs per sample giving ``mfu`` on an H200 in fp32 (67 TFLOP/s) at make_result's throughput."""
    samples_per_s = 32 * 10 / 0.1
    return mfu * 67e12 / samples_per_s


@pytest.mark.parametrize(("mfu", "ok"), [(0.45, True), (0.99, True), (1.3, False)])
def test_mfu_must_lie_in_zero_to_one(mfu, ok):
    result = make_result(flops_per_sample=_flops_for_mfu(mfu))
    assert usage.mfu(result) == pytest.approx(mfu)
    passed, message = gc.check_mfu(result)
    assert passed is ok and f"MFU {mfu:.1%}" in message


def test_mfu_that_cannot_be_computed_fails_and_says_why():
    ok, message = gc.check_mfu(make_result())
    assert not ok and "no FLOPs counted" in message


def test_telemetry_must_be_nvml_from_the_bursts_gpu():
    assert gc.check_telemetry(make_result(telemetry=[nvml_sample()] * 3), {"cuda:0"})[0]
    assert not gc.check_telemetry(make_result(), {"cuda:0"})[0]
    assert not gc.check_telemetry(make_result(telemetry=[nvml_sample(source="psutil")]), {"cuda:0"})[0]
    ok, message = gc.check_telemetry(make_result(telemetry=[nvml_sample(device="gpu0")]), {"cuda:0"})
    assert not ok and "devices gpu0" in message


# -- training -------------------------------------------------------------------------------------
def _losses(values: list[float]) -> BurstResult:
    return make_result([(0.001, 0.001, 0.008, 0.010)] * (len(values) - 1), losses=values)


def test_a_falling_loss_trains():
    ok, message = gc.check_trains(_losses([2.0, 1.9, 1.5, 1.6, 1.2, 1.0, 0.9, 0.8]))
    assert ok and "1.9500 -> 0.8500" in message


def test_a_flat_or_rising_loss_does_not_train():
    assert not gc.check_trains(_losses([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]))[0]


def test_a_nan_loss_or_too_few_losses_fail():
    assert not gc.check_trains(_losses([2.0, 1.0, float("nan"), 0.5]))[0]
    assert not gc.check_trains(_losses([2.0, 1.0, 0.5]))[0]


def test_losses_not_read_yet_are_skipped():
    assert gc.check_trains(_losses([2.0, None, 1.5, None, 1.0, 0.5]))[0]  # type: ignore[list-item]


def test_fp16_scaler_skips_must_stay_small():
    falling = [2.0 - 0.02 * i for i in range(60)]
    assert gc.check_trains(make_result([(0.001, 0.001, 0.008, 0.010)] * 59, losses=falling, scaler_skipped=6))[0]
    ok, message = gc.check_trains(make_result([(0.001, 0.001, 0.008, 0.010)] * 59, losses=falling,
                                              scaler_skipped=7))
    assert not ok and "scaler skipped 7 (allowed 6)" in message


def test_no_host_sync_needs_every_measured_step_on_cuda():
    assert gc.check_no_host_sync(make_result(), 10)[0]
    ok, message = gc.check_no_host_sync(make_result(), 50)
    assert not ok and "10 of 50" in message
    on_cpu = make_result()
    on_cpu.environment["device_kind"] = "cpu"
    assert not gc.check_no_host_sync(on_cpu, 10)[0]


# -- profile --------------------------------------------------------------------------------------
def _capture(tmp_path: Path, device_ms: float, kernels: int) -> ProfileCapture:
    trace = tmp_path / "trace.json"
    events = [{"name": "aten::mm", "cat": "cpu_op"}] + [{"name": "gemm", "cat": "kernel"}] * kernels
    trace.write_text(json.dumps({"traceEvents": events}))
    return ProfileCapture(3, str(trace), [OperatorTime("aten::mm", 3, 0.5, device_ms)])


def test_a_profile_with_device_time_and_kernel_events_passes(tmp_path):
    ok, message = gc.check_profile(make_result(profile=_capture(tmp_path, 1.25, 4)))
    assert ok and "1.25 ms device" in message and "4 kernel events" in message


@pytest.mark.parametrize(("device_ms", "kernels"), [(0.0, 4), (1.0, 0)])
def test_a_profile_without_device_activity_fails(tmp_path, device_ms, kernels):
    assert not gc.check_profile(make_result(profile=_capture(tmp_path, device_ms, kernels)))[0]


def test_a_missing_profile_or_trace_fails(tmp_path):
    assert not gc.check_profile(make_result())[0]
    capture = ProfileCapture(3, str(tmp_path / "gone.json"), [OperatorTime("k", 1, 0.0, 1.0)])
    ok, message = gc.check_profile(make_result(profile=capture))
    assert not ok and "missing" in message


# -- bursts and budget ----------------------------------------------------------------------------
def test_verdict_maps_how_the_burst_ended():
    always = lambda r: (True, "fine")  # noqa: E731
    assert gc.verdict(gc.BurstOutcome(make_result(), "ok"), always) == ("PASS", "fine")
    assert gc.verdict(gc.BurstOutcome(None, "skipped", "skipped: 3 s left"), always) == ("SKIP", "skipped: 3 s left")
    assert gc.verdict(gc.BurstOutcome(make_result(), "cut", "cut"), always)[0] == "SKIP"
    assert gc.verdict(gc.BurstOutcome(None, "failed", "rank 0 failed: boom"), always) == (
        "FAIL", "burst failed: rank 0 failed: boom")
    assert gc.verdict(gc.BurstOutcome(make_result(), "ok"), lambda r: (False, "bad"))[0] == "FAIL"


@pytest.mark.parametrize(("left", "cap", "floor", "keep", "expected"), [
    (300.0, 120.0, 20.0, 0.0, 120.0),   # plenty left: the cap
    (50.0, 120.0, 20.0, 0.0, 50.0),     # cut to what is left
    (15.0, 120.0, 20.0, 0.0, None),     # less than the floor: skip
    (200.0, 130.0, 30.0, 150.0, 50.0),  # what later phases need is kept back
    (170.0, 130.0, 30.0, 150.0, None),
])
def test_allot(left, cap, floor, keep, expected):
    assert gc.allot(left, cap, floor, keep) == expected


def test_budget_counts_down_on_its_clock():
    now = [100.0]
    budget = gc.Budget(330.0, clock=lambda: now[0])
    assert budget.left() == 330.0
    now[0] += 300.0
    assert budget.elapsed() == 300.0 and budget.allot(120.0, 20.0) == 30.0
    now[0] += 15.0
    assert budget.allot(120.0, 20.0) is None


def _work(name: str, planned: float, floor: float, cap: float, required: bool = False, ran: list | None = None,
          status: str = "PASS") -> gc.Work:
    def action(timeout: float) -> str:
        if ran is not None:
            ran.append((name, timeout))
        return status

    return gc.Work(name, "checks", planned, floor, cap, required, action)


def _execute(plan: list[gc.Work], total: float) -> tuple[list[gc.Step], gc.PlannedClock]:
    clock = gc.PlannedClock()
    budget = gc.Budget(total, clock=clock, started=0.0)

    def run(work: gc.Work, timeout: float) -> str:
        clock.advance(min(work.planned_s, timeout))
        return work.action(timeout)

    return gc.execute(plan, budget, run), clock


def test_the_plan_keeps_the_floors_of_required_work_and_skips_what_cannot_start_with_its_floor():
    ran: list = []
    plan = [_work("tests", 50, 30, 120, ran=ran), _work("greedy", 200, 20, 300, ran=ran),
            _work("compile", 70, 100, 150, required=True, ran=ran), _work("extra", 70, 100, 150, ran=ran)]
    steps, clock = _execute(plan, 300.0)
    # tests: its cap (300 - 100 kept for compile); greedy: cut to what compile's floor leaves (250 - 100)
    assert ran == [("tests", 120.0), ("greedy", 150.0), ("compile", 100.0)]
    assert [s.status for s in steps] == ["PASS", "PASS", "PASS", "SKIP"]
    assert steps[3].why == "skipped: needs 100 s, 30 s left" and steps[3].spent_s == 0.0
    assert [round(s.start_s) for s in steps] == [0, 50, 200, 270] and clock.now == 270.0
    totals = gc.phase_totals(steps)
    assert totals == {"checks": {"planned_s": 320.0, "spent_s": 270.0}}  # the skipped piece planned nothing


def test_a_skipped_piece_says_what_it_kept_back_and_stop_ends_the_plan():
    ran: list = []
    plan = [_work("fail fast", 10, 20, 20, required=True, ran=ran, status="STOP"), _work("after", 5, 5, 5, ran=ran)]
    steps, _ = _execute(plan, 100.0)
    assert [s.work.name for s in steps] == ["fail fast"] and ran == [("fail fast", 20.0)]
    steps, _ = _execute([_work("a", 10, 50, 60, ran=ran), _work("b", 10, 60, 60, required=True, ran=ran)], 100.0)
    assert steps[0].why == "skipped: needs 50 s, 100 s left, keeping 60 s for 1 required after it"
    # a required piece never yields to a later one: the plan is in order of need
    steps, _ = _execute([_work("a", 50, 50, 60, required=True), _work("b", 10, 60, 60, required=True)], 100.0)
    assert [s.status for s in steps] == ["PASS", "SKIP"] and steps[0].timeout_s == 60.0


# -- the GPU-marked tests ---------------------------------------------------------------------------
PYTEST_OUTPUT = """\
============================= test session starts ==============================
tests/engine/test_gpu.py::test_cuda_burst_times_with_events_and_samples_nvml PASSED [  8%]
tests/engine/test_gpu.py::test_cuda_knobs_train[precision=bf16, tf32=True] PASSED [ 16%]
tests/engine/test_gpu.py::test_memory_fraction_caps_the_worker FAILED    [ 25%]
tests/engine/test_gpu.py::test_dataparallel_runs_on_two_gpus SKIPPED (DataParallel needs two GPUs) [ 33%]
=========================== short test summary info ============================
FAILED tests/engine/test_gpu.py::test_memory_fraction_caps_the_worker - assert False
"""


# What the GPU machine's stock image lacks of this project's dependencies (the device tool's package list).
ABSENT_ON_THE_GPU_MACHINE = ("ipywidgets", "plotly", "anywidget", "nbformat", "webdataset", "playwright")
BLOCK_AND_COLLECT = """
import sys, pytest
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Absent())
sys.exit(pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=", *{files!r}]))
"""


def test_gpu_tests_are_collected_alone_without_the_ui_packages_and_ddp_last():
    files = gc.gpu_test_files()
    assert [str(f.relative_to(gc.ROOT)) for f in files] == [
        "tests/engine/test_gpu.py", "tests/search/test_batchsize.py", "tests/engine/test_gpu_ddp.py"]
    code = BLOCK_AND_COLLECT.format(absent=set(ABSENT_ON_THE_GPU_MACHINE), files=[str(f) for f in files])
    collected = subprocess.run([sys.executable, "-c", code], cwd=gc.ROOT, capture_output=True, text=True,
                               timeout=120, check=False)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert ids == [
        "tests/engine/test_gpu.py::test_cuda_knobs_train[precision=bf16, tf32=True]",
        "tests/engine/test_gpu.py::test_cuda_knobs_train[empty_cache=True]",
        "tests/engine/test_gpu.py::test_memory_fraction_caps_the_worker",
        "tests/engine/test_gpu.py::test_sync_debug_catches_a_sync_hidden_in_the_step",
        "tests/engine/test_gpu.py::test_dataparallel_runs_on_two_gpus",
        "tests/search/test_batchsize.py::test_on_a_real_gpu_running_out_of_memory_under_a_cap_is_the_limit",
        "tests/engine/test_gpu_ddp.py::test_ddp_on_cuda_uses_nccl_without_touching_cuda_here",
    ]


def test_the_gpu_tests_fit_the_plan_and_the_audit_names_what_would_not(tmp_path):
    assert gc.audit_gpu_tests(gc.gpu_test_files()) == []
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import pytest\nfrom accel_widgets import BurstEngine, BurstOptions, Config, find_batch_size, run_burst\n"
        "LIMIT = 90\n\n"
        "@pytest.mark.gpu\ndef test_ddp():\n"
        "    run_burst(None, Config(parallel=\"ddp\"), options=BurstOptions(timeout_s=30))\n\n"
        "@pytest.mark.gpu\n@pytest.mark.timeout(60)\n"
        "def test_slow():\n    run_burst(None, options=BurstOptions(timeout_s=LIMIT))\n"
        "    find_batch_size(None, engine=BurstEngine(BurstOptions()))\n\n"
        "def test_on_cpu():\n    run_burst(None)\n")
    assert gc.audit_gpu_tests([bad]) == [
        f"{bad}::test_ddp: no pytest.mark.timeout of at most 45 s",
        f"{bad}::test_slow: no pytest.mark.timeout of at most 45 s",
        f"{bad}::test_slow: run_burst(...) without a timeout_s of at most 60 s (line 12)",
        f"{bad}::test_slow: find_batch_size(...) without a timeout_s of at most 60 s (line 13)",
        f"DDP tests must run last: {bad}::test_ddp",
    ]


def test_pytest_outcomes_are_read_line_by_line():
    outcomes = gc.parse_pytest_outcomes(PYTEST_OUTPUT)
    assert outcomes == {
        "tests/engine/test_gpu.py::test_cuda_burst_times_with_events_and_samples_nvml": "PASSED",
        "tests/engine/test_gpu.py::test_cuda_knobs_train[precision=bf16, tf32=True]": "PASSED",
        "tests/engine/test_gpu.py::test_memory_fraction_caps_the_worker": "FAILED",
        "tests/engine/test_gpu.py::test_dataparallel_runs_on_two_gpus": "SKIPPED",
    }


def test_test_summary_fails_on_a_failure_a_kill_or_an_exit_code():
    outcomes = gc.parse_pytest_outcomes(PYTEST_OUTPUT)
    status, message = gc.summarise_tests(outcomes, 1, False, 80.0)
    assert status == "FAIL" and "test_memory_fraction_caps_the_worker" in message and "2 passed" in message
    passed = {k: v for k, v in outcomes.items() if v != "FAILED"}
    assert gc.summarise_tests(passed, 0, False, 80.0)[0] == "PASS"
    assert gc.summarise_tests(passed, 0, True, 130.0)[0] == "FAIL"
    assert gc.summarise_tests(passed, 2, False, 5.0)[0] == "FAIL"
    assert gc.summarise_tests({"t::a": "SKIPPED"}, 0, False, 1.0)[0] == "SKIP"


def test_a_timed_out_command_is_killed_with_its_whole_group(tmp_path):
    """The grandchild (as a test's forkserver would be) dies with the group, not only the direct child."""
    log = tmp_path / "log.txt"
    code = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
            "print(p.pid, flush=True); time.sleep(60)")
    started = time.monotonic()
    returncode, timed_out = gc.run_in_group([sys.executable, "-c", code], log, timeout_s=3.0, cwd=tmp_path)
    assert timed_out and returncode < 0 and time.monotonic() - started < 10
    grandchild = int(log.read_text().split()[0])
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        try:
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    alive = psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE
    assert not alive


def test_a_finished_command_reports_its_exit_code(tmp_path):
    returncode, timed_out = gc.run_in_group([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log",
                                            timeout_s=30, cwd=tmp_path)
    assert (returncode, timed_out) == (3, False)


# -- ladders and the report -------------------------------------------------------------------------
def test_a_ladder_row_sits_next_to_its_reference():
    result = make_result()
    row = gc.ladder_row("image", "+bf16", gc.BurstOutcome(result, "ok"), result.samples_per_s / 4)
    assert row["speedup"] == pytest.approx(4.0) and row["reference"] == 4.1 and row["timing_consistent"]
    assert gc.rung_status(row) == "INFO" and "4.0x (reference 4.1x)" in gc.rung_text(row)
    failed = gc.ladder_row("lm", "+compile", gc.BurstOutcome(None, "failed", "rank 0 failed"), 50.0)
    assert gc.rung_status(failed) == "FAIL" and failed["speedup"] is None and failed["reference"] == 6.3
    skipped = gc.ladder_row("lm", "+rest", gc.BurstOutcome(None, "skipped", "skipped"), 50.0)
    assert gc.rung_status(skipped) == "SKIP"
    assert gc.side_by_side([row, failed]) == "+bf16 +compile: measured 4.0x -, reference 4.1x 6.3x"


def test_the_report_is_on_disk_after_every_check(tmp_path):
    report = gc.Report(tmp_path / "out" / "gpu_check.json", {"benchmark": "gpu_check"}, gc.Budget(330.0))
    report.check("mfu", "PASS", "MFU 40.0%")
    saved = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert saved["checks"] == [{"name": "mfu", "status": "PASS", "message": "MFU 40.0%"}]
    assert saved["failed"] is False
    report.check("telemetry", "FAIL", "no telemetry samples")
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["failed"] is True
    assert not list((tmp_path / "out").glob("*.partial"))


# -- the plan's dry run and the call's first seconds --------------------------------------------------
def _dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(gc.ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", *args],
                          cwd=gc.ROOT, capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(gc.ROOT)})


@pytest.mark.slow
def test_the_dry_run_plans_the_h200_call_within_its_420_s():
    """What the device plan's first run will do, planned on its sizes and timings: it must fit, or CI fails. The
    least wanted compile piece (image +rest) gives way to the 420 s the second run needs left of 15 minutes."""
    run = _dry_run()
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "for NVIDIA H200, 143,771 MiB (NVML), 16 cores: budget 400 s of the call's 420 s" in out
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [row[3] for row in rows] == [
        "start-up", "fail fast", "gpu tests", "check probe", "check no host sync", "check fp16+fused",
        "check channels_last", "image baseline", "image +loader", "image +bf16", "lm baseline", "lm +loader",
        "lm +bf16", "lm +compile", "image +compile", "check reduce-overhead", "lm +rest", "image +rest"]
    table = {row[3]: row for row in rows}
    assert table["fail fast"][:3] == ["5", "10", "20"]  # first, 10 s planned, 20 s at most
    assert all(row[5].startswith("PLANNED") for row in rows[1:-1])
    assert table["image +rest"][2] == "-" and table["image +rest"][5].startswith("skipped: needs 100 s")
    assert all(int(table[name][2]) >= 100 for name in ("lm +compile", "image +compile", "lm +rest"))
    assert "ends at 349 s of 400 s" in out
    assert "preflight PASS gpu test limits" in out and "memory_fraction=0.05" in out
    assert "FITS: every required piece runs: fail fast, image baseline, image +loader, image +bf16, lm baseline, " \
           "lm +loader, lm +bf16, lm +compile" in out


def test_a_dry_run_whose_budget_cannot_hold_the_lms_compile_fails_and_says_why(capsys):
    """In this process (the test above runs the script as the device plan does): the plan launches nothing."""
    assert gc.main(["--dry-run", "--budget-s", "150"]) == 1
    out = capsys.readouterr().out
    assert "lm +compile" in out and "DOES NOT FIT: required but not run in full: lm +compile" in out
    assert "skipped: needs 100 s" in out


def _budget_from_now(seconds: float = 400.0) -> list[str]:
    """``--budget-s`` for a call made in this (long-running) test process: the call counts its budget from the
    process's start, as the real call's process starts with it."""
    age = time.time() - psutil.Process().create_time()
    return ["--budget-s", f"{age + seconds:.0f}"]


def test_a_required_piece_the_budget_cannot_hold_fails_the_call(monkeypatch, tmp_path):
    """A call whose budget is gone before fail fast answers nothing: that is a failure, never a quiet SKIP."""
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setattr(gc.aw, "run_burst", lambda *a, **k: pytest.fail("no burst may start without a budget"))
    age = time.time() - psutil.Process().create_time()
    spent = ["--budget-s", f"{max(1.0, age - 1):.0f}"]
    assert gc.main(["--allow-cpu", "--size", "small", "--workloads", "lm", *spent]) == 1
    saved = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert saved["failed"] and saved["timeline"][1]["work"] == "fail fast"
    assert saved["timeline"][1]["status"] == "SKIP"


@pytest.mark.parametrize("error", [f"{gc.CUDA_REINIT}. To use CUDA with multiprocessing, you must use the 'spawn' "
                                   "start method", f"{gc.CUDA_INIT_ERROR}\nSearch for `cudaErrorInitializationError'"],
                         ids=["a CUDA context", "only the driver"])
def test_a_broken_start_stops_the_call_at_once_and_the_json_was_there_from_the_start(monkeypatch, tmp_path, error):
    """The forkserver held CUDA (a context, or only the driver that is_available() initialised): every rank would
    fail the same way, so the call stops at fail fast."""
    out = tmp_path / "out"
    seen_before_the_burst: list[dict] = []

    def broken(workload, config, **kwargs):
        seen_before_the_burst.append(json.loads((out / "gpu_check.json").read_text()))
        result = BurstResult(workload=workload.name, config=config, status="failed")
        raise gc.aw.WorkerError(f"rank 0 failed: RuntimeError: {error}", result)

    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setattr(gc.aw, "run_burst", broken)
    assert gc.main(["--allow-cpu", "--size", "small", "--workloads", "lm", *_budget_from_now()]) == 1
    (before,) = seen_before_the_burst
    assert [w["work"] for w in before["plan"]][:2] == ["fail fast", "gpu tests"]
    assert before["timeline"][0]["work"] == "start"
    saved = json.loads((out / "gpu_check.json").read_text())
    assert [s["work"] for s in saved["timeline"]] == ["start", "fail fast"]
    assert saved["timeline"][1]["status"] == "STOP" and saved["timeline"][1]["planned_s"] == 10.0
    assert set(saved["phases"]) == {"start", "fail fast"}
    (fail_fast,) = [c for c in saved["checks"] if c["name"] == "fail fast"]
    assert fail_fast["status"] == "FAIL" and error.splitlines()[0] in fail_fast["message"]
    assert "the forkserver initialised CUDA before it forked the ranks" in fail_fast["message"]
    assert not list(out.glob("gpu_tests.log"))  # nothing after it ran


# -- GPM beside utilisation, and what the header says of the host ---------------------------------------------------
def test_a_hopper_burst_must_carry_gpm_activity_below_its_utilisation():
    from tests.measured import H200_FP32_ACTIVITY, h200_result

    status, text = gc.check_activity(h200_result(activity=H200_FP32_ACTIVITY))
    assert status == "PASS" and text == ("utilisation 98%; SM active 61%, tensor cores active 12%, SM occupancy 25%, "
                                         "DRAM bandwidth 35% (NVML GPM)")
    assert gc.check_activity(h200_result())[0] == "FAIL"  # a Hopper without GPM readings: the sampler missed them
    impossible = h200_result(util=40.0, activity={**H200_FP32_ACTIVITY, "sm_active_pct": 90.0})
    assert gc.check_activity(impossible)[0] == "FAIL"
    older = dataclasses.replace(h200_result(), environment={**h200_result().environment, "capability": "8.0"})
    assert gc.check_activity(older) == ("SKIP", "no GPM before Hopper (compute capability 8.0)")
    assert gc.graded_verdict(gc.BurstOutcome(None, "cut", "cut by the plan"), gc.check_activity) == (
        "SKIP", "cut by the plan")


def test_the_header_records_the_hosts_memory_and_dev_shm():
    header = gc.header(gc.parse_args([]), gc.fake_h200())
    host = header["host"]
    assert host["mem_total_bytes"] > 0 and host["mem_available_bytes"] > 0
    assert host["shm_total_bytes"] > 0 and 0 <= host["shm_free_bytes"] <= host["shm_total_bytes"]


def test_the_report_sets_each_burst_against_dmon_and_says_how_far_apart_they_were(tmp_path):
    from tests.benchmarks.test_device import HEADER, dmon_line
    from tests.measured import h200_result

    device = load_benchmark("_device")
    origin = 1_800_000_000.0
    rows = device.parse_dmon(HEADER + "".join(dmon_line(origin + t, 96, 640) for t in range(0, 7)))
    report = gc.Report(tmp_path / "gpu_check.json", {}, gc.Budget(400.0))
    report.burst("check/probe", gc.BurstOutcome(h200_result(), "ok", wall_origin=origin))
    report.burst("fail fast", gc.BurstOutcome(None, "failed", "rank 0 failed", origin))
    report.dmon(rows, started=True)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(saved["dmon"]) == ["check/probe"] and saved["dmon"]["check/probe"]["util_gap_pts"] == 2.0
    assert saved["bursts"]["check/probe"]["wall_origin"] == origin
    (line,) = saved["checks"]
    assert line == {"name": "dmon vs NVML", "status": "INFO", "message": "1 bursts against 7 dmon rows: utilisation "
                    "gap at most 2 pts; energy NVML/dmon 1.02-1.02"}
    report.dmon([], started=False)
    assert report.data["checks"][-1]["status"] == "SKIP"
