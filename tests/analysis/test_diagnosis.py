"""``diagnose`` on synthetic results: each rule of thumb fires on its numbers and points at the right knob."""

from __future__ import annotations

import dataclasses

import pytest

from accel_widgets import Config
from accel_widgets.analysis.diagnosis import THRESHOLDS, Finding, diagnose
from accel_widgets.analysis.guard import GuardVerdict
from accel_widgets.analysis.usage import energy
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.results.burst import ErrorInfo
from accel_widgets.results.reliability import foreign_cpu_pct, load_attribution, other_processes, reliability
from accel_widgets.views.text import summary
from tests.analysis.test_compare import paced
from tests.panel.fakes import synthetic_result
from tests.results.test_burst import compile_report, make_result

#: Machines the advice is judged for: a CPU with bf16 units (AVX512-BF16), one without, and one H100.
CPU_BF16 = DeviceInfo(2, "a CPU with bf16 units", frozenset({"avx512_bf16"}))
CPU_PLAIN = DeviceInfo(2, "a CPU without bf16 units")
H100 = DeviceInfo(16, "host", frozenset(), (GpuInfo(0, 0, "NVIDIA H100 80GB HBM3", 80 << 30,
                                                    compute_capability=(9, 0)),), "test")


def titles(findings: list[Finding]) -> list[str]:
    return [f.title for f in findings]


def by_title(findings: list[Finding], title: str) -> Finding:
    (found,) = [f for f in findings if f.title == title]
    return found


def test_a_healthy_gpu_run_reads_as_healthy_and_points_at_the_next_lever() -> None:
    findings = diagnose(synthetic_result(util=95, source="nvml", peak_mib=40_000, total_mib=80_000, steps=60),
                        device=H100)
    assert {f.severity for f in findings} == {"good"}
    assert by_title(findings, "Device kept busy").detail.startswith("GPU at 95%")
    assert by_title(findings, "Compute-bound").knob == "precision"
    assert by_title(findings, "Memory headroom").knob == "batch_size"


@pytest.mark.parametrize(
    ("config", "knob"),
    [(Config(), "num_workers"), (Config(num_workers=2), "data_cache"),
     (Config(num_workers=2, data_cache="memmap"), "prefetch_factor")],
)
def test_the_largest_share_waiting_on_data_is_data_bound(config: Config, knob: str) -> None:
    finding = by_title(diagnose(synthetic_result(config, data_s=0.03), device=CPU_BF16), "Data-bound")
    assert finding.severity == "warn" and finding.knob == knob and finding.limit == "data"
    assert finding.detail.startswith("60% of the step waits on the data loader (the rest: compute 40%)")


def test_a_data_wait_smaller_than_compute_is_context_of_the_compute_bound_reading_not_a_second_limiter() -> None:
    """The issue's reading: 11% waiting on data beside 88% computing is compute-bound, the wait said as context."""
    findings = diagnose(synthetic_result(data_s=0.0055), device=CPU_BF16)
    limited = [f for f in findings if f.limit is not None]
    assert [f.title for f in limited] == ["Compute-bound"] and "Data-bound" not in titles(findings)
    assert limited[0].detail.startswith("89% of the step computes (the rest: data 11%)")
    quiet = diagnose(synthetic_result(data_s=0.001), device=CPU_BF16)
    assert "(the rest" not in by_title(quiet, "Compute-bound").detail


def test_copies_that_take_most_of_the_step_point_at_pinned_memory_then_non_blocking_on_a_gpu() -> None:
    copying = synthetic_result(h2d_s=0.03, source="nvml", steps=60)
    assert by_title(diagnose(copying, device=H100), "Copy-bound").knob == "pin_memory"
    pinned = synthetic_result(Config(pin_memory=True), h2d_s=0.03, source="nvml", steps=60)
    assert by_title(diagnose(pinned, device=H100), "Copy-bound").knob == "non_blocking"
    on_a_cpu = by_title(diagnose(synthetic_result(h2d_s=0.03), device=CPU_BF16), "Copy-bound")
    assert on_a_cpu.knob is None  # pinned memory acts only on CUDA: no advice it cannot keep


