"""Rules over whole configs: which knob combinations cannot run here, and which run but make no sense.

Each knob module states its own rules next to its knobs (:mod:`accel_widgets.knobs`); this module runs
them, plus the checks of ``run_burst``'s own arguments. Errors stop a burst before any process starts;
warnings travel with the result so the user sees why a knob did nothing (or made things slower) on this
machine. Each rule names the knobs it involves, so the panel can attach the message to the right controls.
"""

from __future__ import annotations

import math

from .config import Config
from .device import DeviceInfo
from .knobs import KNOBS, Rule
from .knobs import RULES as KNOB_RULES


class ConfigError(ValueError):
    """The config cannot run on this device; the message says why and what to change."""


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


def _cuda_only_knobs_set(config: Config) -> list[str]:
    """CUDA-only knobs switched away from their default."""
    return [
        name
        for name, knob in KNOBS.items()
        if knob.applies_to == ("cuda",) and getattr(config, name) != knob.default
    ]


#: The knob modules' own rules, plus one over the whole registry: CUDA-only knobs on a CPU do nothing.
RULES: tuple[Rule, ...] = (
    *KNOB_RULES,
    Rule(
        tuple(name for name, knob in KNOBS.items() if knob.applies_to == ("cuda",)), "warning",
        lambda c, d: not d.has_cuda and bool(_cuda_only_knobs_set(c)),
        lambda c, d: f"{', '.join(_cuda_only_knobs_set(c))} only act on CUDA; on this CPU-only machine "
        "they change nothing.",
    ),
)


def check_config(config: Config, device: DeviceInfo) -> list[str]:
    """Raise :class:`ConfigError` if ``config`` cannot run on ``device``; return the warnings otherwise."""
    errors = [r.message(config, device) for r in RULES if r.severity == "error" and r.applies(config, device)]
    if errors:
        raise ConfigError(" ".join(errors))
    return [r.message(config, device) for r in RULES if r.severity == "warning" and r.applies(config, device)]


def knob_availability(name: str, device: DeviceInfo) -> tuple[bool, str]:
    """Whether a knob can do anything here, with the reason when it cannot (for disabling controls)."""
    knob = KNOBS[name]
    if device.kind not in knob.applies_to:
        return False, f"{name} only acts on {', '.join(knob.applies_to).upper()}; this machine is {device.kind}."
    return True, ""
