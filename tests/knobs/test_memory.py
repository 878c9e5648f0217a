"""The memory owner: repeated blocks, activation checkpointing (in a step and in bursts), expandable segments."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from accel_widgets import BurstOptions, Config, run_burst
from accel_widgets.analysis.compare import memory_ratio
from accel_widgets.demos.lm import TinyGPT, lm_loss
from accel_widgets.engine import worker
from accel_widgets.engine.request import BurstRequest
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs import memory
from accel_widgets.knobs.plan import resolve
from accel_widgets.knobs.rules import ConfigError
from tests.devices import cpu_device
from tests.workloads import TinyNet, gpt_workload, tiny_workload

H200 = DeviceInfo(cpu_count=16, cpu_name="host", driver="1.0",
                  gpus=(GpuInfo(0, 0, "NVIDIA H200", 143_771 * 2**20, compute_capability=(9, 0)),))


# -- activation checkpointing in a step ------------------------------------------------------------------------------
def _step(mode: str) -> tuple[float, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=32, seq_len=16, n_layer=3, d_model=16, n_head=2)
    memory.checkpoint_blocks(model, Config(activation_checkpointing=mode))
    tokens = torch.randint(0, 32, (4, 17), generator=torch.Generator().manual_seed(1))
    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["blocks", "selective"])
def test_recomputing_a_block_gives_the_same_loss_and_gradients_in_fp32(mode):
    loss, grads = _step("off")
    again, recomputed = _step(mode)
    assert again == loss
    assert all(torch.equal(a, b) for a, b in zip(grads, recomputed, strict=True))


def test_the_blocks_keep_their_parameter_names_and_run_under_checkpoint():
    model = TinyGPT(vocab_size=16, seq_len=8, n_layer=2, d_model=8, n_head=2)
    names = [name for name, _ in model.named_parameters()]
    memory.checkpoint_blocks(model, Config(activation_checkpointing="blocks"))
    assert [name for name, _ in model.named_parameters()] == names  # no wrapper module in between
    assert all(isinstance(block.forward, functools.partial) for block in model.blocks)
    assert isinstance(memory.checkpoint_blocks(TinyNet(), Config()), TinyNet)  # off: untouched


def test_a_model_without_repeated_blocks_is_refused_before_any_process_starts():
    with pytest.raises(ConfigError, match=r"Workload.model \(TinyNet\) has none: no nn.ModuleList"):
        resolve(Config(activation_checkpointing="blocks"), cpu_device(), tiny_workload())
    with pytest.raises(ValueError, match="has none"):
        memory.checkpoint_blocks(TinyNet(), Config(activation_checkpointing="selective"))
    # a factory's model is read on the meta device: nothing is allocated for its weights
    assert resolve(Config(activation_checkpointing="blocks"), cpu_device(), gpt_workload()).warnings == ()
    assert memory.room_maker(Config(), tiny_workload()) is None
    assert memory.room_maker(Config(), gpt_workload()) == Config(activation_checkpointing="blocks")
    assert memory.room_maker(Config(activation_checkpointing="selective"), gpt_workload()) is None


@pytest.mark.slow
def test_checkpointing_lowers_a_bursts_peak_and_trains_the_same():
    """A thin transformer with many tokens per step: its activations outweigh the weights (~110 MiB of them over
    8 blocks at batch 256), so recomputing them shows in the rank's peak RSS, while the fp32 losses stay equal step
    for step. (Selective checkpointing's losses and gradients are checked in a step above; its saving, smaller, is
    the benchmark's: benchmarks/memory_knobs.py.)"""
    workload, device = gpt_workload(batch_size=256), cpu_device()
    off, blocks = (run_burst(workload, Config(activation_checkpointing=mode), steps=1,
                             options=BurstOptions(warmup_steps=1, device=device))
                   for mode in ("off", "blocks"))
    assert off.ok and blocks.ok
    assert blocks.losses() == off.losses() and len(off.losses()) == 2
    saved = off.peak_memory_bytes - blocks.peak_memory_bytes
    assert saved > 40 * 2**20, (off.peak_memory_bytes, blocks.peak_memory_bytes)  # measured here: 82-95 MiB
    assert memory_ratio(blocks, off) == blocks.peak_memory_bytes / off.peak_memory_bytes


# -- expandable segments ---------------------------------------------------------------------------------------------
def test_expandable_segments_join_the_users_allocator_settings():
    merge = memory.allocator_settings_with_expandable_segments
    assert merge(None) == "expandable_segments:True"
    assert merge("max_split_size_mb:128,expandable_segments:False") == "max_split_size_mb:128,expandable_segments:True"


@pytest.mark.parametrize("variable", [None, "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_the_allocator_setting_lives_only_as_long_as_the_rank_needs_it(monkeypatch, variable):
    for name in memory.ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if variable is not None:
        monkeypatch.setenv(variable, "garbage_collection_threshold:0.8")
    before = dict(os.environ)
    target = variable or "PYTORCH_ALLOC_CONF"  # torch reads it first, and without a deprecation warning
    with memory.allocator(Config(expandable_segments=True), "cuda"):
        kept = "garbage_collection_threshold:0.8," if variable else ""
        assert os.environ[target] == f"{kept}expandable_segments:True"
    assert dict(os.environ) == before
    with memory.allocator(Config(expandable_segments=True), "cpu"), memory.allocator(Config(), "cuda"):
        assert dict(os.environ) == before  # no CUDA, or the knob off: nothing to set


def test_a_rank_sets_the_allocator_before_it_chooses_its_cuda_device(monkeypatch, tmp_path):
    """The allocator reads its settings when CUDA starts, and choosing the device starts it: the setting must be in
    the environment by then (faked: this machine's rank cannot start CUDA)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    seen = []

    def device_for(kind, rank):
        seen.append((kind, os.environ.get("PYTORCH_ALLOC_CONF")))
        raise RuntimeError("no CUDA here: the test ends at the device")

    monkeypatch.setattr(worker, "_device_for", device_for)
    plan = resolve(Config(expandable_segments=True), H200, tiny_workload())
    spec = worker.BurstSpec(plan, BurstRequest(steps=1).resolved(plan.warmup_steps), {}, 0.0, str(tmp_path))
    with pytest.raises(RuntimeError, match="the test ends at the device"):
        worker.run_rank(0, tiny_workload(), spec, emit=lambda event: None)
    assert seen == [("cuda", "expandable_segments:True")]
    assert "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_with_both_variables_set_the_setting_joins_the_one_torch_reads(monkeypatch):
    """c10's AllocatorConfig parses PYTORCH_ALLOC_CONF when it is set and PYTORCH_CUDA_ALLOC_CONF only when it is
    not: written into the second, expandable segments would be ignored without a word."""
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.8")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    with memory.allocator(Config(expandable_segments=True), "cuda"):
        assert os.environ["PYTORCH_ALLOC_CONF"] == "garbage_collection_threshold:0.8,expandable_segments:True"
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def h200_snapshot(expandable: bool, devices: tuple[int, ...] = (0,)) -> list[dict]:
    """torch.cuda.memory_snapshot() of a rank on an H200 after a 124M GPT step in bf16: a few segments of the sizes the
    allocator maps (2 MiB small-block segments, 20 MiB and larger ones; expandable: one segment that grew)."""
    sizes = [80 * 2**30] if expandable else [2 << 20, 20 << 20, 1 << 30, 24 << 30]
    return [{"device": device, "address": 0x7F0000000000 + i * 2**36, "total_size": size, "allocated_size": size // 2,
             "active_size": size // 2, "requested_size": size // 2, "stream": 0,
             "segment_type": "large" if size > 1 << 20 else "small", "is_expandable": expandable, "blocks": []}
            for device in devices for i, size in enumerate(sizes)]


@pytest.mark.parametrize("expandable", [True, False])
def test_the_rank_reads_from_the_allocator_whether_its_segments_are_expandable(monkeypatch, expandable):
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: h200_snapshot(expandable, devices=(0, 1)))
    assert memory.segments_expandable([torch.device("cuda", 0)]) is expandable
    assert memory.segments_expandable([torch.device("cuda", 0), torch.device("cuda", 1)]) is expandable
    assert memory.segments_expandable([torch.device("cuda", 2)]) is None  # no segment on that GPU yet
    assert memory.segments_expandable([torch.device("cpu")]) is None


def test_a_burst_that_asked_for_expandable_segments_and_got_fixed_ones_says_so():
    asked = Config(expandable_segments=True)
    said = memory.allocator_not_in_effect(asked, False)
    assert said is not None and said.knob == "expandable_segments" and "did not act" in said.text
    assert memory.allocator_not_in_effect(asked, True) is None and memory.allocator_not_in_effect(asked, None) is None
    assert memory.allocator_not_in_effect(Config(), True) is None  # the user's own setting: nothing wrong


@pytest.mark.parametrize("mode", ["blocks", "selective"])
def test_mfu_counts_a_checkpointed_blocks_forward_once(mode):
    """MFU is model FLOPs: the forward a checkpointed block runs again in backward is recompute, not training done.
    Counted with it, 'blocks' read a third more FLOPs per sample than the same model without checkpointing."""
    workload = gpt_workload(n_layer=2, d_model=16, seq_len=16, batch_size=8)
    off = run_burst(workload, Config(), steps=2, options=BurstOptions(warmup_steps=1, device=cpu_device()))
    checkpointed = run_burst(workload, Config(activation_checkpointing=mode), steps=2,
                             options=BurstOptions(warmup_steps=1, device=cpu_device()))
    assert off.ok and checkpointed.ok
    assert checkpointed.ranks[0].flops_by_math == pytest.approx(off.ranks[0].flops_by_math)


def test_forward_once_puts_the_checkpointed_forwards_back():
    model = TinyGPT(vocab_size=32, seq_len=8, n_layer=2, d_model=16, n_head=2)
    memory.checkpoint_blocks(model, Config(activation_checkpointing="blocks"))
    wrapped = [block.forward for block in model.blocks]
    with memory.forward_once(model):
        assert all(isinstance(block.forward, type(model.forward)) for block in model.blocks)  # bound methods again
    assert [block.forward for block in model.blocks] == wrapped
