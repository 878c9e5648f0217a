"""The parallel owner's FSDP: its rules, its mixed precision, its gradient sync under accumulation, what it says
of a model without blocks. FSDP bursts themselves (2 ranks, gloo) are in tests/engine/test_fsdp.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

from accel_widgets import Config, ConfigError, check_config
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs import facts, parallel, precision
from accel_widgets.knobs.plan import resolve
from tests.workloads import gpt_workload, tiny_workload

CPU = DeviceInfo(cpu_count=2, cpu_name="Test CPU", cpu_flags=frozenset({"avx512_bf16"}))
H200S = DeviceInfo(cpu_count=16, cpu_name="Host", driver="1.0", gpus=tuple(
    GpuInfo(i, i, "NVIDIA H200", 143_771 * 2**20, compute_capability=(9, 0)) for i in range(2)))
FSDP = Config(parallel="fsdp", world_size=2)


def test_fsdp_runs_a_process_per_rank_and_shards():
    assert parallel.ranks(FSDP) == 2 and parallel.distributed(FSDP) and parallel.sharded(FSDP)
    assert not parallel.sharded(Config(parallel="ddp", world_size=2))
    assert facts(FSDP, "cuda", 2).sharded and facts(FSDP, "cuda", 2).gpus == 2
    assert resolve(FSDP, CPU, tiny_workload()).group.world_size == 2


@pytest.mark.parametrize(("config", "device", "reason"), [
    (FSDP.replace(precision="fp16"), H200S, "GradScaler checks each rank's own shard"),
    (FSDP.replace(world_size=4), H200S, "one GPU per rank for NCCL; this machine has 2"),
])
def test_what_fsdp_cannot_run_is_refused_with_the_reason(config, device, reason):
    with pytest.raises(ConfigError, match=reason):
        check_config(config, device)


def test_fsdp_with_accumulation_bf16_and_compile_runs_and_resharding_alone_warns():
    assert check_config(FSDP.replace(grad_accum_steps=4, precision="bf16", compile_mode="default"), H200S) == []
    assert any("only acts with parallel='fsdp'" in w for w in check_config(Config(reshard_after_forward=False), CPU))
    assert check_config(FSDP.replace(reshard_after_forward=False), CPU) == []


def test_the_precision_owner_picks_what_fsdp_gathers():
    """bf16: FSDP gathers and computes with bf16 copies; autocast still picks each op's dtype, as under DDP."""
    assert precision.sharded_param_dtype(Config(precision="bf16")) is torch.bfloat16
    assert precision.sharded_param_dtype(Config()) is None


def test_accumulation_reduces_fsdp_gradients_on_the_last_micro_batch_only():
    class Sharded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[bool] = []

        def set_requires_gradient_sync(self, requires: bool) -> None:
            self.calls.append(requires)

    model = Sharded()
    for micro in range(3):
        with parallel.gradient_sync(model, last_micro_batch=micro == 2):
            pass
    assert model.calls == [False, False, True]


def test_a_communication_free_burst_reduces_gradients_on_no_micro_batch():
    """The headspace's communication-free variant: DDP's no_sync around every micro-batch, FSDP's sync off on each."""
    class Sharded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[bool] = []

        def set_requires_gradient_sync(self, requires: bool) -> None:
            self.calls.append(requires)

    class Replicated(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.skipped = 0

        @contextlib.contextmanager
        def no_sync(self):
            self.skipped += 1
            yield

    sharded, replicated = Sharded(), Replicated()
    for micro in range(3):
        for model in (sharded, replicated):
            with parallel.gradient_sync(model, last_micro_batch=micro == 2, communication_free=True):
                pass
    assert sharded.calls == [False, False, False] and replicated.skipped == 3


def test_a_model_without_blocks_is_sharded_as_one_unit_and_said_so():
    notes = resolve(FSDP, CPU, tiny_workload()).warnings
    assert any("shards Workload.model (TinyNet) as one unit" in n for n in notes)
    assert not any("one unit" in n for n in resolve(FSDP, CPU, gpt_workload()).warnings)
