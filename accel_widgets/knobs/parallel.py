"""Data parallelism: DDP ranks (one process per rank, each with the whole model), FSDP ranks (one process per rank,
each holding a shard of the parameters, gradients and optimizer state: ``torch.distributed.fsdp.fully_shard``), or
legacy DataParallel (one process, several GPUs).

Owns how many processes a burst runs, how the model is wrapped and when gradients are reduced.
The process group itself (its rendezvous and sockets) is the engine's: :mod:`accel_widgets.engine.group`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..inputs.blocks import block_modules
from . import batch, precision
from .base import (
    Climb,
    Code,
    Construct,
    Knob,
    RecipeContext,
    RecipeEntry,
    RecipePart,
    Remedy,
    Rule,
    Search,
    Setting,
    Style,
    Symptom,
    blocks_code,
    helper_parts,
    no_equivalent,
    powers_of_two,
)
from .owner import Owner

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo, GpuInfo
    from ..inputs.workload import Workload
    from .config import Config

_MORE_DEVICES = "it changes how many processes and devices train (compare with scaling_efficiency)"

GROUP = "parallel"
TITLE = "Parallel"

KNOBS = [
    Knob(
        "parallel", "parallel", str, "none", choices=("none", "dataparallel", "ddp", "fsdp"),
        short="",
        what="Data parallelism: one process over several GPUs (DataParallel), one process per rank with the whole "
        "model (DDP), or one process per rank holding a shard of it (FSDP2's fully_shard, per repeated block "
        "and on the root).",
        why="More devices process more samples per second; DDP avoids DataParallel's single-process GIL "
        "and scatter/gather bottleneck; FSDP divides the parameters, gradients and optimizer state by the ranks, "
        "gathering each block's parameters only while it computes.",
        when="Several local GPUs (or CPU ranks with gloo for learning DDP); prefer DDP while the model and its "
        "optimizer state fit on one device, FSDP when they do not (or leave too little room for activations).",
        search=Search(left_out=_MORE_DEVICES),
    ),
    Knob(
        "world_size", "parallel", int, 1, minimum=1, maximum=1024,
        short="ranks",
        what="Number of DDP or FSDP ranks (processes).",
        why="Each rank trains on its own shard of every global batch.",
        when="With parallel='ddp' or 'fsdp': one rank per GPU, or a few CPU ranks.",
        search=Search(left_out=_MORE_DEVICES,
                      values=lambda ctx: powers_of_two(len(ctx.device.gpus) or ctx.device.cpu_count)),
    ),
    Knob(
        "reshard_after_forward", "parallel", bool, True,
        short="reshard",
        what="FSDP: free each block's gathered parameters after its forward, and gather them again for backward.",
        why="On (ZeRO-3): a rank holds one block's full parameters at a time. Off (ZeRO-2 style): they stay "
        "gathered from forward to backward, saving one all-gather per block and step at the memory of the "
        "whole unsharded model.",
        when="With parallel='fsdp': turn it off where the unsharded parameters fit and the all-gathers show in "
        "the step time.",
    ),
]

_GROUPS = ("ddp", "fsdp")  # one process per rank, in a process group

RULES = [
    Rule(
        ("parallel",), "error",
        lambda c, d: c.parallel == "dataparallel" and len(d.gpus) < 2,
        lambda c, d: f"parallel='dataparallel' needs at least 2 GPUs; this machine has {len(d.gpus)}. "
        "DataParallel is the legacy single-process option: prefer parallel='ddp'.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel in _GROUPS and d.has_cuda and c.world_size > len(d.gpus),
        lambda c, d: f"world_size={c.world_size} needs one GPU per rank for NCCL; this machine has "
        f"{len(d.gpus)}. Use world_size <= {len(d.gpus)}.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel not in _GROUPS and c.world_size != 1,
        lambda c, d: f"world_size={c.world_size} only applies with parallel='ddp' or 'fsdp'; set one of them "
        "or world_size=1.",
    ),
    Rule(
        ("parallel", "world_size"), "warning",
        lambda c, d: c.parallel in _GROUPS and not d.has_cuda and c.world_size > d.cpu_count,
        lambda c, d: f"{c.world_size} CPU ranks on {d.cpu_count} cores: ranks will fight for cores and "
        "throughput will drop.",
    ),
    Rule(
        ("parallel", "precision"), "error",
        lambda c, d: c.parallel == "fsdp" and precision.needs_loss_scaling(c),
        lambda c, d: "parallel='fsdp' with precision='fp16': torch.amp.GradScaler checks each rank's own shard of "
        "the gradients for inf/NaN and the ranks do not agree, so one rank could skip a step another takes. Use "
        "precision='bf16' (no loss scaling), or parallel='ddp'.",
    ),
    Rule(
        ("reshard_after_forward", "parallel"), "warning",
        lambda c, d: not c.reshard_after_forward and c.parallel != "fsdp",
        lambda c, d: "reshard_after_forward=False only acts with parallel='fsdp'; here it changes nothing.",
    ),
]


LADDER: list[Climb] = []

REMEDIES: dict[Symptom, Callable[[Config], Remedy | None]] = {
    "one_process_many_gpus": lambda c: Remedy("parallel", "one Python process drives every GPU and scatters each "
                                              "batch from GPU 0: DDP (one process per GPU) avoids both bottlenecks")
    if single_process_multi_gpu(c) else None,
}


_KNOB = {knob.name: knob for knob in KNOBS}
_NO_DATAPARALLEL = "DataParallel is single-process legacy: run DDP, one process per GPU (torchrun)"
_JOIN = ('if not dist.is_initialized():  # under torchrun: its environment says where the ranks meet\n'
         '    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")')


def _ddp(config: Config, context: RecipeContext) -> list[RecipePart]:
    """Plain PyTorch: join torchrun's group, shard the data per rank, wrap (DDP) or shard (FSDP) the model, reduce
    gradients only on the micro-batch that steps."""
    if config.parallel == "dataparallel":
        return [Code("parallel", "wrap", "model = nn.DataParallel(model)", _NO_DATAPARALLEL)]
    if not distributed(config):
        return []
    parts: list[RecipePart] = [
        Code("parallel", "imports", "import torch.distributed as dist"),
        Code("parallel", "imports", "from torch.utils.data import DistributedSampler"),
        Code("parallel", "setup", _JOIN),
        Code("parallel", "setup", "rank, world_size = dist.get_rank(), dist.get_world_size()"),
        Code("parallel", "sampler", "sampler = (DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
                                    "shuffle=True, seed=seed)\n           if world_size > 1 else "
                                    "RandomSampler(dataset, generator=generator))",
             "each rank trains on its own shard of every epoch (one rank: the plain shuffle, as in a burst)"),
    ]
    if sharded(config):
        return parts + _fully_shard_lines(config, context)
    parts.append(Code("parallel", "wrap", _DDP_WRAP))
    if batch.micro_batches(config) > 1:
        parts.append(Code("parallel", "around_backward", "model.no_sync() if micro < ACCUMULATE - 1 else "
                                                         "contextlib.nullcontext()",
                          "DDP all-reduces gradients only on the micro-batch that steps the optimizer"))
    return parts


_DDP_WRAP = ('model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" '
             "else None)")
_FSDP_WHY = ("FSDP2: each block is a unit whose parameters are gathered just before its forward, the root holds the "
             "rest; gathered and computed in the precision policy's dtype, gradients reduced in fp32")


def _fully_shard_lines(config: Config, context: RecipeContext) -> list[RecipePart]:
    """:func:`_fully_shard` as code, and :func:`gradient_sync`'s FSDP half when accumulating."""
    blocks, helper = blocks_code(context, "model", one_stack=False)
    parts: list[RecipePart] = [
        Code("parallel", "imports", "from torch.distributed.device_mesh import init_device_mesh"),
        Code("parallel", "imports", "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"),
        *helper_parts("parallel", "helpers", helper),
        Code("parallel", "wrap", f"mesh = init_device_mesh(device.type, (world_size,))\n{_policy(config)}\n"
                                 f"for block in {blocks}:\n    {_SHARD.format('block')}\n{_SHARD.format('model')}",
             _FSDP_WHY),
    ]
    if batch.micro_batches(config) > 1:
        parts.append(Code("parallel", "micro_batch", "model.set_requires_gradient_sync(micro == ACCUMULATE - 1)",
                          "FSDP reduce-scatters gradients only on the micro-batch that steps the optimizer"))
    return parts


