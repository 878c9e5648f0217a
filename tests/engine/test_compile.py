"""torch.compile bursts on the CPU: compile time reported apart from steady state; failures are clear."""

import stat
from pathlib import Path

import pytest

from accel_widgets import BurstOptions, Config, WorkerError, run_burst
from accel_widgets.analysis.diagnosis import diagnose
from accel_widgets.views.text import summary
from tests.devices import cpu_device
from tests.workloads import (
    MatmulStack,
    PrintingNet,
    ShrinkingBatches,
    halving_workload,
    loss_fell,
    matmul_workload,
    net_with_broken_compiler,
    tiny_workload,
)

pytestmark = pytest.mark.slow


def test_a_compiled_burst_reports_compile_time_apart_and_keeps_its_kernels_in_the_private_cache(private_cache_dir):
    """One cold compile checks both: the first step paid for compiling, and the rank's compiled graphs went to the
    private 0700 cache, not to the shared default torch's preload fixes in the environment."""
    result = run_burst(halving_workload(), Config(compile_mode="default"), steps=10)
    assert result.ok and result.warmup_steps == 3
    assert result.environment["model_wrappers"] == ["OptimizedModule", "MatmulBlock"]
    assert result.compile_s is not None and result.compile_s > 0
    assert result.first_step_s > 5 * result.step_time.median  # the first step paid for compiling
    report = result.compile_report
    assert (report.scope, report.graphs, report.graph_break_count, report.recompiles) == ("the whole model", 1, 0, 0)
    assert 0 < report.compile_s < result.first_step_s
    assert "  compile     " in summary(result) and "1 graph, no graph breaks, no recompiles" in summary(result)
    assert loss_fell(result.losses()), result.losses()
    cache = Path(private_cache_dir) / "inductor"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert any(path.is_file() for path in cache.rglob("*"))


def test_a_compiler_failure_is_a_clear_error_naming_the_knob():
    workload = tiny_workload()
    workload.model = net_with_broken_compiler
    with pytest.raises(WorkerError, match=r"torch.compile\(mode='default'\) failed at the first step") as info:
        run_burst(workload, Config(compile_mode="default"), steps=3)
    assert "compile_mode='off'" in str(info.value)


def test_compile_composes_with_ddp():
    result = run_burst(halving_workload(), Config(parallel="ddp", world_size=2, compile_mode="default"), steps=4,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok
    assert result.environment["model_wrappers"][:2] == ["OptimizedModule", "DistributedDataParallel"]


def test_alike_blocks_compile_in_place_inside_ddp_as_one_graph():
    result = run_burst(matmul_workload(MatmulStack), Config(parallel="ddp", world_size=2, compile_mode="default",
                                                            compile_scope="blocks"), steps=3,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok, result.error
    assert result.environment["model_wrappers"] == ["DistributedDataParallel", "MatmulStack"]  # compiled in place
    report = result.compile_report
    assert report.scope == ("2 x MatmulBlock at blocks (97% of the parameters), each compiled; the code between them "
                            "eager")
    assert (report.graphs, report.graph_break_count, report.recompiles) == (1, 0, 0)  # one graph for both blocks
    assert result.code_paths is not None and result.ranks[0].flops_per_sample  # read eagerly, after the window


def test_a_graph_break_and_a_new_shape_every_step_are_counted_and_said():
    """One burst for both: a print between two matmuls, and batches one sample shorter every step (torch makes the
    batch dimension dynamic after its first recompile, so each of the two graphs recompiles once)."""
    result = run_burst(matmul_workload(PrintingNet, collate_fn=ShrinkingBatches()), Config(compile_mode="default"),
                       steps=3)
    assert result.ok, result.error
    report = result.compile_report
    assert (report.graphs, report.graph_break_count, report.recompiles) == (4, 2, 2)
    (found,) = report.graph_breaks
    assert (found.where(), found.code) == (f"workloads.py:{PrintingNet.forward.__code__.co_firstlineno + 2} in "
                                          "forward", 'print("batch of", x.shape[0])')
    assert {r.reason.split(". expected")[0] for r in report.recompile_reasons} == {
        "tensor 'x' size mismatch at index 0"}
    text = summary(result)
    assert f"graph break {found.text()}" in text and "recompiled  1x in forward (workloads.py:" in text
    findings = {f.title: f for f in diagnose(result)}
    assert findings["Graph breaks"].detail.startswith(f"compile broke the graph 2x at {found.where()} (`print(")
    assert findings["Recompiles"].detail.startswith("recompiled 2x in 6 steps because tensor 'x' size mismatch")
