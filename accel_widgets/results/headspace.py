"""What a headspace measurement found: for each part of the step, the speed-up of the config with that part made free
over the config as it is (a *ceiling*: no knob whose effect lies in that part can win more), and what the ceilings
say about knobs, rungs and findings.

Plain data, like a :class:`~accel_widgets.results.comparison.Comparison`, which each ceiling holds; how a ceiling reads
in words is the views' (:mod:`accel_widgets.views.headspace`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..knobs import KNOBS
from ..knobs.base import Part
from ..knobs.config import Config
from ..knobs.parts import FREE_PARTS, FreePart
from ..metrics.sequential import Verdict
from .comparison import Comparison


@dataclass(frozen=True)
class Ceiling:
    """One part of the step: ``comparison`` is its headspace burst (the config, that part free) against the config as
    it is; None where the part was not measured, ``why_not`` then saying why (the config has no such part here, the
    budget ran out)."""

    part: Part
    comparison: Comparison | None = None
    why_not: str = ""

    @property
    def about(self) -> FreePart:
        return FREE_PARTS[self.part]

    @property
    def measured(self) -> bool:
        return self.comparison is not None and not self.comparison.error and bool(self.comparison.counted)

    @property
    def verdict(self) -> Verdict | None:
        return self.comparison.verdict if self.measured and self.comparison is not None else None

    @property
    def room(self) -> bool | None:
        """Whether freeing the part wins anything worth the name: True for "faster", False for "same" (or "slower":
        nothing to win either), None where the interval cannot tell yet or nothing was measured."""
        verdict = self.verdict
        return None if verdict in (None, "undecided") else verdict == "faster"

    @property
    def most(self) -> float | None:
        """The interval's top: the largest speed-up the part can be worth, at 95% (None while unbounded)."""
        if not self.measured or self.comparison is None:
            return None
        found = self.comparison.interval
        return found.high if found.bounded else None

    @property
    def cost_share(self) -> float | None:
        """The most of the step the part costs, as a share (1 - 1/top): "data loading costs at most 3% here"."""
        top = self.most
        return None if top is None else max(0.0, 1 - 1 / top)

    @property
    def closed_text(self) -> str:
        """Why the part's knobs cannot help, when its ceiling leaves no room ("" otherwise): "data loading costs at
        most 3% here: the loader knobs (...) cannot help"."""
        if self.room is not False:
            return ""
        share = self.cost_share
        costs = f"costs at most {share:.0%}" if share is not None else "costs nothing measurable"
        return f"{self.about.costs} {costs} here: {self.about.knobs} cannot help"


@dataclass
class Headspace:
    """The ceilings of ``config`` for ``workload``, by part (every part, measured or saying why not), with the wall
    time they took and why measuring ended."""

    workload: str
    config: Config
    ceilings: dict[Part, Ceiling] = field(default_factory=dict)
    wall_s: float = 0.0
    stopped: str = ""

    def ceiling(self, part: Part) -> Ceiling | None:
        return self.ceilings.get(part)

    def closed(self, part: Part) -> Ceiling | None:
        """``part``'s ceiling when it leaves no room (its verdict "same"), else None."""
        found = self.ceilings.get(part)
        return found if found is not None and found.room is False else None

    def closes(self, knob: str) -> Ceiling | None:
        """The ceiling that leaves ``knob`` nothing to win (its part's, when that reads "same"), else None."""
        part = KNOBS[knob].part
        return self.closed(part) if part is not None else None

    def bounding(self, changes: Mapping[str, Any]) -> Ceiling | None:
        """The measured ceiling of the one part every knob in ``changes`` belongs to (a rung of loader knobs: the data
        ceiling), else None: changes that reach past one part have no single ceiling."""
        parts = {KNOBS[name].part for name in changes}
        if len(parts) != 1 or None in parts:
            return None
        found = self.ceilings.get(parts.pop())  # type: ignore[arg-type]
        return found if found is not None and found.measured else None

    def closes_changes(self, changes: Mapping[str, Any]) -> Ceiling | None:
        """The ceiling that leaves ``changes`` nothing to win: every knob in them belongs to one part whose ceiling
        reads "same"."""
        found = self.bounding(changes)
        return found if found is not None and found.room is False else None

    def share_freed(self, part: Part) -> float | None:
        """The share of the step the part was measured to take (1 - 1/ratio, never below 0), None unmeasured."""
        found = self.ceilings.get(part)
        if found is None or not found.measured or found.comparison is None:
            return None
        ratio = found.comparison.ratio
        return max(0.0, 1 - 1 / ratio) if ratio is not None and math.isfinite(ratio) and ratio > 0 else None