def test_a_gpu_idle_most_of_the_time_is_host_bound_the_loss_read_first_then_the_batch() -> None:
    finding = by_title(diagnose(synthetic_result(util=30, source="nvml", steps=60), device=H100), "Host-bound")
    assert finding.knob == "sync_every" and finding.limit == "host" and "the GPU idles (busy 30%" in finding.detail
    unsynced = diagnose(synthetic_result(Config(sync_every=0), util=30, source="nvml", steps=60), device=H100)
    assert by_title(unsynced, "Host-bound").knob == "batch_size"
    busy_enough = diagnose(synthetic_result(util=60, source="nvml", steps=60), device=H100)
    assert by_title(busy_enough, "Compute-bound").detail.startswith("58% of the step computes (the rest: host 40%)")
    assert "Utilisation below 80%" in titles(busy_enough)


def test_a_gpu_window_too_short_for_nvml_says_so_instead_of_judging_utilisation() -> None:
    findings = diagnose(synthetic_result(util=20, source="nvml", steps=10))  # a 0.5 s window
    finding = by_title(findings, "Utilisation not read")
    assert finding.severity == "info" and finding.detail.startswith("too short to read: NVML's utilisation averages")
    assert not {"Utilisation below 80%", "Possibly sync-bound", "Low utilisation, fast steps"} & set(titles(findings))


def test_compute_bound_advice_follows_what_is_already_on() -> None:
    def knob(config: Config, device: DeviceInfo = CPU_BF16) -> str | None:
        return by_title(diagnose(synthetic_result(config), device=device), "Compute-bound").knob

    assert knob(Config()) == "precision"
    assert knob(Config(precision="bf16")) == "compile_mode"
    assert knob(Config(precision="bf16", compile_mode="default")) == "channels_last"
    assert knob(Config(precision="bf16", compile_mode="default", channels_last=True)) is None


def test_advice_its_owners_rules_warn_about_on_this_machine_is_not_given() -> None:
    """The issue's CPU: the precision owner warns that bf16 is emulated there, and the ladder leaves it out; so the
    compute-bound reading passes to the next owner's advice instead of saying "try bf16"."""
    plain = by_title(diagnose(synthetic_result(), device=CPU_PLAIN), "Compute-bound")
    assert plain.knob == "compile_mode" and "bf16" not in plain.detail


def test_memory_above_ninety_percent_suggests_accumulation() -> None:
    finding = by_title(diagnose(synthetic_result(peak_mib=950, total_mib=1000)), "Memory nearly full")
    assert finding.severity == "warn" and finding.knob == "grad_accum_steps" and "95%" in finding.detail


def test_noisy_steps_say_re_run_and_name_the_foreign_load() -> None:
    noisy = by_title(diagnose(synthetic_result(jitter=0.15)), "Noisy step times")
    assert "re-run" in noisy.detail
    loaded = by_title(diagnose(synthetic_result(jitter=0.15, util=50, foreign=20)), "Noisy step times")
    assert "~20%" in loaded.detail
    steady = diagnose(synthetic_result(util=50, foreign=15))
    assert by_title(steady, "Machine busy").severity == "info" and "Noisy step times" not in titles(steady)
    short = by_title(diagnose(synthetic_result(steps=2)), "Noisy step times")
    assert "only 2 measured steps" in short.detail


def test_a_spread_past_half_the_median_or_a_shared_machine_is_an_unreliable_measurement() -> None:
    spread = synthetic_result(jitter=0.3)  # steps alternate 35 and 65 ms: IQR 60% of the median
    assert reliability(spread).reasons == ("step times spread 60% of their median (IQR 30 ms around 50 ms)",)
    finding = by_title(diagnose(spread), "Unreliable measurement")
    assert finding.severity == "warn" and "Re-measure" in finding.detail and "Noisy step times" not in titles(
        diagnose(spread))
    shared = synthetic_result(util=50, foreign=30)
    assert not reliability(shared).reliable and "other load took 30% of the machine" in reliability(shared).text()
    assert reliability(synthetic_result(util=50, foreign=20)).reliable