_SHARD = "fully_shard({}, mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD, mp_policy=policy)"


def _policy(config: Config) -> str:
    """The precision owner's dtype for what FSDP gathers, as code."""
    return (f"policy = MixedPrecisionPolicy(param_dtype={precision.sharded_param_dtype(config)}, "
            "reduce_dtype=torch.float32)")


def _block_classes(context: RecipeContext) -> list[str]:
    """The class names of the blocks FSDP wraps, where the workload's model can be read: what the frameworks' wrap
    policies match (each falls back to a Hugging Face model's ``_no_split_modules`` without them)."""
    workload = context.workload
    outline = workload.model_outline() if workload is not None else None
    if outline is None:
        return []
    return sorted({type(block).__name__ for block in block_modules(outline, workload.blocks)})


def _hf_parallel(config: Config, context: RecipeContext) -> list[RecipePart]:
    if config.parallel == "dataparallel":
        return no_equivalent(_KNOB["parallel"], _NO_DATAPARALLEL)(config, context)
    if not sharded(config):
        return [Code("parallel", "code", "# the Trainer runs DDP itself when launched by torchrun")] if distributed(
            config) else []
    classes = _block_classes(context)
    return [Setting("parallel", "fsdp", True, why=_FSDP_WHY),
            Setting("parallel", "fsdp_config", {"version": 2}),
            *([Setting("parallel", "transformer_layer_cls_to_wrap", classes, call="fsdp_config")] if classes else [])]


