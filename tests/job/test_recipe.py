"""A config in the user's own code: the plain-PyTorch snippet trains as the burst did, and the frameworks' objects
built from a recipe's keywords hold every setting."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import accel_widgets as aw
from accel_widgets import BurstOptions, Config, Workload, run_burst
from accel_widgets.job.recipe import recipe_of
from accel_widgets.knobs.precision import LOSS_TOLERANCE_AT_START
from tests.devices import cpu_device
from tests.workloads import (
    MatmulStack,
    augmented_job_workload,
    gpt_workload,
    job_workload,
    matmul_workload,
    tiny_workload,
)

STEPS = 10  # 2 warm-up steps and 8 measured ones in the burst; with 2 micro-batches a step, past an epoch's end


def snippet_losses(config: Config, workload: Workload) -> list[float]:
    """The pytorch recipe executed as pasted code (its own namespace, no accel_widgets in it) and trained."""
    code = aw.recipe(config, workload).code
    assert "accel_widgets" not in code.replace("accel_widgets measured", "")
    namespace: dict = {"__name__": "pasted"}
    exec(compile(code, "<recipe>", "exec"), namespace)
    return namespace["train"](workload.model, workload.dataset, workload.loss_fn, workload.optimizer, STEPS,
                              seed=workload.seed, make_scheduler=workload.scheduler)


def burst_losses(config: Config, workload: Workload) -> list[float]:
    burst = run_burst(workload, config, steps=STEPS - 2, options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert burst.ok, burst.error
    return burst.losses(rank=0)


@contextlib.contextmanager
def one_rank_group(tmp_path: Path):
    """A process group of this process alone (gloo), as torchrun would have joined before the snippet runs."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_pytorch_snippet_trains_loss_for_loss_as_the_burst_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loader workers (persistent, prefetching deeper), accumulation, a loss read every 3 steps, a multi-tensor
    optimizer zeroed in place, deterministic kernels and an LR schedule: equal, not close."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # the snippet sets it, as a script would
    config = Config(num_workers=2, persistent_workers=True, prefetch_factor=4, grad_accum_steps=2, sync_every=3,
                    optimizer_impl="foreach", set_to_none=False, deterministic=True)
    workload = job_workload()
    assert snippet_losses(config, workload) == burst_losses(config, workload)
    assert not torch.are_deterministic_algorithms_enabled()  # the snippet put the flag back


def test_the_snippet_with_loader_workers_on_augmented_data_trains_as_the_burst_without_them() -> None:
    """Random augmentation from torch, Python and NumPy, read by 2 persistent workers in the pasted code and in this
    process by the burst, over an epoch's end: each item's draws are keyed to the item in both, so equal."""
    workload = augmented_job_workload()
    snippet = snippet_losses(Config(num_workers=2, persistent_workers=True), workload)
    assert snippet == burst_losses(Config(), workload)


def test_the_snippet_under_ddp_with_fp16_scaling_and_no_sync_trains_as_the_burst(tmp_path: Path) -> None:
    """DDP (one rank: the wrapper, DistributedSampler and no_sync are all there) with GradScaler and accumulation."""
    config = Config(parallel="ddp", world_size=1, precision="fp16", grad_accum_steps=2)
    workload = tiny_workload()
    with one_rank_group(tmp_path):
        snippet = snippet_losses(config, workload)
    assert snippet == burst_losses(config, workload)


def test_the_snippet_in_bf16_stays_within_the_guards_tolerance_of_the_burst() -> None:
    config = Config(precision="bf16", sync_every=0)
    workload = tiny_workload()
    snippet, burst = snippet_losses(config, workload), burst_losses(config, workload)
    assert len(snippet) == len(burst) == STEPS
    assert max(abs(a - b) / abs(b) for a, b in zip(snippet, burst, strict=True)) <= LOSS_TOLERANCE_AT_START["bf16"]


def test_hf_training_arguments_built_from_the_recipe_hold_every_setting(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    config = Config(batch_size=16, num_workers=2, prefetch_factor=4, persistent_workers=True, non_blocking=True,
                    precision="bf16", grad_accum_steps=4, compile_mode="max-autotune", sync_every=5,
                    optimizer_impl="fused", deterministic=True, channels_last=True, data_cache="memory")
    made = aw.recipe(config, style="hf")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **made.kwargs)
    loading = (args.per_device_train_batch_size, args.dataloader_num_workers, args.dataloader_prefetch_factor)
    assert loading == (16, 2, 4) and args.dataloader_persistent_workers and not args.dataloader_pin_memory
    assert args.accelerator_config.non_blocking
    assert args.bf16 and not args.fp16 and args.gradient_accumulation_steps == 4 and args.logging_steps == 5
    assert args.torch_compile and args.torch_compile_mode == "max-autotune" and args.full_determinism
    assert args.optim == "adamw_torch_fused"
    assert set(made.missing) == {"channels_last", "data_cache"}
    assert "TrainingArguments(" in made.code and "torch.channels_last" in made.code