def test_the_load_is_attributed_and_a_browser_drawing_live_plots_is_named() -> None:
    result = synthetic_result(util=40, foreign=30)
    result.environment["cpu_count"] = 2
    result.telemetry = [dataclasses.replace(t, caller_util_pct=5.0, other_processes={"chromium": 44.0,
                                                                                      "jupyter-server": 10.0,
                                                                                      "sshd": 1.0})
                        for t in result.telemetry]
    assert other_processes(result) == [("chromium", 44.0), ("jupyter-server", 10.0), ("sshd", 1.0)]
    assert foreign_cpu_pct(result) == pytest.approx(25.0)  # 70% busy: 40 the burst's, 5 the caller's
    assert load_attribution(result) == "chromium 44%, jupyter-server 10% of a core; the calling process 10% of a core"
    finding = by_title(diagnose(result), "Unreliable measurement")
    assert "other load took 30% of the machine (chromium 44%, jupyter-server 10% of a core" in finding.detail
    assert "The browser used 44% of a core while the burst ran" in finding.detail


def test_result_warnings_are_shown() -> None:
    findings = diagnose(synthetic_result(warnings=["pin_memory only acts on CUDA"]))
    assert by_title(findings, "Engine warning").detail == "pin_memory only acts on CUDA"


def test_failures_are_read_first_with_their_first_line() -> None:
    oom = synthetic_result(status="failed", error=ErrorInfo("oom", "CUDA out of memory. Tried 20 GiB\nmore"))
    findings = diagnose(oom)
    assert findings[0].title == "Out of memory" and findings[0].knob == "batch_size"
    assert "more" not in findings[0].detail
    failed = diagnose(synthetic_result(status="failed", error=ErrorInfo("exception", "ValueError: bad\ntrace")))
    assert failed[0].title == "Burst failed" and failed[0].severity == "warn" and failed[0].detail == "ValueError: bad"


def test_a_stopped_burst_is_still_read_from_its_steps() -> None:
    stopped = synthetic_result(status="stopped", error=ErrorInfo("stopped", "stopped before the end"))
    findings = diagnose(stopped)
    assert by_title(findings, "Stopped early").detail.startswith("10 measured steps")
    assert "Device kept busy" in titles(findings)


def test_findings_are_ordered_warnings_first() -> None:
    findings = diagnose(synthetic_result(data_s=0.02, warnings=["w"]))
    order = [f.severity for f in findings]
    assert order == sorted(order, key=["warn", "info", "good"].index)


def test_a_finding_must_name_a_real_knob() -> None:
    with pytest.raises(ValueError, match="unknown knob"):
        Finding("info", "x", "y", knob="num_worker")


# -- the rules added for the full diagnosis --

def with_host(result, **fields):
    result.telemetry = [dataclasses.replace(t, **fields) for t in result.telemetry]
    return result


def test_fp32_on_a_tensor_core_gpu_points_at_mixed_precision() -> None:
    result = synthetic_result(source="nvml")
    result.environment = {"device_kind": "cuda", "capability": "9.0"}
    assert by_title(diagnose(result), "fp32 on a tensor-core GPU").knob == "precision"
    result.environment = {"device_kind": "cuda", "capability": "6.1"}  # Pascal: no tensor cores
    assert "fp32 on a tensor-core GPU" not in titles(diagnose(result))


def test_dataparallel_points_at_ddp() -> None:
    assert by_title(diagnose(synthetic_result(Config(parallel="dataparallel"))), "DataParallel").knob == "parallel"


def test_a_data_limit_with_io_wait_reads_as_the_disk() -> None:
    result = with_host(synthetic_result(data_s=0.03), iowait_pct=THRESHOLDS.iowait_notice_pct + 15)
    finding = by_title(diagnose(result, device=CPU_BF16), "Data-bound")
    assert finding.knob == "data_cache" and finding.symptom == "disk_bound" and "waited on I/O 25%" in finding.detail


def test_a_data_limit_on_a_saturated_machine_starves_the_loader() -> None:
    result = with_host(synthetic_result(Config(num_workers=2), data_s=0.03), host_util_pct=97.0, loader_util_pct=60.0)
    finding = by_title(diagnose(result, device=CPU_BF16), "Data-bound")
    assert finding.knob == "data_cache" and finding.symptom == "starved_loader"
    assert "97% busy (the loader workers used 60% of it): the loader is starved of cores" in finding.detail
    quiet = with_host(synthetic_result(Config(num_workers=2), data_s=0.03), host_util_pct=50.0)
    assert by_title(diagnose(quiet, device=CPU_BF16), "Data-bound").symptom == "data_wait"


