"""``diagnose`` on synthetic results: each rule of thumb fires on its numbers and points at the right knob."""

from __future__ import annotations

import pytest

from accel_widgets import Config, ErrorInfo
from accel_widgets.panel.diagnosis import Finding, diagnose
from tests.panel.fakes import synthetic_result


def titles(findings: list[Finding]) -> list[str]:
    return [f.title for f in findings]


def by_title(findings: list[Finding], title: str) -> Finding:
    (found,) = [f for f in findings if f.title == title]
    return found


def test_a_healthy_gpu_run_reads_as_healthy_and_points_at_the_next_lever() -> None:
    findings = diagnose(synthetic_result(util=95, source="nvml", peak_mib=40_000, total_mib=80_000))
    assert {f.severity for f in findings} == {"good"}
    assert by_title(findings, "Device kept busy").detail.startswith("GPU at 95%")
    assert by_title(findings, "Compute-bound").knob == "precision"
    assert by_title(findings, "Memory headroom").knob == "batch_size"


@pytest.mark.parametrize(
    ("config", "knob"),
    [(Config(), "num_workers"), (Config(num_workers=2), "data_cache"),
     (Config(num_workers=2, data_cache="memmap"), "prefetch_factor")],
)
def test_data_wait_above_ten_percent_is_data_bound(config: Config, knob: str) -> None:
    finding = by_title(diagnose(synthetic_result(config, data_s=0.02)), "Data-bound")
    assert finding.severity == "warn" and finding.knob == knob and "40%" in finding.detail


def test_data_wait_between_five_and_ten_percent_is_a_note() -> None:
    finding = by_title(diagnose(synthetic_result(data_s=0.004)), "Some data wait")
    assert finding.severity == "info" and finding.knob == "num_workers"
    assert "Some data wait" not in titles(diagnose(synthetic_result(data_s=0.001)))


def test_slow_host_to_device_copies_point_at_pinned_memory_then_non_blocking() -> None:
    assert by_title(diagnose(synthetic_result(h2d_s=0.01)), "Host-to-device copies are slow").knob == "pin_memory"
    pinned = synthetic_result(Config(pin_memory=True), h2d_s=0.01)
    assert by_title(diagnose(pinned), "Host-to-device copies are slow").knob == "non_blocking"


def test_low_utilisation_with_fast_steps_points_at_the_batch_size() -> None:
    finding = by_title(diagnose(synthetic_result(util=30, step_s=0.002)), "Low utilisation, fast steps")
    assert finding.knob == "batch_size" and "worker CPU at 30%" in finding.detail


def test_a_gpu_idling_while_the_loss_is_read_every_step_looks_sync_bound() -> None:
    finding = by_title(diagnose(synthetic_result(util=60, source="nvml")), "Possibly sync-bound")
    assert finding.knob == "sync_every"
    unsynced = diagnose(synthetic_result(Config(sync_every=0), util=60, source="nvml"))
    assert "Possibly sync-bound" not in titles(unsynced) and "Utilisation below 80%" in titles(unsynced)


def test_compute_bound_advice_follows_what_is_already_on() -> None:
    def knob(config: Config) -> str | None:
        return by_title(diagnose(synthetic_result(config)), "Compute-bound").knob

    assert knob(Config()) == "precision"
    assert knob(Config(precision="bf16")) == "compile_mode"
    assert knob(Config(precision="bf16", compile_mode="default")) == "channels_last"
    assert knob(Config(precision="bf16", compile_mode="default", channels_last=True)) is None


def test_memory_above_ninety_percent_suggests_accumulation() -> None:
    finding = by_title(diagnose(synthetic_result(peak_mib=950, total_mib=1000)), "Memory nearly full")
    assert finding.severity == "warn" and finding.knob == "grad_accum_steps" and "95%" in finding.detail


def test_noisy_steps_say_re_run_and_name_the_foreign_load() -> None:
    noisy = by_title(diagnose(synthetic_result(jitter=0.3)), "Noisy step times")
    assert "re-run" in noisy.detail
    loaded = by_title(diagnose(synthetic_result(jitter=0.3, util=50, foreign=40)), "Noisy step times")
    assert "~40%" in loaded.detail
    steady = diagnose(synthetic_result(util=50, foreign=15))
    assert by_title(steady, "Machine busy").severity == "info" and "Noisy step times" not in titles(steady)
    short = by_title(diagnose(synthetic_result(steps=2)), "Noisy step times")
    assert "only 2 measured steps" in short.detail


def test_result_warnings_are_shown() -> None:
    findings = diagnose(synthetic_result(warnings=["pin_memory only acts on CUDA"]))
    assert by_title(findings, "Engine warning").detail == "pin_memory only acts on CUDA"


def test_failures_are_read_first_with_their_first_line() -> None:
    oom = synthetic_result(status="failed", error=ErrorInfo("oom", "CUDA out of memory. Tried 20 GiB\nmore"))
    findings = diagnose(oom)
    assert findings[0].title == "Out of memory" and findings[0].knob == "batch_size"
    assert "more" not in findings[0].detail
    failed = diagnose(synthetic_result(status="failed", error=ErrorInfo("exception", "ValueError: bad\ntrace")))
    assert findings[0].severity == "warn" and by_title(failed, "Burst failed").detail == "ValueError: bad"


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
