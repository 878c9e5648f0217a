"""DDP over NCCL on a real GPU; skipped without CUDA. The GPU check runs this file after every other GPU test:
NCCL's start is the likeliest to hang, and a hang must not cost the tests that could still run."""

import pytest
import torch

from accel_widgets import BurstOptions, Config, run_burst
from tests.workloads import tiny_workload

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(45)]
BURST_TIMEOUT_S = 40


def test_ddp_on_cuda_uses_nccl_without_touching_cuda_here():
    result = run_burst(tiny_workload(), Config(parallel="ddp", world_size=1), steps=5,
                       options=BurstOptions(timeout_s=BURST_TIMEOUT_S))
    assert result.ok and result.environment["model_wrappers"][0] == "DistributedDataParallel"
    assert not torch.cuda.is_initialized()