def framework_loader(style: str, workers: int) -> Any:
    """The DataLoader a framework recipe writes (its code up to the framework's object), over augmented items."""
    code = aw.recipe(Config(num_workers=workers), style=style).code
    namespace: dict[str, Any] = {"dataset": augmented_job_workload().dataset}
    exec(compile(code.partition("\ntrainer = ")[0].partition("\naccelerator = ")[0], "<recipe>", "exec"), namespace)
    return namespace["loader"]


def test_an_accelerate_loader_from_the_recipe_reads_the_same_batches_with_any_workers_once_told_the_epoch() -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    def two_epochs(workers: int) -> list[torch.Tensor]:
        try:
            loader = Accelerator(cpu=True).prepare(framework_loader("accelerate", workers))
            read = []
            for epoch in range(2):
                loader.set_epoch(epoch)  # as the recipe says: Accelerate hands it to the keyed sampler
                read += [inputs for inputs, _ in loader]
            return read
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)

    reference = two_epochs(0)
    assert len(reference) == 2  # 96 items: one full batch of 64 an epoch
    assert all(torch.equal(a, b) for a, b in zip(two_epochs(2), reference, strict=True))


def test_lightning_hands_the_recipes_keyed_sampler_the_epoch() -> None:
    from lightning.fabric.utilities.data import _set_sampler_epoch  # what Lightning's fit loop calls each epoch

    loader = framework_loader("lightning", 2)
    _set_sampler_epoch(loader, 3)
    assert {epoch for epoch, _, _ in loader.sampler} == {3}


def test_a_lightning_trainer_built_from_the_recipe_holds_every_setting() -> None:
    import lightning

    config = Config(precision="bf16", grad_accum_steps=3, cudnn_benchmark=True, num_workers=1,
                    compile_mode="default", parallel="dataparallel", script_loss=True)
    made = aw.recipe(config, style="lightning")
    trainer = lightning.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, **made.kwargs)
    assert trainer.precision == "bf16-mixed" and trainer.accumulate_grad_batches == 3
    assert made.kwargs["benchmark"] is True and torch.backends.cudnn.benchmark  # set for the process, by Lightning
    torch.backends.cudnn.benchmark = False
    assert aw.recipe(Config(deterministic=True), style="lightning").kwargs == {"deterministic": True}
    assert set(made.missing) == {"parallel", "script_loss"}
    assert "num_workers=1," in made.code and "model = torch.compile(model)" in made.code


def test_a_lightning_ddp_recipe_names_the_strategy_and_the_devices() -> None:
    made = aw.recipe(Config(parallel="ddp", world_size=2), style="lightning")
    assert made.kwargs == {"strategy": "ddp", "devices": 2} and not made.missing


def test_an_accelerator_built_from_the_recipe_holds_every_setting() -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    config = Config(precision="bf16", grad_accum_steps=2, non_blocking=True, sync_every=0, compile_mode="default",
                    parallel="ddp", world_size=2)
    made = aw.recipe(config, style="accelerate")
    try:
        accelerator = Accelerator(cpu=True, **made.kwargs)
        assert accelerator.mixed_precision == "bf16" and accelerator.gradient_accumulation_steps == 2
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert set(made.missing) == {"non_blocking", "sync_every"}
    assert "accelerate launch --num_processes 2" in made.code and "model = torch.compile(model)" in made.code


def test_an_unknown_style_is_refused_naming_the_styles() -> None:
    with pytest.raises(ValueError, match="style='keras': use one of 'pytorch', 'hf', 'lightning', 'accelerate'"):
        aw.recipe(Config(), style="keras")


def test_a_finished_runs_recipe_has_the_batch_it_trained() -> None:
    """A result holds no workload: the batch per micro-batch is its step's samples over the micro-batches."""
    from tests.panel.fakes import synthetic_result

    result = synthetic_result(Config(grad_accum_steps=2))  # 32 samples a step
    assert "batch_size=16,  # samples per micro-batch" in recipe_of(result).code
    assert recipe_of(result, "hf").kwargs["per_device_train_batch_size"] == 16