def _lightning_parallel(config: Config, context: RecipeContext) -> list[RecipePart]:
    """DDP is Lightning's "ddp" strategy; FSDP2 is its ModelParallelStrategy, which shards nothing itself: the
    LightningModule's ``configure_model`` calls ``fully_shard`` as the burst does (Lightning's FSDPStrategy is FSDP1's
    FullyShardedDataParallel wrapper, whose flat parameters are not what the burst measured)."""
    if single_process_multi_gpu(config):
        return no_equivalent(_KNOB["parallel"], _NO_DATAPARALLEL)(config, context)
    if not sharded(config):
        return [Setting("parallel", "strategy", "ddp")] if distributed(config) else []
    blocks, helper = blocks_code(context, "self.model", one_stack=False)
    hook = ("# in your LightningModule (self.model: your nn.Module):\n"
            "def configure_model(self):\n"
            "    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n\n"
            '    mesh = self.device_mesh["data_parallel"]\n'
            f"    {_policy(config)}\n"
            f"    for block in {blocks}:\n        {_SHARD.format('block')}\n"
            f"    {_SHARD.format('self.model')}")
    return [Setting("parallel", "strategy", Construct("lightning.pytorch.strategies", "ModelParallelStrategy"),
                    why=_FSDP_WHY),
            Setting("parallel", "data_parallel_size", ranks(config), call="strategy"),
            Setting("parallel", "tensor_parallel_size", 1, call="strategy"),
            Code("parallel", "code", "import torch"), *helper_parts("parallel", "code", helper),
            Code("parallel", "code", hook)]


