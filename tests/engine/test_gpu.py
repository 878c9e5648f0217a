"""CUDA paths, run for real on a GPU (the GPU check script runs these); skipped without CUDA."""

import pytest
import torch

from accel_widgets import Config, WorkerOutOfMemory, run_burst
from tests.workloads import TinyNet, tiny_workload

pytestmark = pytest.mark.gpu


class Hog(TinyNet):
    """Allocates far more than a small memory fraction allows."""

    def forward(self, x):
        torch.empty(64 * 2**30, dtype=torch.uint8, device=x.device)
        return super().forward(x)


def test_cuda_burst_times_with_events_and_samples_nvml():
    result = run_burst(tiny_workload(), Config(pin_memory=True, non_blocking=True), steps=20, seconds=None)
    assert result.ok and result.memory_kind == "cuda_allocator"
    assert result.environment["device_kind"] == "cuda"
    assert all(s.source == "nvml" for s in result.telemetry)
    assert not torch.cuda.is_initialized()  # the calling process stayed CUDA-free


@pytest.mark.parametrize("config", [Config(precision="fp16"), Config(precision="bf16", tf32=True),
                                    Config(cudnn_benchmark=True, optimizer_impl="fused", sync_every=0),
                                    Config(compile_mode="reduce-overhead"), Config(empty_cache=True)],
                         ids=lambda c: c.label())
def test_cuda_knobs_train(config):
    result = run_burst(tiny_workload(), config, steps=10)
    assert result.ok
    assert result.losses()[-1] < result.losses()[0]


def test_memory_fraction_caps_the_worker():
    with pytest.raises(WorkerOutOfMemory):
        run_burst(tiny_workload(Hog()), Config(memory_fraction=0.1), steps=3)


def test_ddp_on_cuda_uses_nccl_without_touching_cuda_here():
    result = run_burst(tiny_workload(), Config(parallel="ddp", world_size=1), steps=5)
    assert result.ok and result.environment["model_wrappers"][0] == "DistributedDataParallel"
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DataParallel needs two GPUs")
def test_dataparallel_runs_on_two_gpus():
    result = run_burst(tiny_workload(), Config(parallel="dataparallel"), steps=5)
    assert result.ok and result.environment["model_wrappers"][0] == "DataParallel"
