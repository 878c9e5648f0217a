"""A config resolved once: the rules checked and every decision a run needs taken, for one device and workload.

A burst (:func:`accel_widgets.engine.launcher.run_burst`), the batch-size search and an exported script
(:mod:`accel_widgets.job.run`) all start from :func:`resolve`, as Lightning Fabric's connector resolves
its flags once: so a config the rules refuse is refused by each of them alike, and what a burst measured is
what the script runs. The knob owners take the decisions (:mod:`accel_widgets.knobs`); this module only asks them
in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..inputs.device import DeviceInfo, GpuInfo
from ..inputs.workload import Workload
from . import compiling, data, facts, model_notes, parallel
from .base import Facts, Part
from .config import Config
from .parts import FREE_PARTS, why_not_free
from .rules import ConfigError, check_config, refusals

#: Where a rank's process group rendezvouses: a burst's private file (its sockets on loopback only), or
#: torchrun's environment (an exported script, maybe across machines).
Rendezvous = Literal["file", "torchrun"]


@dataclass(frozen=True)
class ProcessGroup:
    """The process group DDP ranks join: its backend (NCCL on GPUs, gloo on CPUs) and its size."""

    backend: Literal["nccl", "gloo"]
    world_size: int


@dataclass(frozen=True)
class Plan:
    """What a run of ``config`` on ``device`` does, decided before any process starts.

    ``warnings`` are the rules' warnings and what the knobs replace in the workload's own DataLoader;
    ``gpus`` the GPUs the run trains on; ``threads_per_rank`` the intra-op threads of each rank (the usable
    cores shared by the ranks on this machine); ``group`` the process group, None for one process. ``freed``: the
    part of the step a headspace burst makes free (:mod:`~accel_widgets.knobs.parts`), None for the config as it is.
    """

    config: Config
    device: DeviceInfo
    warnings: tuple[str, ...]
    facts: Facts
    warmup_steps: int
    batch_size: int
    gpus: tuple[GpuInfo, ...]
    threads_per_rank: int
    group: ProcessGroup | None
    freed: Part | None = None

    @property
    def ranks(self) -> int:
        return self.group.world_size if self.group is not None else 1


def resolve(config: Config, device: DeviceInfo, workload: Workload, *, world_size: int | None = None,
            freed: Part | None = None) -> Plan:
    """Check ``config`` against ``device`` (and ``workload``'s own DataLoader) and take every decision a run needs.

    Raises :class:`ConfigError` naming what cannot run. ``world_size``: the ranks of a group that spans
    machines (torchrun's ``WORLD_SIZE``); the config's ranks are then those of this machine. ``freed``: the part of
    the step a headspace burst makes free (refused, saying why, where that part is not there to free).
    """
    if freed is not None and (why := why_not_free(freed, config, device)):
        raise ConfigError(f"{FREE_PARTS[freed].title} cannot be measured here: {why}")
    warnings = check_config(config, device)
    try:
        warnings += data.loader_notes(workload, config)
        warnings += model_notes(workload, config)
    except ValueError as exc:  # what the knobs cannot keep of the workload's own DataLoader, or do to its model
        raise ConfigError(str(exc)) from None
    ranks = parallel.ranks(config)
    group = (ProcessGroup("nccl" if device.has_cuda else "gloo", world_size or ranks)
             if parallel.distributed(config) else None)
    return Plan(
        config=config,
        device=device,
        warnings=tuple(warnings),
        facts=facts(config, device.kind, len(device.gpus)),
        warmup_steps=compiling.default_warmup_steps(config),
        batch_size=data.resolve_batch_size(config, workload),
        gpus=parallel.gpus_for(config, device),
        threads_per_rank=max(1, device.cpu_count // ranks),
        group=group,
        freed=freed,
    )


def portable_errors(config: Config, workload: Workload | None = None) -> list[str]:
    """Why ``config`` cannot run on any machine: the rules it breaks on a CPU-only machine and on a machine with
    GPUs alike, and what the knobs cannot keep of the workload's DataLoader. An exported script checks the rest
    against the machine it runs on (:func:`resolve`)."""
    cpu, gpus = _ANY_MACHINE
    problems = [rule.message(config, cpu) for rule in refusals(config, cpu) if rule in refusals(config, gpus)]
    if workload is not None:
        try:
            data.loader_notes(workload, config)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


#: Two machines that stand for every other when a config is judged away from the one it will run on: a
#: CPU-only one and one with eight Hopper GPUs (143,771 MiB each, as NVML reports an H200).
_ANY_MACHINE = (
    DeviceInfo(cpu_count=64, cpu_name="any CPU"),
    DeviceInfo(cpu_count=64, cpu_name="any CPU", driver="any",
               gpus=tuple(GpuInfo(i, i, "NVIDIA H200", 143_771 * 2**20, compute_capability=(9, 0)) for i in range(8))),
)
