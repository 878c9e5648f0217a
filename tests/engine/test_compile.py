"""torch.compile bursts on the CPU: compile time reported apart from steady state; failures are clear."""

import stat
from pathlib import Path

import pytest

from accel_widgets import Config, WorkerError, run_burst
from tests.devices import cpu_device
from tests.workloads import net_with_broken_compiler, tiny_workload

pytestmark = pytest.mark.slow


def test_a_compiled_burst_reports_compile_time_apart_and_keeps_its_kernels_in_the_private_cache(private_cache_dir):
    """One cold compile (tens of seconds on a CPU) checks both: the first step paid for compiling, and the rank's
    kernels went to the private 0700 cache, not to the shared default torch's preload fixes in the environment."""
    result = run_burst(tiny_workload(), Config(compile_mode="default"), steps=10)
    assert result.ok and result.warmup_steps == 3
    assert result.environment["model_wrappers"] == ["OptimizedModule", "TinyNet"]
    assert result.compile_s is not None and result.compile_s > 0
    assert result.first_step_s > 5 * result.step_time.median  # the first step paid for compiling
    losses = result.losses()
    assert losses[-1] < losses[0]
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
    result = run_burst(tiny_workload(), Config(parallel="ddp", world_size=2, compile_mode="default"), steps=4,
                       device=cpu_device())
    assert result.ok
    assert result.environment["model_wrappers"][:2] == ["OptimizedModule", "DistributedDataParallel"]