def test_compile_payback_counts_steps_or_says_it_never_pays() -> None:
    baseline = synthetic_result(step_s=0.05)
    compiled = synthetic_result(Config(compile_mode="default"), step_s=0.04)
    compiled.ranks = [dataclasses.replace(r, first_step_s=10.04) for r in compiled.ranks]
    finding = by_title(diagnose(compiled, baseline), "Compile payback")
    assert "~1,000 steps" in finding.detail and finding.severity == "info"  # 10 s / 10 ms, more than measured
    slower = synthetic_result(Config(compile_mode="default"), step_s=0.06)
    slower.ranks = [dataclasses.replace(r, first_step_s=10.0) for r in slower.ranks]
    assert by_title(diagnose(slower, baseline), "Compile does not pay off here").knob == "compile_mode"


def test_graph_breaks_and_recompiles_are_said_in_words_with_where_and_why() -> None:
    """A print in forward broke the graph; a new length every step recompiled every step (12 steps, 11 recompiles)."""
    result = synthetic_result(Config(compile_mode="default"), steps=10)
    report = compile_report(breaks=3, recompiles=11)
    result.ranks = [dataclasses.replace(r, compile_report=report) for r in result.ranks]
    findings = diagnose(result)
    breaks = by_title(findings, "Graph breaks")
    assert breaks.severity == "warn" and breaks.knob == "compile_mode"
    assert breaks.detail.startswith("compile broke the graph 3x at model.py:42 in forward (`print(x.shape)`): Failed "
                                    "to trace builtin operator (Dynamo does not know how to trace builtin operator "
                                    "`print`); the model ran as 4 graphs: fix that first")
    assert breaks.detail.endswith("(torch's hint: Avoid calling builtin `print`).")
    recompiles = by_title(findings, "Recompiles")
    assert recompiles.detail.startswith("recompiled 11x in 12 steps (on every step) because tensor 'x' size mismatch "
                                        "at index 1. expected 48, actual 64 in forward (model.py:40): each recompile "
                                        "costs another compile")
    quiet = synthetic_result(Config(compile_mode="default"))
    quiet.ranks = [dataclasses.replace(r, compile_report=compile_report(breaks=0, recompiles=1)) for r in quiet.ranks]
    assert "Graph breaks" not in titles(diagnose(quiet))
    assert "(on every step)" not in by_title(diagnose(quiet), "Recompiles").detail


def test_a_run_that_changes_training_is_flagged_against_its_baseline() -> None:
    baseline = synthetic_result()
    broken = synthetic_result(Config(precision="bf16"))
    broken.steps = [dataclasses.replace(s, loss=float("nan")) if s.step > 5 else s for s in broken.steps]
    finding = by_title(diagnose(broken, baseline), "Faster but changes training")
    assert "NaN" in finding.detail
    assert "Faster but changes training" not in titles(diagnose(synthetic_result(Config(precision="bf16")), baseline))


def test_a_verdict_the_caller_already_has_is_read_not_recomputed() -> None:
    """The panel and the report judge each run once, for their table, and hand that verdict to the reading."""
    baseline, run = synthetic_result(), synthetic_result(Config(precision="bf16"))
    verdict = GuardVerdict("changes_training", ("the loss left the baseline's at step 7",))
    finding = by_title(diagnose(run, baseline, verdict=verdict), "Faster but changes training")
    assert finding.detail == "the loss left the baseline's at step 7"
    assert "Faster but changes training" not in titles(diagnose(run, baseline, verdict=GuardVerdict("ok")))


def test_model_math_is_reported_when_flops_were_counted() -> None:
    result = synthetic_result()
    result.ranks = [dataclasses.replace(r, flops_per_sample=2e6) for r in result.ranks]
    assert by_title(diagnose(result), "Model math").detail == "1.28 GFLOP/s of matmul/conv work sustained."


def diverged(config: Config | None = None):
    """A finished synthetic burst whose loss went NaN after step 5, marked as the launcher marks it."""
    result = synthetic_result(config)
    result.steps = [dataclasses.replace(s, loss=float("nan")) if s.step > 5 else s for s in result.steps]
    result.error = result.divergence()
    result.status = "diverged"
    return result


