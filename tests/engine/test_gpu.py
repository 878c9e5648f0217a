"""CUDA paths no check of the GPU check covers, run for real on a GPU; skipped without CUDA.

``benchmarks/gpu_check.py`` runs these in its one call, after its own checks on short bursts (timing,
telemetry, MFU, profiling, sync-free steps, fp16 + fused AdamW, channels_last, reduce-overhead), which
therefore are not repeated here. Each test has 45 s and each burst 60 s at most (the call's plan checks that,
``gpu_check.audit_gpu_tests``); DDP over NCCL is in ``test_gpu_ddp.py``, which runs last.
"""

import pytest
import torch

from accel_widgets import BurstOptions, Config, WorkerError, WorkerOutOfMemory, run_burst
from tests.workloads import TinyNet, fast_learning_workload, loss_fell, tiny_workload

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(45)]
BURST_TIMEOUT_S = 40  # under the test's own timeout: a hung burst ends as a BurstTimeout, not a killed test


class HiddenSync(TinyNet):
    """Reads a value back to the host inside forward: the kind of sync a model can hide in a training step."""

    def forward(self, x):
        if float(x.abs().sum()) < 0:  # never true; the read itself is the point
            raise AssertionError("unreachable")
        return super().forward(x)


class Hog(TinyNet):
    """Allocates far more than a small memory fraction allows."""

    def forward(self, x):
        torch.empty(64 * 2**30, dtype=torch.uint8, device=x.device)
        return super().forward(x)


@pytest.mark.parametrize("config", [Config(precision="bf16", tf32=True), Config(empty_cache=True)],
                         ids=lambda c: c.label())
def test_cuda_knobs_train(config):
    result = run_burst(fast_learning_workload(), config, steps=10, options=BurstOptions(timeout_s=BURST_TIMEOUT_S))
    assert result.ok
    assert loss_fell(result.losses()), result.losses()


def test_memory_fraction_caps_the_worker():
    with pytest.raises(WorkerOutOfMemory):
        run_burst(tiny_workload(Hog()), Config(memory_fraction=0.1), steps=3,
                  options=BurstOptions(timeout_s=BURST_TIMEOUT_S))


def test_sync_debug_catches_a_sync_hidden_in_the_step():
    """The control of the GPU check's "no host sync": the same burst with a host read inside forward fails and
    names the synchronising call."""
    config = Config(optimizer_impl="fused", pin_memory=True, non_blocking=True, sync_every=0)
    with pytest.raises(WorkerError, match="synchroniz"):
        run_burst(tiny_workload(HiddenSync), config, steps=5,
                  options=BurstOptions(sync_debug=True, timeout_s=BURST_TIMEOUT_S))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DataParallel needs two GPUs")
def test_dataparallel_runs_on_two_gpus():
    result = run_burst(tiny_workload(), Config(parallel="dataparallel"), steps=5,
                       options=BurstOptions(timeout_s=BURST_TIMEOUT_S))
    assert result.ok and result.environment["model_wrappers"][0] == "DataParallel"