def _accelerate_parallel(config: Config, context: RecipeContext) -> list[RecipePart]:
    if config.parallel == "dataparallel":
        return no_equivalent(_KNOB["parallel"], _NO_DATAPARALLEL)(config, context)
    if not sharded(config):
        return [Code("parallel", "code", "# Accelerator runs DDP itself when launched by accelerate launch or "
                                         "torchrun")] if distributed(config) else []
    classes = _block_classes(context)
    plugin = "fsdp_plugin"
    return [Setting("parallel", plugin, Construct("accelerate.utils", "FullyShardedDataParallelPlugin"),
                    why=_FSDP_WHY),
            Setting("parallel", "fsdp_version", 2, call=plugin),
            Setting("parallel", "auto_wrap_policy", "transformer_based_wrap", call=plugin),
            *([Setting("parallel", "transformer_cls_names_to_wrap", classes, call=plugin)] if classes else [])]


def _launch(prefix: str, command: str) -> RecipeEntry:
    """The launch line of a DDP or FSDP run of ``ranks(config)`` processes per machine."""
    return lambda config, context: [Code("world_size", prefix, command.format(ranks(config)))] if distributed(
        config) else []


_RESHARD_WHY = {True: "a rank holds one block's gathered parameters at a time (gathered again for backward)",
                False: "gathered parameters stay from forward to backward: one all-gather per block and step fewer, "
                       "for the memory of the unsharded model"}


def _reshard(style: Style) -> RecipeEntry:
    """FSDP's ``reshard_after_forward``, written under FSDP whatever its value (the burst passed it explicitly): a
    constant the plain loop's and Lightning's ``fully_shard`` calls read, an entry of the frameworks' FSDP
    settings."""

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if not sharded(config):
            return []
        value = config.reshard_after_forward
        why = _RESHARD_WHY[value]
        if style in ("pytorch", "lightning"):
            return [Code("reshard_after_forward", "constants" if style == "pytorch" else "code",
                         f"RESHARD_AFTER_FORWARD = {value}", why)]
        return [Setting("reshard_after_forward", "reshard_after_forward", value,
                        call="fsdp_config" if style == "hf" else "fsdp_plugin", why=why)]

    return entry


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "parallel": {
        "pytorch": _ddp,
        "hf": _hf_parallel,
        "lightning": _lightning_parallel,
        "accelerate": _accelerate_parallel,
    },
    "world_size": {
        "pytorch": _launch("doc", "torchrun --nproc-per-node {} your_script.py"),
        "hf": _launch("code", "# launch: torchrun --nproc-per-node {} your_script.py"),
        "lightning": lambda config, context: [Setting("world_size", "devices", ranks(config))] if distributed(
            config) else [],
        "accelerate": _launch("code", "# launch: accelerate launch --num_processes {} your_script.py"),
    },
    "reshard_after_forward": {style: _reshard(style) for style in ("pytorch", "hf", "lightning", "accelerate")},
}


def single_process_multi_gpu(config: Config) -> bool:
    """Legacy DataParallel: one process drives every visible GPU."""
    return config.parallel == "dataparallel"


def ranks(config: Config) -> int:
    """Processes a burst of this config runs: DDP or FSDP ranks, else one."""
    return config.world_size if config.parallel in _GROUPS else 1


def distributed(config: Config) -> bool:
    """Whether the ranks form a process group (DDP or FSDP, one rank included: that measures what the wrapper itself
    costs)."""
    return config.parallel in _GROUPS


def sharded(config: Config) -> bool:
    """Whether each rank holds a shard of the parameters, gradients and optimizer state (FSDP)."""
    return config.parallel == "fsdp"


def keeps_gathered(config: Config) -> bool:
    """Whether FSDP keeps every block's gathered parameters from forward to backward (``reshard_after_forward`` off):
    a rank then holds the whole unsharded model at its peak."""
    return sharded(config) and not config.reshard_after_forward