def test_a_diverged_run_is_read_first_and_still_from_its_numbers() -> None:
    findings = diagnose(diverged())
    first = findings[0]
    assert first.title == "Training diverged" and first.severity == "warn" and first.knob is None
    assert first.detail.startswith("loss is NaN from step 6 (6 of 12 steps not finite): the throughput is measured, "
                                   "but a run that does not train is no speed-up. Check the learning rate")
    assert "Device kept busy" in titles(findings)  # the numbers are still read


def test_a_diverged_run_in_reduced_precision_points_at_precision_once() -> None:
    findings = diagnose(diverged(Config(precision="bf16")), synthetic_result())
    finding = by_title(findings, "Training diverged")
    assert finding.knob == "precision" and "precision='bf16' may overflow" in finding.detail
    assert "Check the learning rate and the data for NaN/inf" in finding.detail
    assert "Faster but changes training" not in titles(findings)  # the guard's NaN reason is not said twice


# -- energy against the baseline --

def with_energy(result, watts: float):
    """The result's GPU read by an energy counter rising at ``watts``, from well before its window to well after."""
    result.telemetry = [dataclasses.replace(t, source="nvml", device="cuda:0", energy_j=watts * t.t,
                                            energy_scope="gpu") for t in (result.telemetry[0], result.telemetry[-1])]
    result.telemetry[-1] = dataclasses.replace(result.telemetry[-1], t=100.0, energy_j=watts * 100.0)
    return result


def test_a_run_against_its_baseline_says_what_it_saved_in_time_and_energy() -> None:
    # Twice as fast (25 ms steps vs 50 ms, 32 samples each) at 1.5x the power: half the time, 3/4 the energy.
    baseline = with_energy(synthetic_result(step_s=0.05), watts=240.0)
    run = with_energy(synthetic_result(Config(precision="bf16"), step_s=0.025), watts=360.0)
    finding = by_title(diagnose(run, baseline, verdict=GuardVerdict("ok")), "Energy per sample")
    assert finding.severity == "good"
    assert finding.detail == ("precision=bf16: 50% less time and 25% less energy per sample than the baseline "
                              "(0.375 → 0.281 J/sample; GPU energy over the measured window, from NVML's energy "
                              "counter).")


def test_a_faster_run_that_costs_more_energy_says_so() -> None:
    baseline = with_energy(synthetic_result(step_s=0.05), watts=200.0)
    run = with_energy(synthetic_result(Config(precision="bf16"), step_s=0.025), watts=500.0)
    finding = by_title(diagnose(run, baseline, verdict=GuardVerdict("ok")), "Energy per sample")
    assert finding.severity == "info"
    assert finding.detail.startswith("precision=bf16: 50% less time and 25% more energy per sample")


def test_no_energy_finding_where_either_run_was_not_measured() -> None:
    measured = with_energy(synthetic_result(step_s=0.05), watts=200.0)
    unmeasured = synthetic_result(Config(precision="bf16"), step_s=0.025)  # CPU telemetry without RAPL
    assert energy(unmeasured).joules is None
    assert "Energy per sample" not in titles(diagnose(unmeasured, measured, verdict=GuardVerdict("ok")))
    assert "Energy per sample" not in titles(diagnose(measured, unmeasured, verdict=GuardVerdict("ok")))


def test_an_allocator_holding_a_quarter_of_its_memory_unused_points_at_expandable_segments() -> None:
    """H200 sizes: 100,000 MiB reserved for a peak of 70,000 MiB allocated is 30% held unused."""
    result = synthetic_result(peak_mib=70_000, total_mib=143_771)
    rank = dataclasses.replace(result.ranks[0], peak_reserved_bytes=100_000 * 2**20)
    finding = by_title(diagnose(dataclasses.replace(result, ranks=[rank]), device=H100),
                       "Allocator holds unused memory")
    assert finding.knob == "expandable_segments" and finding.symptom == "allocator_slack"
    assert "reserved 100,000 MiB and never had more than 70,000 MiB of it allocated at once (30% held" in finding.detail
    tight = dataclasses.replace(rank, peak_reserved_bytes=80_000 * 2**20)  # 12.5%: no note
    assert "Allocator holds unused memory" not in titles(diagnose(dataclasses.replace(result, ranks=[tight])))