# -- the knobs of 2026 ----------------------------------------------------------------------------------------------
def test_the_snippet_compiles_block_by_block_as_the_burst_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two alike matmul blocks, each compiled in place (inductor compiles no C++ for matmuls: seconds)."""
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # inductor's progress bar would leave tqdm's monitor thread
    config = Config(compile_mode="default", compile_scope="blocks")
    workload = matmul_workload(MatmulStack)
    code = aw.recipe(config, workload).code
    assert "for block in model.get_submodule('blocks'):\n        block.compile()" in code
    assert snippet_losses(config, workload) == burst_losses(config, workload)


@pytest.mark.parametrize("mode", ["blocks", "selective"])
def test_the_snippet_recomputes_the_blocks_as_the_burst_did(mode: str) -> None:
    """Within float32's last bits, not equal: the GPT's matmuls run in MKL's threaded sgemm, which is not bitwise
    reproducible run to run without MKL_CBWR. Measured under two CPU hogs:
    4 of 24 bursts of one process differed from the others by 1-2 ulp from a single step on; with
    MKL_CBWR=AUTO,STRICT all agreed. Recomputing changes no value, so the loss proves the snippet trains the model
    the burst trained, and the code shows it recomputes."""
    config = Config(activation_checkpointing=mode)
    workload = gpt_workload(n_layer=2, seq_len=16, batch_size=8)
    assert "for block in model.get_submodule('blocks'):" in aw.recipe(config, workload).code
    assert snippet_losses(config, workload) == pytest.approx(burst_losses(config, workload), rel=1e-5, abs=0)


def _fsdp_rank(rank: int, code: str, store: str, out: str) -> None:
    """One rank of the FSDP snippet, as torchrun would start it: the group joined, the pasted code trained."""
    from tests.workloads import MatmulStack, matmul_workload

    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    try:
        workload = matmul_workload(MatmulStack)
        namespace: dict = {"__name__": "pasted"}
        exec(compile(code, "<recipe>", "exec"), namespace)
        losses = namespace["train"](workload.model, workload.dataset, workload.loss_fn, workload.optimizer, STEPS,
                                    seed=workload.seed)
        Path(out, f"{rank}.json").write_text(json.dumps(losses))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_fsdp_snippet_on_two_ranks_trains_as_the_burst(tmp_path: Path) -> None:
    """FSDP2 on 2 gloo ranks: each block, then the root, fully_shard-ed; accumulation reduces on the last micro-batch
    only; the per-rank data shards and epochs as in the burst."""
    config = Config(parallel="fsdp", world_size=2, grad_accum_steps=2, reshard_after_forward=False)
    workload = matmul_workload(MatmulStack)
    code = aw.recipe(config, workload).code
    assert "RESHARD_AFTER_FORWARD = False" in code and "set_requires_gradient_sync(micro == ACCUMULATE - 1)" in code
    torch.multiprocessing.spawn(_fsdp_rank, args=(code, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    burst = run_burst(workload, config, steps=STEPS - 2, options=BurstOptions(warmup_steps=2, device=cpu_device()))
    assert burst.ok, burst.error
    for rank in (0, 1):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == burst.losses(rank=rank)


def test_the_block_helpers_find_what_the_burst_finds() -> None:
    """A recipe without a workload finds the blocks with helper code of its own: the same as the package's."""
    from torch import nn

    from accel_widgets.demos.lm import TinyGPT
    from accel_widgets.inputs.blocks import block_modules, find_blocks
    from tests.workloads import TinyNet, WideBlocks

    code = aw.recipe(Config(compile_mode="default", compile_scope="blocks", activation_checkpointing="blocks")).code
    namespace: dict = {}
    exec(compile(code, "<recipe>", "exec"), namespace)
    encoder_decoder = nn.ModuleDict({"encoder": nn.ModuleList(nn.Linear(4, 4) for _ in range(3)),
                                     "decoder": nn.Sequential(*(nn.Linear(4, 4) for _ in range(2)))})
    for model in (TinyGPT(vocab_size=16, seq_len=8, n_layer=2, d_model=8, n_head=2), WideBlocks(16, 3), TinyNet(),
                  MatmulStack(), encoder_decoder):
        found = find_blocks(model)
        assert namespace["repeated_blocks"](model) == (list(found.modules) if found is not None else [])
        assert namespace["block_modules"](model) == block_modules(model)
    assert len(block_modules(encoder_decoder)) == 5


