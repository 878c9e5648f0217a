"""What reseeding a baseline's data measured: how far its loss moves when only its data seed changes.

A record, kept in the run history and carried by a tuning's result; the correctness guard
(:mod:`accel_widgets.analysis.guard`) measures it from reseeded bursts and judges a run's loss against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NoiseBand:
    """How far the fp32 baseline's own smoothed loss moves when only its data seed changes.

    ``spread`` is the largest deviation of a reseeded baseline from the baseline, rescaled to one batch:
    ``deviation * sqrt(losses in the guard's running mean)``. Batch-to-batch noise averages down in that mean, so the
    guard gives it back its shape step by step (:func:`~accel_widgets.analysis.guard.deviation_at`). Drift between
    the trajectories, which does not average down, is in the spread too (the largest value over every step counts).
    ``steps``: how many steps the reseeded bursts covered; ``data_seeds``: the seeds they trained with.
    """

    spread: float
    steps: int
    data_seeds: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"spread": self.spread, "steps": self.steps, "data_seeds": list(self.data_seeds)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NoiseBand:
        return cls(float(data["spread"]), int(data["steps"]), tuple(int(s) for s in data["data_seeds"]))