def test_expandable_segments_asked_for_but_fixed_in_the_allocator_is_a_warning() -> None:
    """The rank read its allocator's snapshot: fixed segments under expandable_segments=True mean the knob did not
    act (the setting came after CUDA started, or another setting won)."""
    result = synthetic_result(Config(expandable_segments=True), peak_mib=70_000, total_mib=143_771)
    fixed = dataclasses.replace(result, ranks=[dataclasses.replace(result.ranks[0], allocator_expandable=False)])
    finding = by_title(diagnose(fixed), "Expandable segments not in effect")
    assert finding.severity == "warn" and finding.knob == "expandable_segments"
    assert finding.detail.startswith("expandable_segments=True did not act: the CUDA allocator's segments were fixed")
    grew = dataclasses.replace(result, ranks=[dataclasses.replace(result.ranks[0], allocator_expandable=True)])
    assert "Expandable segments not in effect" not in titles(diagnose(grew))
    assert "expandable allocator segments" in summary(grew)


def test_findings_carry_the_symptom_a_ladder_can_be_asked_to_address() -> None:
    finding = by_title(diagnose(synthetic_result(peak_mib=950, total_mib=1000)), "Memory nearly full")
    assert finding.symptom == "memory_full"


def test_a_busy_gpu_whose_tensor_cores_idle_is_told_the_math_is_not_on_them() -> None:
    """H200, fp32 GPT step: utilisation 98% (a kernel always ran) but GPM's tensor activity 12%: try bf16."""
    from tests.measured import H200_BF16_ACTIVITY, H200_FP32_ACTIVITY, h200_result

    finding = by_title(diagnose(h200_result(activity=H200_FP32_ACTIVITY)), "Tensor cores mostly idle")
    assert finding.severity == "warn" and finding.knob == "precision" and finding.symptom == "tensor_cores_idle"
    assert finding.detail == ("utilisation 98% but tensor cores active 12%, SMs active 61% (NVML GPM): the math is "
                              "not on the tensor cores: try bf16, whose matmuls run there (fp32 ones do not).")
    bf16 = Config(precision="bf16")
    assert "Tensor cores mostly idle" not in titles(diagnose(h200_result(bf16, activity=H200_BF16_ACTIVITY)))
    idle_in_bf16 = by_title(diagnose(h200_result(bf16, activity=H200_FP32_ACTIVITY)), "Tensor cores mostly idle")
    assert idle_in_bf16.severity == "info" and idle_in_bf16.knob is None  # nothing the precision knob can add
    assert "Tensor cores mostly idle" not in titles(diagnose(h200_result()))  # no GPM: nothing to read
    assert "Tensor cores mostly idle" not in titles(diagnose(h200_result(util=60.0, activity=H200_FP32_ACTIVITY)))


# -- one limiter, advice that can act, ceilings ------------------------------------------------------------------
def test_a_data_ceiling_that_reads_same_closes_the_loader_knobs_with_its_bound() -> None:
    """Data wait on the step clock, but with the data free the step is no faster: the loader knobs cannot help."""
    from tests.results.test_headspace import headspace_of

    flat = headspace_of({"data": [1.0, 1.01, 0.99, 1.005, 1.0, 0.995]})
    findings = diagnose(synthetic_result(data_s=0.01), device=CPU_BF16, headspace=flat)
    limited = [f for f in findings if f.limit is not None]
    assert [f.title for f in limited] == ["Compute-bound"]
    top = flat.ceilings["data"].cost_share
    assert 0 < top < 0.03
    assert (f"Data loading costs at most {top:.0%} here: the loader knobs (workers, pinning, prefetching, caches, "
            "shards) cannot help") in limited[0].detail
    assert not any(f.knob in {"num_workers", "data_cache", "prefetch_factor"} for f in findings)


def test_a_measured_data_ceiling_sizes_the_data_limit_and_bounds_its_knobs() -> None:
    """The step clock saw 20% waiting (loader workers also took the cores compute needs), the ceiling 2x: the data part
    is half the step, and the loader knobs can win at most the interval's top."""
    from tests.results.test_headspace import headspace_of

    wide = headspace_of({"data": [2.0, 2.1, 1.95, 2.05, 2.0]})
    finding = by_title(diagnose(synthetic_result(data_s=0.01), device=CPU_BF16, headspace=wide), "Data-bound")
    assert finding.detail.startswith("50% of the step goes to data loading (2.02× [")
    top = wide.ceilings["data"].most
    assert finding.knob == "num_workers" and f"can win at most {top:.2f}× here" in finding.detail


