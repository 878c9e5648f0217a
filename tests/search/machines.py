"""A scripted machine for the search drivers' tests: bursts at chosen rates on a fake clock."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from accel_widgets import BurstError, Config
from accel_widgets.results.burst import BurstResult, ErrorInfo
from tests.panel.fakes import synthetic_result


@dataclass
class Machine:
    """Scripted bursts on a fake clock: ``rate(config, call)`` samples/s, each burst advancing the clock by its steps
    (plus ``overhead_s``); ``fail`` call numbers raise, ``loaded`` ones ran beside other load."""

    rate: Any
    overhead_s: float = 0.2
    fail: set[int] = field(default_factory=set)
    loaded: set[int] = field(default_factory=set)
    calls: list[tuple[Config, dict[str, Any]]] = field(default_factory=list)
    now: float = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(self, workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        self.calls.append((config, kwargs))
        call = len(self.calls)
        step_s = 32 / self.rate(config, call)
        steps = kwargs.get("steps") or 20
        self.now += steps * step_s + self.overhead_s
        if call in self.fail:
            raise BurstError("boom", BurstResult(workload="fake", config=config, status="failed",
                                                 error=ErrorInfo("exception", "RuntimeError: boom")))
        return synthetic_result(config, steps=steps, step_s=step_s, foreign=60.0 if call in self.loaded else 0.0,
                                label=kwargs.get("label", ""))


def noisy(effects: dict[Config, float], sd: float = 0.03, seed: int = 0, drift: float = 0.0) -> Any:
    rng = random.Random(seed)
    return lambda config, call: 1000 * effects.get(config, 1.0) * math.exp(rng.gauss(0, sd)) * (1 + drift) ** call