def test_expandable_segments_join_the_allocator_settings_the_environment_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA here: the snippet's lines run before it trains on the CPU, and leave what a burst's rank sets."""
    from accel_widgets.knobs.memory import allocator_settings_with_expandable_segments

    config, workload = Config(expandable_segments=True), tiny_workload()
    made = aw.recipe(config, workload).code
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    for mine in ("max_split_size_mb:128,expandable_segments:False", None):
        if mine is None:
            monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        else:
            monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", mine)
        namespace: dict = {}
        exec(compile(made, "<recipe>", "exec"), namespace)
        namespace["train"](workload.model, workload.dataset, workload.loss_fn, workload.optimizer, 1)
        # the user's variable where they set one, else the one torch reads first
        read = "PYTORCH_CUDA_ALLOC_CONF" if mine is not None else "PYTORCH_ALLOC_CONF"
        assert os.environ[read] == allocator_settings_with_expandable_segments(mine)
        monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    for style in ("hf", "lightning", "accelerate"):
        assert 'os.environ[alloc] = ",".join([*kept, "expandable_segments:True"])' in aw.recipe(config,
                                                                                                 style=style).code


@pytest.mark.parametrize("recipe_name", ["tensorwise", "rowwise"])
def test_the_float8_snippet_converts_the_layers_the_owner_picks(recipe_name: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """No torchao nor float8 GPU here: a stand-in torchao.float8 records the conversion the snippet asks for, and the
    snippet's filter is checked against the owner's rule on Llama-3-8B's layer shapes (meta tensors: no memory)."""
    import types

    from torch import nn

    from accel_widgets.knobs.float8 import gains_from_float8

    asked: list[tuple] = []
    fake = types.ModuleType("torchao.float8")
    fake.Float8LinearConfig = types.SimpleNamespace(from_recipe_name=lambda name: f"config:{name}")
    fake.convert_to_float8_training = lambda model, module_filter_fn, config: asked.append(
        (module_filter_fn, config)) or model
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    workload = tiny_workload()
    code = aw.recipe(Config(float8=recipe_name), workload).code
    namespace: dict = {}
    exec(compile(code, "<recipe>", "exec"), namespace)
    namespace["train"](workload.model, workload.dataset, workload.loss_fn, workload.optimizer, 1)
    (chosen, config), = asked
    assert config == f"config:{recipe_name}" and chosen is namespace["gains_from_float8"]
    shapes = [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256), (2048, 512), (1000, 4096),
              (4096, 2048), (2048, 4096), (1024, 4096)]
    for in_features, out_features in shapes:
        layer = nn.Linear(in_features, out_features, device="meta")
        assert chosen(layer, "layer") == gains_from_float8(out_features, in_features, recipe_name)
    assert not chosen(nn.LayerNorm(4096, device="meta"), "norm")


def test_every_style_of_every_new_knob_is_valid_python() -> None:
    config = Config(compile_mode="max-autotune", compile_scope="blocks", float8="rowwise", precision="bf16",
                    activation_checkpointing="selective", expandable_segments=True, parallel="fsdp", world_size=2,
                    reshard_after_forward=False, grad_accum_steps=2)
    for workload in (None, gpt_workload(n_layer=2)):
        for style in ("pytorch", "hf", "lightning", "accelerate"):
            compile(aw.recipe(config, workload, style).code, f"<{style}>", "exec")


def test_the_frameworks_objects_hold_the_new_settings(tmp_path: Path) -> None:
    """TrainingArguments, a Lightning Trainer and an Accelerator built from the recipes' keywords (on the CPU:
    Accelerate keeps its FSDP plugin for distributed runs, so the plugin object itself is read)."""
    import lightning
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    workload = gpt_workload(n_layer=2)
    checkpointed = TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                     **aw.recipe(Config(activation_checkpointing="blocks"), workload, "hf").kwargs)
    assert checkpointed.activation_checkpointing
    fsdp = Config(parallel="fsdp", world_size=2, reshard_after_forward=False, activation_checkpointing="blocks",
                  precision="bf16", compile_mode="default", compile_scope="blocks")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **aw.recipe(fsdp, workload, "hf").kwargs)
    assert args.fsdp and not args.activation_checkpointing  # FSDP's own, inside its gathers
    assert args.fsdp_plugin_args | {"fsdp_version": 2, "reshard_after_forward": False, "activation_checkpointing": True,
                                    "transformer_cls_names_to_wrap": "Block"} == args.fsdp_plugin_args
    made = aw.recipe(fsdp, workload, "lightning")
    trainer = lightning.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, **made.kwargs)
    assert type(trainer.strategy).__name__ == "ModelParallelStrategy" and trainer.num_devices == 2
    assert (trainer.strategy._data_parallel_size, trainer.strategy._tensor_parallel_size) == (2, 1)
    assert "def configure_model(self):" in made.code and "for block in self.model.get_submodule('blocks'):" in made.code
    kwargs = aw.recipe(fsdp, workload, "accelerate").kwargs
    plugin = kwargs["fsdp_plugin"]
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.activation_checkpointing) == (2, False, True)
    assert plugin.transformer_cls_names_to_wrap == ["Block"]
    try:
        accelerator = Accelerator(cpu=True, **kwargs)
        assert accelerator.state.dynamo_plugin.use_regional_compilation
        assert accelerator.state.dynamo_plugin.backend.value == "INDUCTOR"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert not any(aw.recipe(fsdp, workload, style).missing for style in ("hf", "lightning", "accelerate"))
