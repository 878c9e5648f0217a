"""The second GPU script's plan and readings, on the CPU: its dry run for an H200, its verdicts over synthetic results,
and the float8 refusal it checks where torchao is absent."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re

import pytest
import torch

from accel_widgets import BurstOptions, BurstResult, Config, StepRecord, run_burst
from accel_widgets.results.burst import RankSummary
from tests.benchmark_scripts import load_benchmark
from tests.devices import cpu_device
from tests.measured import as_measured

gm = load_benchmark("gpu_modern")
GiB = 2**30


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = gm.main(["--dry-run", *args])
    return code, capsys.readouterr().out


def test_the_dry_run_plans_the_h200_call_within_its_300_s_after_the_probes(capsys):
    """The second run's 280 s: the probes' 67 s planned first, then every rung of this script."""
    code, out = _dry_run(capsys)
    assert code == 0, out
    assert "for NVIDIA H200, 143,771 MiB (NVML): budget 280 s of the call's 300 s" in out
    assert "after the probes' 67 s" in out
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [row[3] for row in rows] == [
        "fail fast", "checkpointing off", "checkpointing blocks", "checkpointing selective", "allocator expandable",
        "parallel ddp", "parallel fsdp", "float8 off", "float8 tensorwise", "float8 rowwise"]
    assert rows[0][0] == "72" and all(row[4].startswith("PLANNED") for row in rows)
    assert "preflight PASS configs: 9 planned configs valid on NVIDIA H200" in out
    assert "ends at 272 s of 280 s" in out
    assert "FITS: every required piece runs: fail fast, float8 off, float8 tensorwise" in out


def test_a_budget_that_cannot_hold_the_float8_rungs_does_not_fit(capsys):
    code, out = _dry_run(capsys, "--budget-s", "150")
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


def test_expandable_segments_pass_only_where_the_allocator_says_the_knob_acted():
    def read(expandable: bool | None) -> BurstResult:
        result = _result(Config(precision="bf16"), allocated=60.0, reserved=64.0)
        return dataclasses.replace(result, ranks=[dataclasses.replace(result.ranks[0],
                                                                      allocator_expandable=expandable)])

    status, text = gm.expandable_verdict(read(False), read(True))
    assert status == "PASS" and text.startswith("allocator segments expandable: default False, knob on True")
    assert gm.expandable_verdict(read(False), read(False))[0] == "FAIL"  # a silent no-op
    assert gm.expandable_verdict(read(True), read(True))[0] == "FAIL"  # the machine set it for both: no comparison
    assert gm.expandable_verdict(read(None), read(None))[0] == "FAIL"  # not read


def _steps_result(config: Config, compute_ms: float, data_ms: float = 0.05, h2d_ms: float = 0.0) -> BurstResult:
    """The MLP stack on an H200: 20 measured steps of 8,192 rows with the given compute, data wait and copy."""
    total = (compute_ms + data_ms + h2d_ms) / 1e3
    steps = [StepRecord(0, i, 1.0 + i * total, data_ms / 1e3, h2d_ms / 1e3, compute_ms / 1e3, total, 8192,
                        1.0, warmup=i < 3) for i in range(23)]
    rank = RankSummary(0, 8192 * 20, 20 * total, 40 * GiB, "cuda_allocator", 0.5, 30.0, "NVIDIA H200",
                       flops_per_sample=12 * 2 * 4096 * 14336, flops_by_math={"matmul:fp8": 12 * 2 * 4096 * 14336})
    return as_measured(BurstResult(workload="mlp-stack", config=config, status="ok", warmup_steps=3, steps=steps,
                                   ranks=[rank], environment={"device_kind": "cuda", "device_name": "NVIDIA H200"}))


def test_float8_is_judged_on_the_gpus_compute_time_and_the_data_must_be_cheap():
    """bf16 + compile at 15 ms of compute, tensorwise float8 at 10 ms: 1.50x on the GPU. Before the data was made
    cheap, each step also waited ~90 ms on the loader and its copy, and samples/s read ~1.05x."""
    bf16 = _steps_result(Config(precision="bf16", compile_mode="default"), 15.0)
    float8 = _steps_result(Config(precision="bf16", compile_mode="default", float8="tensorwise"), 10.0)
    status, text = gm.float8_verdict(bf16, float8, "tensorwise")
    assert status == "INFO" and text.startswith("tensorwise: GPU compute 1.50x faster than bf16 + compile "
                                                "(15.00 -> 10.00 ms a step), samples/s 1.50x")
    assert "FLOPs: 100% matmuls in fp8" in text
    assert gm.data_cost_verdict(bf16) == ("PASS", "data wait + copy 0.3% of the bf16 step (at most 5%: above it the "
                                          "samples/s of the float8 rungs measure the loader)")
    slow_bf16 = _steps_result(bf16.config, 15.0, data_ms=60.0, h2d_ms=30.0)
    slow_float8 = _steps_result(float8.config, 10.0, data_ms=60.0, h2d_ms=30.0)
    assert gm.data_cost_verdict(slow_bf16)[0] == "FAIL"
    text = gm.float8_verdict(slow_bf16, slow_float8, "tensorwise")[1]
    assert "GPU compute 1.50x" in text and "samples/s 1.05x" in text  # what the old rung would have reported


def test_the_mlp_stacks_steps_are_taken_whole_without_a_copy_and_train():
    """Each item is a whole step's batch: the loader hands the dataset's own tensor over (no stack of 8,192 rows, no
    copy), and a burst of the stack trains on it (small here: 64 rows of 32 features)."""
    dataset = gm.StepBatches(steps=2, tokens=64, width=32)
    inputs, rows = next(iter(torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=gm.only_item)))
    assert inputs.data_ptr() in {dataset.inputs[i].data_ptr() for i in range(2)} and rows is dataset.rows
    # In this process: the script's classes travel by reference here (as __main__ on the device, by value).
    result = run_burst(gm.mlp_workload(tokens=64, width=32, hidden=64), Config(), steps=3,
                       options=BurstOptions(device=cpu_device(), isolation="inprocess"))
    assert result.ok and {step.samples for step in result.steps} == {64}


def test_torchaos_version_and_what_its_import_said_are_read_in_a_process_of_its_own(tmp_path, monkeypatch):
    fake = tmp_path / "torchao"
    (fake / "float8").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import logging, warnings\n__version__ = '0.17.0'\n"
        "logging.getLogger('torchao').warning('Failed to load /x/_C_mxfp8.so: not for this torch')\n"
        "warnings.warn('torchao was built for another torch', UserWarning)\n")
    (fake / "float8" / "__init__.py").write_text("def convert_to_float8_training(model, **kwargs):\n    return model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    found = gm.torchao_import()
    assert found["found"] and found["version"] == "0.17.0" and found["torch"] == torch.__version__
    assert found["warnings"] == ["UserWarning: torchao was built for another torch"]
    assert found["log"] == ["WARNING torchao: Failed to load /x/_C_mxfp8.so: not for this torch"]
    (fake / "float8" / "__init__.py").write_text("raise ImportError('cannot import name Float8LinearConfig')\n")
    broken = gm.torchao_import()
    assert broken["found"] and broken["error"] == "ImportError: cannot import name Float8LinearConfig"
