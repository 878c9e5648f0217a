"""What a batch-size search found: every size tried, whether it fit and what it measured, and the answers they give.

Plain data, like a :class:`~accel_widgets.results.burst.BurstResult`: the search that runs the tries is
:mod:`accel_widgets.search.batchsize`; how the record reads in words and as a figure is the views'
(:func:`accel_widgets.views.text.summary`, :func:`accel_widgets.views.figures.batch_size_figure`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from ..knobs.config import Config

Failure = Literal["memory_cap", "oom", "crash", "error", "stopped"]
#: Failures that mean "this size does not fit": the search goes on below it. Any other ends the search.
MEMORY_FAILURES: tuple[Failure, ...] = ("memory_cap", "oom", "crash")
Stage = Literal["grow", "shrink", "refine"]


@dataclass(frozen=True)
class BatchTry:
    """One batch size tried: whether it fit, why not, and what it measured.

    ``failure`` is None when it fit; "memory_cap" (over the cap), "oom" (the allocator refused), "crash"
    (a rank was killed, e.g. by the OOM killer) mean it does not fit; "error" (the workload failed for
    another reason) and "stopped" (the caller's stop) end the search without a verdict on memory.
    ``peak_memory_bytes`` is the most the try was seen to use: on a CPU the ranks' RSS summed (the larger of
    the live telemetry's peak and the ranks' own peak after the burst; for a burst stopped at the cap, what it
    had reached then, a lower bound); on a GPU the allocator's peak of the busiest rank, and ``reserved_bytes``
    what its caching allocator held (what the device really gave the burst). Throughput and step times are None
    for a try that did not finish. ``within_margin``: it fit and left the search's margin of the memory free.
    ``setting`` is what the try ran under beyond the search's config ("activation_checkpointing='blocks'", made
    to make room), "" for the config itself.
    """

    batch_size: int
    fits: bool
    stage: Stage
    failure: Failure | None = None
    why_not: str = ""
    samples_per_s: float | None = None
    peak_memory_bytes: int | None = None
    step_median_s: float | None = None
    step_iqr_s: float | None = None
    reserved_bytes: int | None = None
    within_margin: bool = False
    setting: str = ""


@dataclass(frozen=True)
class TargetTry:
    """One way of reaching a target global batch: ``micro_batch`` samples per rank and micro-batch, accumulated over
    ``accumulation`` micro-batches, under ``setting`` (as in :class:`BatchTry`); its measured samples/s, or why
    it has none."""

    micro_batch: int
    accumulation: int
    setting: str = ""
    samples_per_s: float | None = None
    why_not: str = ""


@dataclass(frozen=True)
class TargetBatch:
    """How to train a global batch of ``target`` samples over ``ranks`` ranks: ``tries`` are the ways measured
    (micro-batch x accumulation, largest micro-batches first), ``note`` why there are none."""

    target: int
    ranks: int
    tries: tuple[TargetTry, ...] = ()
    note: str = ""

    @property
    def best(self) -> TargetTry | None:
        """The fastest way measured."""
        measured = [t for t in self.tries if t.samples_per_s is not None]
        return max(measured, key=lambda t: t.samples_per_s or 0.0) if measured else None


@dataclass(frozen=True)
class BatchSizeSearch:
    """Every try of a batch-size search, in the order run, and what they say.

    ``batch_scope`` says what a batch size means for ``config`` (per DDP rank, per micro-batch...).
    ``cap_bytes`` is the memory cap the tries were held to (None: none, a GPU's own memory is the limit) and
    ``cap_note`` where it came from; ``memory_kind`` what ``peak_memory_bytes`` measures ("rss" or
    "cuda_allocator"). ``margin`` is the share of ``limit_bytes`` (the cap, else the GPU's memory as CUDA reports
    it) a size must leave free to count. ``room_config`` is the config sizes that did not fit were tried again
    under (activation checkpointing), None when none was. ``stopped_reason`` says why the search ended; ``target``
    how a target global batch is reached fastest, when one was asked for. ``estimated``: the largest size the
    estimate on fake tensors (:func:`~accel_widgets.analysis.estimate.estimate`) said fits, where the search started;
    ``estimate_note`` why there is none.
    """

    workload: str
    config: Config
    device: str
    memory_kind: Literal["rss", "cuda_allocator"]
    cap_bytes: int | None
    cap_note: str
    batch_scope: str
    tries: tuple[BatchTry, ...] = ()
    stopped_reason: str = ""
    wall_s: float = 0.0
    margin: float = 0.0
    limit_bytes: int | None = None
    target: TargetBatch | None = None
    room_config: Config | None = None
    estimated: int | None = None
    estimate_note: str = ""

    @property
    def estimate_error(self) -> float | None:
        """How far the estimate's largest batch was from the search's answer, as a share of the answer (+0.09: the
        estimate said 9% more); None without both."""
        found = self.largest_within_margin
        if self.estimated is None or not found:
            return None
        return self.estimated / found - 1

    @property
    def largest_fitting(self) -> int | None:
        """The largest batch size of the config itself that ran without running out of memory (the margin aside),
        None when none did."""
        return max((t.batch_size for t in self.tries if t.fits and not t.setting), default=None)

    @property
    def largest_within_margin(self) -> int | None:
        """The answer: the largest batch size of the config itself that fit and left the margin free."""
        return max((t.batch_size for t in self.tries if t.within_margin and not t.setting), default=None)

    @property
    def room_setting(self) -> str:
        """What the search tried to make room for larger sizes ("activation_checkpointing=blocks"), "" if nothing."""
        return self.room_config.label(self.config) if self.room_config is not None else ""

    @property
    def largest_with_room(self) -> int | None:
        """The largest batch size that fit within the margin under :attr:`room_setting`, None without one."""
        return max((t.batch_size for t in self.tries if t.within_margin and t.setting), default=None)

    @property
    def memory_limited(self) -> bool:
        """Whether memory is what limits this config's speed: the search ended on a size that did not fit, and the
        fastest size that fits is the largest (samples/s still rose when the memory ran out)."""
        largest = self.largest_within_margin
        return largest is not None and self.fastest == largest and any(
            not t.within_margin and not t.setting and t.failure != "stopped" for t in self.tries)

    def room_changes(self) -> dict[str, Any]:
        """The knob values that make room where memory is the limit: the setting's config and the largest batch size
        that then fit; empty when the search found no larger one."""
        size = self.largest_with_room
        if self.room_config is None or size is None or not self.memory_limited or (
                size <= (self.largest_within_margin or 0)):
            return {}
        return {**self.room_config.diff(self.config), "batch_size": size}

    @property
    def fastest(self) -> int | None:
        """The batch size of the config itself with the highest samples/s among those within the margin (short
        bursts: sizes within a few % are a tie)."""
        best = self.fastest_try()
        return best.batch_size if best is not None else None

    def fastest_try(self) -> BatchTry | None:
        measured = [t for t in self.tries if t.within_margin and not t.setting and t.samples_per_s is not None]
        return max(measured, key=lambda t: t.samples_per_s or 0.0) if measured else None

    @property
    def peak_allowed_bytes(self) -> int | None:
        """The most a size's peak may reach and still fit: ``limit_bytes`` less the margin (None without a limit)."""
        return None if self.limit_bytes is None else int(self.limit_bytes * (1 - self.margin))

    def curve(self, setting: str = "") -> list[BatchTry]:
        """The tries under ``setting`` that fit, by batch size: samples/s against batch size."""
        return sorted((t for t in self.tries if t.fits and t.setting == setting), key=lambda t: t.batch_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchSizeSearch:
        tries = tuple(BatchTry(**t) for t in data.get("tries", ()))
        target = data.get("target")
        if target is not None:
            target = TargetBatch(**{**target, "tries": tuple(TargetTry(**t) for t in target.get("tries", ()))})
        room = data.get("room_config")
        return cls(**{**data, "config": Config.from_dict(data["config"]), "tries": tries, "target": target,
                      "room_config": Config.from_dict(room) if room is not None else None})

    @classmethod
    def from_json(cls, text: str) -> BatchSizeSearch:
        return cls.from_dict(json.loads(text))
