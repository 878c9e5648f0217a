"""``Config``: one frozen, hashable, JSON-serialisable point in the knob space.

Fields mirror :data:`accel_widgets.knobs.KNOBS` one to one (a test keeps them in step); defaults and
value checks come from the registry, so the dataclass only adds static types for editors and users.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from . import KNOBS, parallel

Precision = Literal["fp32", "bf16", "fp16"]
SdpaBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
DataCache = Literal["none", "memory", "memmap", "shards"]
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
CompileScope = Literal["model", "blocks"]
OptimizerImpl = Literal["default", "for-loop", "foreach", "fused"]
Parallel = Literal["none", "dataparallel", "ddp", "fsdp"]
Float8 = Literal["off", "tensorwise", "rowwise"]
ActivationCheckpointing = Literal["off", "blocks", "selective"]


def _default(name: str) -> Any:
    return KNOBS[name].default


@dataclass(frozen=True)
class Config:
    """The knobs of one burst. ``Config()`` is the plain training loop every speed-up is measured against."""

    batch_size: int | None = _default("batch_size")
    num_workers: int = _default("num_workers")
    pin_memory: bool = _default("pin_memory")
    prefetch_factor: int = _default("prefetch_factor")
    persistent_workers: bool = _default("persistent_workers")
    non_blocking: bool = _default("non_blocking")
    data_cache: DataCache = _default("data_cache")
    precision: Precision = _default("precision")
    tf32: bool = _default("tf32")
    sdpa_backend: SdpaBackend = _default("sdpa_backend")
    grad_accum_steps: int = _default("grad_accum_steps")
    compile_mode: CompileMode = _default("compile_mode")
    compile_scope: CompileScope = _default("compile_scope")
    float8: Float8 = _default("float8")
    sync_every: int = _default("sync_every")
    script_loss: bool = _default("script_loss")
    optimizer_impl: OptimizerImpl = _default("optimizer_impl")
    set_to_none: bool = _default("set_to_none")
    cudnn_benchmark: bool = _default("cudnn_benchmark")
    deterministic: bool = _default("deterministic")
    channels_last: bool = _default("channels_last")
    memory_fraction: float | None = _default("memory_fraction")
    empty_cache: bool = _default("empty_cache")
    activation_checkpointing: ActivationCheckpointing = _default("activation_checkpointing")
    expandable_segments: bool = _default("expandable_segments")
    parallel: Parallel = _default("parallel")
    world_size: int = _default("world_size")
    reshard_after_forward: bool = _default("reshard_after_forward")

    def __new__(cls, *args: Any, **knobs: Any) -> Config:
        """Refuse an unknown keyword before the generated ``__init__`` does: its bare TypeError names neither
        the closest knob nor the known ones. ``__new__`` sees the same arguments and leaves the dataclass (and
        the ``__init__`` signature editors read) untouched, so ``dataclasses.replace`` and pickling keep working.
        """
        for name in knobs:
            KNOBS[name]  # raises KnobValueError naming the closest knob and the known ones
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, KNOBS[field.name].check(getattr(self, field.name)))

    def replace(self, **changes: Any) -> Config:
        """A copy with some knobs changed (validated like the constructor, unknown names included)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))

    def diff(self, other: Config | None = None) -> dict[str, Any]:
        """Knobs whose value differs from ``other`` (the baseline ``Config()`` by default)."""
        reference = other if other is not None else Config()
        return {k: v for k, v in self.to_dict().items() if getattr(reference, k) != v}

    def label(self, other: Config | None = None) -> str:
        """Short description such as ``num_workers=2, precision=bf16``, or ``baseline``."""
        changed = self.diff(other)
        return ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "baseline"

    def compact_label(self, other: Config | None = None) -> str:
        """The knobs that differ from ``other`` in the few characters each knob's :meth:`~.base.Knob.compact` gives
        (``workers 2, pin, bf16``), or ``baseline``: what a table cell that must fit shows (``label`` on hover)."""
        changed = self.diff(other)
        return ", ".join(KNOBS[k].compact(v) for k, v in changed.items()) if changed else "baseline"

    @property
    def ranks(self) -> int:
        """Processes a burst of this config runs (DDP or FSDP ranks, else one)."""
        return parallel.ranks(self)