def test_a_communication_ceiling_under_ddp_names_the_exchange_when_it_is_the_largest_share() -> None:
    from tests.results.test_headspace import headspace_of

    ddp = Config(parallel="ddp", world_size=2)
    headspace = headspace_of({"communication": [2.4, 2.5, 2.6, 2.45], "data": [1.0, 1.01, 0.99, 1.0, 1.0]}, ddp)
    finding = by_title(diagnose(synthetic_result(ddp, ranks=2), device=CPU_BF16, headspace=headspace),
                       "Communication-bound")
    assert finding.limit == "communication" and finding.knob == "grad_accum_steps"
    assert finding.detail.startswith("60% of the step goes to the gradients' exchange")
    assert "Data loading costs at most" in finding.detail
    small = headspace_of({"communication": [1.1, 1.12, 1.08, 1.1]}, ddp)
    compute = by_title(diagnose(synthetic_result(ddp, ranks=2), device=CPU_BF16, headspace=small), "Compute-bound")
    assert "communication 9%" in compute.detail


MACHINES = {"cpu with bf16": CPU_BF16, "cpu": CPU_PLAIN, "h100": H100}


def readings():
    """Many runs' readings: every mix of data wait, copies, utilisation and host load, on three machines, plain and
    tuned configs, with and without ceilings."""
    from tests.results.test_headspace import headspace_of

    ceilings = [None, headspace_of({"data": [1.0, 1.01, 0.99, 1.0, 1.0]}), headspace_of({"data": [1.8, 1.9, 2.0]})]
    configs = [Config(), Config(num_workers=2), Config(precision="bf16", compile_mode="default"),
               Config(num_workers=2, data_cache="memory", pin_memory=True, sync_every=0)]
    for name, device in MACHINES.items():
        source = "nvml" if device.has_cuda else "psutil"
        for config in configs:
            for data_s in (0.001, 0.0055, 0.02, 0.035):
                for h2d_s in (0.0, 0.01):
                    for util in (30.0, 60.0, 95.0):
                        for headspace in ceilings:
                            result = with_host(synthetic_result(config, data_s=data_s, h2d_s=h2d_s, util=util,
                                                                source=source, steps=60),
                                               host_util_pct=97.0 if util > 90 else 40.0)
                            yield name, device, result, headspace, diagnose(result, device=device, headspace=headspace)


def test_no_reading_of_many_runs_contradicts_itself() -> None:
    """Over 864 readings: one limiter each, and it is the largest share; no two findings name different limits; no
    advice for a knob that cannot act on the machine or whose family a ceiling closed; no knob advised twice."""
    from accel_widgets.knobs import KNOBS
    from accel_widgets.knobs.rules import check_config

    count = 0
    for name, device, result, headspace, findings in readings():
        count += 1
        limited = [f for f in findings if f.limit is not None]
        assert len(limited) == 1, (name, [f.title for f in limited])
        assert {f.title for f in findings} & {"Data-bound", "Compute-bound", "Copy-bound", "Host-bound"} == {
            limited[0].title}
        knobs = [f.knob for f in findings if f.knob is not None]
        for knob in knobs:
            assert device.kind in KNOBS[knob].applies_to, (name, knob)
            if headspace is not None and headspace.closes(knob) is not None:
                raise AssertionError(f"{name}: {knob} advised although its ceiling reads same")
        if "precision" in knobs and not device.has_cuda and not device.cpu_has_bf16_units:
            raise AssertionError(f"{name}: bf16 advised where the precision owner says it is emulated")
        check_config(result.config, device)
    assert count == 864


def test_a_rank_well_over_the_others_own_work_is_named_the_straggler_with_its_node() -> None:
    slowed = make_result(ranks=paced([0.3, 0.6]))
    found = [f for f in diagnose(slowed) if f.title == "Straggler"]
    assert len(found) == 1 and "rank 1 on node node-b sets the pace" in found[0].detail and "2.00×" in found[0].detail
    assert not [f for f in diagnose(make_result(ranks=paced([0.3, 0.33]))) if f.title == "Straggler"]
    assert "rank 0 on node-a, rank 1 on node-b" in summary(slowed) and "pace        rank 1's" in summary(slowed)
