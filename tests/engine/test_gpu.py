"""CUDA paths, run for real on a GPU (the GPU check script runs these); skipped without CUDA."""

import json
import math
import os

import pytest
import torch

from accel_widgets import Config, WorkerError, WorkerOutOfMemory, run_burst
from tests.workloads import TinyNet, conv_workload, tiny_workload

pytestmark = pytest.mark.gpu


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


# Pinned memory and non_blocking too: a blocking copy from pageable memory is itself a host sync.
SYNC_FREE = Config(optimizer_impl="fused", pin_memory=True, non_blocking=True)


@pytest.mark.parametrize("sync_every", [0, 1])
def test_sync_debug_finds_no_host_sync_in_steady_state_steps(sync_every):
    """Under sync-debug "error" every measured step completes: only the loss read sync_every asks for syncs."""
    result = run_burst(tiny_workload(), SYNC_FREE.replace(sync_every=sync_every), steps=20, sync_debug=True)
    assert result.ok, result.summary()
    assert len(result.measured_steps()) == 20
    assert all(v is not None for v in result.losses())


def test_sync_debug_catches_a_sync_hidden_in_the_step():
    """The control: the same burst with a host read inside forward fails and names the synchronising call."""
    with pytest.raises(WorkerError, match="synchroniz"):
        run_burst(tiny_workload(HiddenSync), SYNC_FREE.replace(sync_every=0), steps=5, sync_debug=True)


@pytest.mark.parametrize("config", [Config(), SYNC_FREE.replace(sync_every=0)], ids=lambda c: c.label())
def test_cuda_steps_add_up_and_tile_the_measured_window(config):
    """What the GPU check's timing line asserts, for a syncing and a host-runs-ahead loop."""
    result = run_burst(tiny_workload(), config, steps=30)
    for step in result.measured_steps():
        assert step.data_s + step.h2d_s + step.compute_s == pytest.approx(step.total_s, rel=0.01)
    steps_total = sum(s.total_s for s in result.measured_steps(rank=0))
    assert steps_total == pytest.approx(result.ranks[0].measured_s, rel=0.02)


def test_nvml_telemetry_is_labelled_with_the_cuda_ordinal():
    result = run_burst(tiny_workload(), Config(), seconds=1.0)
    assert result.telemetry and {(s.source, s.device) for s in result.telemetry} == {("nvml", "cuda:0")}
    total = result.telemetry[0].mem_total_bytes
    assert total and 0 < result.peak_memory_bytes <= total


def test_profile_captures_cuda_kernels(tmp_path):
    result = run_burst(tiny_workload(), Config(), steps=5, profile_steps=3, profile_dir=str(tmp_path))
    assert result.profile is not None and os.path.isfile(result.profile.trace_path)
    assert any(op.self_device_ms > 0 for op in result.profile.top_operators)
    with open(result.profile.trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    assert any(str(e.get("cat", "")).lower() == "kernel" for e in events)


def test_fp16_with_the_fused_optimizer_trains_and_rarely_skips():
    result = run_burst(tiny_workload(), Config(precision="fp16", optimizer_impl="fused"), steps=30)
    losses = result.losses()
    assert result.ok and sum(losses[-5:]) < sum(losses[:5])
    assert result.ranks[0].scaler_skipped_steps is not None and result.ranks[0].scaler_skipped_steps <= 5


def test_channels_last_conv_net_trains_on_cuda():
    result = run_burst(conv_workload(), Config(channels_last=True, cudnn_benchmark=True), steps=10)
    assert result.ok and all(v is not None and math.isfinite(v) for v in result.losses())
