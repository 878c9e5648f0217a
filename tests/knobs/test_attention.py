"""The attention module, the knob added after the split: one module plus this test, nothing else to edit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import BurstOptions, Config, ConfigError, Workload, check_config, run_burst
from accel_widgets.knobs import attention
from tests.devices import cpu_device
from tests.knobs.test_rules import CPU, ONE_GPU


class TinyAttention(nn.Module):
    """One causal self-attention layer through scaled_dot_product_attention, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.head = nn.Linear(8, 24), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(out.transpose(1, 2).flatten(-2).mean(dim=1))


def kernels_run(config: Config) -> set[str]:
    x = torch.randn(2, 6, 8)
    with torch.profiler.profile() as profiler, attention.forward_context(config):
        TinyAttention()(x).sum().backward()
    return {event.key for event in profiler.key_averages() if "scaled_dot_product" in event.key}


def test_the_pinned_backend_is_the_kernel_that_runs():
    assert "aten::_scaled_dot_product_attention_math" in kernels_run(Config(sdpa_backend="math"))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels_run(Config(sdpa_backend="flash"))
    assert "aten::_scaled_dot_product_attention_math" not in kernels_run(Config(sdpa_backend="flash"))


def test_cuda_only_kernels_are_refused_on_a_cpu_before_anything_starts():
    with pytest.raises(ConfigError, match="sdpa_backend='efficient' is a CUDA kernel"):
        check_config(Config(sdpa_backend="efficient"), CPU)
    assert check_config(Config(sdpa_backend="cudnn", precision="bf16"), ONE_GPU) == []


def test_a_burst_trains_with_the_pinned_kernel_and_the_same_numbers_as_the_pick():
    generator = torch.Generator().manual_seed(0)
    data = (torch.randn(128, 6, 8, generator=generator), torch.randint(0, 4, (128,), generator=generator))
    workload = Workload(model=TinyAttention, dataset=data, loss_fn=F.cross_entropy, batch_size=16, name="attn")
    pinned = run_burst(workload, Config(sdpa_backend="math"), steps=4,
                       options=BurstOptions(isolation="inprocess", device=cpu_device()))
    picked = run_burst(workload, Config(), steps=4, options=BurstOptions(isolation="inprocess", device=cpu_device()))
    assert pinned.ok and picked.ok
    assert pinned.losses() == pytest.approx(picked.losses(), rel=1e-4)  # another kernel, the same attention


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_flash_or_cudnn_with_fp32_on_a_gpu_is_refused_before_any_process_starts(backend):
    """On CUDA both take fp16/bf16 only: with fp32 inputs the pinned kernel has nothing to run, at step 1."""
    with pytest.raises(ConfigError, match=f"sdpa_backend='{backend}' on a GPU takes fp16/bf16 inputs only"):
        check_config(Config(sdpa_backend=backend), ONE_GPU)
    for fine in (Config(sdpa_backend=backend, precision="bf16"), Config(sdpa_backend=backend, precision="fp16"),
                 Config(sdpa_backend="efficient"), Config(sdpa_backend="math")):
        check_config(fine, ONE_GPU)
    if backend == "flash":
        check_config(Config(sdpa_backend="flash"), CPU)  # the CPU's flash kernel takes fp32
