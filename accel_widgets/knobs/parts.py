"""The parts of a training step a headspace burst makes free, declared once: what each leaves out, where it applies,
and which knobs it bounds.

A headspace burst (:func:`accel_widgets.search.headspace.headspace`) trains the config as it is with one part of the
step made free, and the comparison engine measures it against the config itself. Its speed-up is a *ceiling*: no
knob whose whole effect lies in that part can win more (a loader knob cannot make loading cheaper than free). The
plan carries the part (:attr:`~accel_widgets.knobs.plan.Plan.freed`), and the loop frees it at the owners' fixed
points: the data owner's batches (a few, on the device, cycled), the parallel owner's gradient sync (skipped on every
micro-batch), the Python-overhead owner's loss reads (none in the window) and the loop's own per-step bookkeeping.
Each knob names the part that bounds it in its declaration (:attr:`~accel_widgets.knobs.base.Knob.part`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from . import parallel
from .base import Part

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from .config import Config

PARTS: tuple[Part, ...] = get_args(Part)
#: Batches a data-free burst reads from its loader before measuring, copies to the device once and cycles: enough
#: that micro-batches and ranks do not train on one batch alone, few enough to hold on any device.
ON_DEVICE_BATCHES = 4


@dataclass(frozen=True)
class FreePart:
    """One part a headspace burst can make free: its ``title`` ("data free"), what the burst then ``leaves_out``,
    what the part ``costs`` in a sentence ("data loading"), the ``knobs`` its ceiling bounds in words (the registry's
    knobs whose ``part`` it is are the rule) and ``why_not(config, device)``: "" where the part is there to free,
    else why not."""

    part: Part
    title: str
    leaves_out: str
    costs: str
    knobs: str
    why_not: Callable[[Config, DeviceInfo], str]


def _data_applies(config: Config, device: DeviceInfo) -> str:
    return ""  # every step waits for a batch from the loader, and on a GPU copies it


def _communication_applies(config: Config, device: DeviceInfo) -> str:
    if parallel.distributed(config) and parallel.ranks(config) > 1:
        return ""
    return "the config trains one process, which exchanges no gradients"


def _host_applies(config: Config, device: DeviceInfo) -> str:
    if device.has_cuda:
        return ""
    return ("on a CPU the host is the device: the step's Python runs on the cores that compute, and there is no idle "
            "device for fewer syncs to fill")


FREE_PARTS: dict[Part, FreePart] = {
    "data": FreePart(
        "data", "data free",
        f"the loader and the host-to-device copy: {ON_DEVICE_BATCHES} batches read once, on the device, cycled",
        "data loading", "the loader knobs (workers, pinning, prefetching, caches, shards)", _data_applies),
    "communication": FreePart(
        "communication", "communication free",
        "the gradients' exchange between ranks: every micro-batch skips the gradient sync (DDP's no_sync; FSDP's "
        "reduce-scatter, after which its optimizer steps no gradients)",
        "the gradients' exchange", "overlap, bucketing or accumulation", _communication_applies),
    "host": FreePart(
        "host", "host free",
        "the loss reads (none until the window ends, as sync_every=0) and the per-step work the burst adds (phases, "
        "the data and copy markers)",
        "the host's per-step work", "fewer syncs and less per-step Python", _host_applies),
}


def check_part(part: object) -> Part:
    """``part`` when it names a part, else a ValueError naming them."""
    if part not in PARTS:
        raise ValueError(f"freed={part!r} names no part of the step: use one of {', '.join(map(repr, PARTS))}")
    return part  # type: ignore[return-value]


def why_not_free(part: Part, config: Config, device: DeviceInfo) -> str:
    """Why ``part`` cannot be made free for ``config`` on ``device`` ("" when it can)."""
    return FREE_PARTS[check_part(part)].why_not(config, device)


def bounded_knobs(part: Part) -> list[str]:
    """The knobs whose effect ``part``'s ceiling bounds, as their owners declare it, in the registry's order."""
    from . import KNOBS  # the registry of the owners' knobs (it imports no part of this module)

    return [name for name, knob in KNOBS.items() if knob.part == part]