def model_notes(workload: Workload, config: Config) -> list[str]:
    """What FSDP will do with ``workload``'s model, said before any process starts: a model without repeated blocks
    is sharded as one unit (every parameter gathered at once, nothing to overlap)."""
    if not sharded(config):
        return []
    outline = workload.model_outline()
    if outline is None or block_modules(outline, workload.blocks):
        return []
    return [f"parallel='fsdp' shards Workload.model ({type(outline).__name__}) as one unit: it has no repeated "
            "blocks (an nn.ModuleList or nn.Sequential of two or more modules of one class), so every parameter "
            "is gathered at once and no block's all-gather overlaps another's compute"]


def gpus_for(config: Config, device: DeviceInfo) -> tuple[GpuInfo, ...]:
    """The GPUs a burst of ``config`` trains on: every visible one for DataParallel (one process drives them
    all), one per DDP rank, else the first; none on a machine without CUDA."""
    if config.parallel == "dataparallel":
        return device.gpus
    return device.gpus[: ranks(config)]


def gpus_used(config: Config, device_kind: str, visible_gpus: int) -> int:
    """GPUs a burst keeps busy: every visible one for DataParallel, one per rank otherwise; 0 on a CPU."""
    if device_kind != "cuda":
        return 0
    return max(1, visible_gpus) if config.parallel == "dataparallel" else ranks(config)


def devices_used(config: Config, device: torch.device) -> list[torch.device]:
    """The devices one rank's work lands on: DataParallel replicates onto every visible GPU (its default
    ``device_ids``), anything else stays on the rank's own device."""
    if config.parallel == "dataparallel" and device.type == "cuda":
        return [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
    return [device]


def wrap_model(model: nn.Module, config: Config, device: torch.device, blocks_path: str | None = None) -> nn.Module:
    """DDP with one rank too (that measures what DDP itself costs); FSDP in place; DataParallel for comparison
    only."""
    if config.parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.parallel == "fsdp":
        return _fully_shard(model, config, device, blocks_path)
    if config.parallel == "dataparallel":
        # Legacy single-process data parallelism: one Python thread drives every GPU (DDP avoids that).
        return nn.DataParallel(model)
    return model


def _fully_shard(model: nn.Module, config: Config, device: torch.device, blocks_path: str | None) -> nn.Module:
    """FSDP2: ``fully_shard`` on each repeated block, then on the root (what is left: embeddings, head, norms).

    Each block is a unit: its parameters are all-gathered just before its forward (the next block's gather
    overlapping this one's compute) and, with ``reshard_after_forward``, freed after it. The mixed-precision policy
    comes from the precision owner (:func:`~.precision.sharded_param_dtype`): bf16 gathers and computes with bf16
    copies of the fp32 shards, and gradients are reduced in fp32. The module is changed in place (its class becomes
    an FSDP subclass, its parameters sharded DTensors), so the optimizer is built on it afterwards.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=precision.sharded_param_dtype(config), reduce_dtype=torch.float32)
    for block in block_modules(model, blocks_path):
        fully_shard(block, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=policy)
    return model


def gradient_sync(model: nn.Module, last_micro_batch: bool, *,
                  communication_free: bool = False) -> contextlib.AbstractContextManager[Any]:
    """Gradients are reduced only on the micro-batch that steps the optimizer: DDP's ``no_sync`` before it, FSDP's
    ``set_requires_gradient_sync(False)`` (its unsharded gradients accumulate locally, then one reduce-scatter).
    ``communication_free``: a communication-free headspace burst reduces on none (each rank steps its own
    gradients; under FSDP they stay unsharded, so its optimizer steps none)."""
    sync = last_micro_batch and not communication_free
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


OWNER = Owner(
    group=GROUP, title=TITLE, knobs=KNOBS, rules=RULES, ladder=LADDER, remedies=REMEDIES, recipe=RECIPE,
    model_steps={"wrap": lambda model, config, site: wrap_model(model, config, site.device, site.blocks)},
    model_notes=model_notes,
    facts=lambda config, device_kind, visible_gpus: {"gpus": gpus_used(config, device_kind, visible_gpus),
                                                     "sharded": sharded(config)},
)
