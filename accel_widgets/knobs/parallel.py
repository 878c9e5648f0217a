"""Data parallelism: DDP ranks (one process per rank) or legacy DataParallel (one process, several GPUs).

Owns how many processes a burst runs, how the model is wrapped and when gradients are all-reduced.
The process group itself (its rendezvous and sockets) is the engine's: :mod:`accel_widgets.engine.worker`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import batch
from .base import (
    Climb,
    Code,
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
    no_equivalent,
    powers_of_two,
)

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo, GpuInfo
    from .config import Config

_MORE_DEVICES = "it changes how many processes and devices train (compare with scaling_efficiency)"

GROUP = "parallel"
TITLE = "Parallel"

KNOBS = [
    Knob(
        "parallel", "parallel", str, "none", choices=("none", "dataparallel", "ddp"),
        what="Data parallelism: one process over several GPUs (DataParallel) or one process per rank (DDP).",
        why="More devices process more samples per second; DDP avoids DataParallel's single-process GIL "
        "and scatter/gather bottleneck.",
        when="Several local GPUs (or CPU ranks with gloo for learning DDP); prefer DDP.",
        search=Search(left_out=_MORE_DEVICES),
    ),
    Knob(
        "world_size", "parallel", int, 1, minimum=1, maximum=1024,
        what="Number of DDP ranks (processes).",
        why="Each rank trains on its own shard of every global batch.",
        when="With parallel='ddp': one rank per GPU, or a few CPU ranks.",
        search=Search(left_out=_MORE_DEVICES,
                      values=lambda ctx: powers_of_two(len(ctx.device.gpus) or ctx.device.cpu_count)),
    ),
]

RULES = [
    Rule(
        ("parallel",), "error",
        lambda c, d: c.parallel == "dataparallel" and len(d.gpus) < 2,
        lambda c, d: f"parallel='dataparallel' needs at least 2 GPUs; this machine has {len(d.gpus)}. "
        "DataParallel is the legacy single-process option: prefer parallel='ddp'.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel == "ddp" and d.has_cuda and c.world_size > len(d.gpus),
        lambda c, d: f"world_size={c.world_size} needs one GPU per rank for NCCL; this machine has "
        f"{len(d.gpus)}. Use world_size <= {len(d.gpus)}.",
    ),
    Rule(
        ("parallel", "world_size"), "error",
        lambda c, d: c.parallel != "ddp" and c.world_size != 1,
        lambda c, d: f"world_size={c.world_size} only applies with parallel='ddp'; set parallel='ddp' "
        "or world_size=1.",
    ),
    Rule(
        ("parallel", "world_size"), "warning",
        lambda c, d: c.parallel == "ddp" and not d.has_cuda and c.world_size > d.cpu_count,
        lambda c, d: f"{c.world_size} CPU ranks on {d.cpu_count} cores: ranks will fight for cores and "
        "throughput will drop.",
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
    """Plain PyTorch: join torchrun's group, shard the data per rank, wrap the model, all-reduce only on the micro-batch
    that steps."""
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
        Code("parallel", "new_epoch", "if world_size > 1:\n    sampler.set_epoch(epoch)",
             "a new shuffle each epoch, the same on every rank"),
        Code("parallel", "wrap", 'model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if '
                                 'device.type == "cuda" else None)'),
    ]
    if batch.micro_batches(config) > 1:
        parts.append(Code("parallel", "around_backward", "model.no_sync() if micro < ACCUMULATE - 1 else "
                                                         "contextlib.nullcontext()",
                          "DDP all-reduces gradients only on the micro-batch that steps the optimizer"))
    return parts


def _launch(prefix: str, command: str) -> RecipeEntry:
    """The launch line of a DDP run of ``ranks(config)`` processes per machine."""
    return lambda config, context: [Code("world_size", prefix, command.format(ranks(config)))] if distributed(
        config) else []


def _framework_ddp(how: str) -> RecipeEntry:
    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        if config.parallel == "dataparallel":
            return no_equivalent(_KNOB["parallel"], _NO_DATAPARALLEL)(config, context)
        return [Code("parallel", "code", how)] if distributed(config) else []

    return entry


#: Each knob in each style (:func:`accel_widgets.job.recipe.recipe`).
RECIPE: dict[str, dict[Style, RecipeEntry]] = {
    "parallel": {
        "pytorch": _ddp,
        "hf": _framework_ddp("# the Trainer runs DDP itself when launched by torchrun"),
        "lightning": lambda config, context: no_equivalent(_KNOB["parallel"], _NO_DATAPARALLEL)(config, context)
        if single_process_multi_gpu(config) else [Setting("parallel", "strategy", "ddp")] if distributed(config)
        else [],
        "accelerate": _framework_ddp("# Accelerator runs DDP itself when launched by accelerate launch or torchrun"),
    },
    "world_size": {
        "pytorch": _launch("doc", "torchrun --nproc-per-node {} your_script.py"),
        "hf": _launch("code", "# launch: torchrun --nproc-per-node {} your_script.py"),
        "lightning": lambda config, context: [Setting("world_size", "devices", ranks(config))] if distributed(
            config) else [],
        "accelerate": _launch("code", "# launch: accelerate launch --num_processes {} your_script.py"),
    },
}


def single_process_multi_gpu(config: Config) -> bool:
    """Legacy DataParallel: one process drives every visible GPU."""
    return config.parallel == "dataparallel"


def ranks(config: Config) -> int:
    """Processes a burst of this config runs: DDP ranks, else one."""
    return config.world_size if config.parallel == "ddp" else 1


def distributed(config: Config) -> bool:
    """Whether the ranks form a process group (DDP, one rank included: that measures what DDP itself costs)."""
    return config.parallel == "ddp"


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


def wrap_model(model: nn.Module, config: Config, device: torch.device) -> nn.Module:
    """DDP with one rank too (that measures what DDP itself costs); DataParallel for comparison only."""
    if config.parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.parallel == "dataparallel":
        # Legacy single-process data parallelism: one Python thread drives every GPU (DDP avoids that).
        return nn.DataParallel(model)
    return model


def gradient_sync(model: nn.Module, last_micro_batch: bool) -> contextlib.AbstractContextManager[Any]:
    """Why no_sync: DDP all-reduces gradients only on the micro-batch that steps the optimizer."""
    if last_micro_batch or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()
