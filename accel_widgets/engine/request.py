"""What a burst is asked for besides the config: how long to measure, warm up and wait, and what to record.

:class:`BurstRequest` is one value for ``run_burst``'s keyword arguments, checked before any process starts:
the searches pass it on whole instead of a dozen parameters each.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..knobs.base import Part
from ..knobs.parts import PARTS

#: Measured steps of a burst given neither steps nor seconds.
DEFAULT_STEPS = 40
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_PROFILE_DIR = "accel_widgets_profiles"


@dataclass(frozen=True)
class BurstRequest:
    """How long a burst measures and waits, and what it records besides its numbers.

    ``steps`` measured steps, or ``seconds`` of measuring (neither: ``DEFAULT_STEPS``), after ``warmup_steps``
    unmeasured ones (None: the config's own, :func:`accel_widgets.knobs.compiling.default_warmup_steps`);
    ``timeout_s`` for the whole burst; ``profile_steps`` more steady-state steps under torch.profiler after the
    window, their trace under ``profile_dir``; ``sync_debug`` runs the window under CUDA's sync-debug mode.
    ``freed``: the part of the step the burst makes free, a headspace variant of the config
    (:mod:`accel_widgets.knobs.parts`); None trains the config as it is.
    """

    steps: int | None = None
    seconds: float | None = None
    warmup_steps: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    profile_steps: int = 0
    profile_dir: str = DEFAULT_PROFILE_DIR
    sync_debug: bool = False
    freed: Part | None = None

    def __post_init__(self) -> None:
        check_burst_request(self.steps, self.seconds, self.warmup_steps, self.timeout_s, self.profile_steps)
        if self.freed is not None and self.freed not in PARTS:
            raise BurstRequestError(f"freed={self.freed!r} names no part of the step: use one of "
                                    f"{', '.join(map(repr, PARTS))}, or None for the config as it is")

    def resolved(self, warmup_steps: int) -> BurstRequest:
        """This request with its defaults taken: a length (``DEFAULT_STEPS``) and ``warmup_steps`` when unset."""
        steps = DEFAULT_STEPS if self.steps is None and self.seconds is None else self.steps
        return dataclasses.replace(self, steps=steps, warmup_steps=self.warmup_steps or warmup_steps)

    def length(self) -> dict[str, int | float | None]:
        """``steps`` and ``seconds`` as keyword arguments."""
        return {"steps": self.steps, "seconds": self.seconds}


class BurstRequestError(ValueError):
    """``run_burst``'s length, warm-up, timeout or profiling argument is not a usable number; raised before any
    process starts, because a NaN length or timeout would otherwise run into the timeout and read as a hang."""


def check_burst_request(steps: object, seconds: object, warmup_steps: object, timeout_s: object,
                        profile_steps: object) -> None:
    """Raise :class:`BurstRequestError` unless every burst argument is a number the engine can act on.

    ``steps`` is an int >= 1 and ``seconds`` a finite number > 0, at most one of them given (neither:
    ``run_burst`` picks the default length; both would leave it to whichever ends first, a length nobody
    asked for); ``warmup_steps`` (None: the engine's default) an int >= 1, since the first step always
    pays one-off costs; ``timeout_s`` a finite number > 0; ``profile_steps`` an int >= 0. Bools are refused
    as counts, and so are floats: ``steps=2.5`` would otherwise run 3 steps.
    """
    problems = [
        problem
        for problem in (
            _count_problem("steps", steps, 1, optional=True),
            _duration_problem("seconds", seconds, optional=True),
            _count_problem("warmup_steps", warmup_steps, 1, optional=True,
                           why=": the first step always pays one-off costs"),
            _duration_problem("timeout_s", timeout_s, optional=False),
            _count_problem("profile_steps", profile_steps, 0, optional=False),
            _length_problem(steps, seconds),
        )
        if problem
    ]
    if problems:
        raise BurstRequestError("; ".join(problems))


def _count_problem(name: str, value: object, minimum: int, *, optional: bool, why: str = "") -> str:
    """What is wrong with a step count, or "" when it is an int >= ``minimum`` (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name}={value!r} is invalid: use an integer, {name} >= {minimum}{why}"
    return ""


def _length_problem(steps: object, seconds: object) -> str:
    """What is wrong with giving both lengths, or "" when at most one is given."""
    if steps is None or seconds is None:
        return ""
    return (f"steps={steps!r} and seconds={seconds!r} given together: a burst measures either a number of steps "
            "or a time; pass one of them")


def _duration_problem(name: str, value: object, *, optional: bool) -> str:
    """What is wrong with a duration in seconds, or "" when it is a finite number > 0 (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"{name}={value!r} is invalid: use a finite number of seconds, {name} > 0"
    return ""
