"""The second GPU script's plan and readings, on the CPU: its dry run for an H200, its verdicts over synthetic results,
and the float8 refusal it checks where torchao is absent."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from accel_widgets import BurstResult, Config, RankSummary
from tests.benchmark_scripts import load_benchmark
from tests.measured import as_measured

gm = load_benchmark("gpu_modern")
GiB = 2**30


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = gm.main(["--dry-run", *args])
    return code, capsys.readouterr().out


def test_the_dry_run_plans_the_h200_call_within_its_300_s(capsys):
    code, out = _dry_run(capsys)
    assert code == 0, out
    assert "for NVIDIA H200, 143,771 MiB (NVML): budget 280 s of the call's 300 s" in out
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [row[3] for row in rows] == [
        "fail fast", "checkpointing off", "checkpointing blocks", "checkpointing selective", "allocator default",
        "allocator expandable", "parallel ddp", "parallel fsdp", "float8 off", "float8 tensorwise", "float8 rowwise"]
    assert all(row[4].startswith("PLANNED") for row in rows)
    assert "preflight PASS configs: 10 planned configs valid on NVIDIA H200" in out
    assert "FITS: every required piece runs: fail fast, float8 off, float8 tensorwise" in out


def test_a_budget_that_cannot_hold_the_float8_rungs_does_not_fit(capsys):
    code, out = _dry_run(capsys, "--budget-s", "100")
    assert code == 1
    assert "DOES NOT FIT: required but not run in full: float8 tensorwise" in out


def _result(config: Config, *, allocated: float, reserved: float | None = None, state: float | None = None,
            rate: float = 100.0, ranks: int = 1) -> BurstResult:
    summaries = [RankSummary(rank, int(rate), 1.0, int(allocated * GiB), "cuda_allocator", 0.1, 0.2, "NVIDIA H200",
                             peak_reserved_bytes=None if reserved is None else int(reserved * GiB),
                             model_state_bytes=None if state is None else int(state * GiB)) for rank in range(ranks)]
    return as_measured(BurstResult(workload="lm-gpu", config=config, status="ok", world_size=ranks, ranks=summaries,
                                   environment={"device_kind": "cuda"}))


def test_checkpointing_must_lower_the_allocators_peak():
    off = _result(Config(), allocated=60.0, reserved=64.0)
    status, text = gm.checkpointing_verdict(off, _result(Config(), allocated=21.0, reserved=24.0), "blocks")
    assert status == "PASS" and text.startswith("blocks: peak 0.35x of off's")
    assert "reserved 24.00 GiB (12% unused at peak)" in text
    assert gm.checkpointing_verdict(off, _result(Config(), allocated=61.0), "selective")[0] == "FAIL"


def test_fsdp_must_halve_the_state_per_rank_from_two_gpus_on():
    ddp = _result(Config(parallel="ddp", world_size=2), allocated=40.0, state=16.0, ranks=2)
    halved = _result(Config(parallel="fsdp", world_size=2), allocated=30.0, state=8.0, ranks=2)
    assert gm.sharding_verdict(ddp, halved)[0] == "PASS"
    assert gm.sharding_verdict(ddp, _result(Config(parallel="fsdp", world_size=2), allocated=30.0, state=16.0,
                                            ranks=2))[0] == "FAIL"
    one = _result(Config(parallel="fsdp"), allocated=40.0, state=16.0)
    assert gm.sharding_verdict(_result(Config(parallel="ddp"), allocated=40.0, state=16.0), one)[0] == "INFO"


def test_without_torchao_a_float8_rung_checks_the_refusal_names_the_install_line(monkeypatch, tmp_path):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else found(name, *a))
    budget = gm.Budget(100.0)
    report = gm.Report(tmp_path / "gpu_modern.json", {}, budget)
    call = gm.Call(report, gm.fake_h200(), gm.parse_args([]))
    config = next(config for name, _, config in gm.rungs(call.device) if name == "float8 tensorwise")
    assert call.rung("float8 tensorwise", "mlp-stack", config, timeout=60.0) == "PASS"
    (check,) = json.loads((tmp_path / "gpu_modern.json").read_text())["checks"]
    assert check["message"].startswith("torchao absent, refused: float8='tensorwise' trains through torchao") and \
        check["message"].endswith("pip install torchao")
