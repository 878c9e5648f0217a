import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import Config, RankSummary, run_burst
from accel_widgets.flops import count_training_flops, peak_flops
from tests.test_results import make_result
from tests.workloads import tiny_workload


def test_training_flops_of_a_first_linear_layer_are_four_per_weight_per_sample():
    """Forward 2*in*out per sample; backward only the weight gradient: the input needs none."""
    layer = nn.Linear(64, 32, bias=False)
    x, y = torch.randn(8, 64), torch.randn(8, 32)
    flops = count_training_flops(layer, lambda m: F.mse_loss(m(x), y), contextlib.nullcontext)
    assert flops == 4 * 64 * 32 * 8
    assert layer.weight.grad is None


@pytest.mark.parametrize(
    ("name", "math", "tflops"),
    [("NVIDIA H200", "bf16", 989.4), ("NVIDIA H100 PCIe", "fp16", 756.0),
     ("NVIDIA A100-SXM4-80GB", "tf32", 156.0), ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
     ("NVIDIA L40S", "bf16", 362.0), ("NVIDIA L4", "bf16", 121.0), ("Tesla T4", "tf32", 8.1)],
)
def test_peak_table_picks_the_most_specific_gpu_and_math_mode(name, math, tflops):
    assert peak_flops(name, math) == pytest.approx(tflops * 1e12)


def test_unknown_devices_and_missing_modes_have_no_peak():
    assert peak_flops("AMD EPYC 9654", "fp32") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None


def test_mfu_from_measured_rate_and_peak():
    rank = RankSummary(0, measured_samples=1000, measured_s=1.0, peak_memory_bytes=0, memory_kind="cuda_allocator",
                       setup_s=0.0, first_step_s=0.0, device="NVIDIA H200", flops_per_sample=1e9)
    result = make_result(config=Config(precision="bf16"), world_size=1, ranks=[rank],
                         environment={"device_kind": "cuda", "device_name": "NVIDIA H200"})
    assert result.achieved_flops_per_s == pytest.approx(1e12)
    assert result.mfu == pytest.approx(1e12 / 989.4e12)
    cpu = make_result(ranks=[rank], world_size=1, environment={"device_kind": "cpu"})
    assert cpu.achieved_flops_per_s == pytest.approx(1e12) and cpu.mfu is None


def test_bursts_report_flops_per_sample():
    result = run_burst(tiny_workload(), Config(), steps=3)
    # TinyNet 16->32->4: the first layer needs no input gradient (4 FLOPs per weight), the second does (6)
    assert result.ranks[0].flops_per_sample == pytest.approx(4 * 16 * 32 + 6 * 32 * 4)
    assert result.achieved_flops_per_s > 0
