"""Hand-built results the way the engine hands them back: with the knob owners' facts about how they ran."""

from __future__ import annotations

import dataclasses

from accel_widgets.knobs import facts
from accel_widgets.results.burst import BurstResult


def as_measured(result: BurstResult) -> BurstResult:
    """``result`` with the facts ``run_burst`` records at launch, from its config and environment."""
    environment = result.environment
    return dataclasses.replace(result, facts=facts(result.config, str(environment.get("device_kind", "cpu")),
                                                   len(environment.get("gpus", ()))))
