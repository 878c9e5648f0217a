"""Rules over whole configs: which knob combinations cannot run here, and which run but make no sense.

Each knob module states its own rules next to its knobs (:mod:`accel_widgets.knobs`); this module runs
them, plus the checks of ``run_burst``'s own arguments. Errors stop a burst before any process starts;
warnings travel with the result so the user sees why a knob did nothing (or made things slower) on this
machine. Each rule names the knobs it involves, so the panel can attach the message to the right controls.
"""

from __future__ import annotations

from ..inputs.device import DeviceInfo
from . import KNOBS, Rule
from . import RULES as KNOB_RULES
from .config import Config


class ConfigError(ValueError):
    """The config cannot run on this device; the message says why and what to change."""


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
    errors = [rule.message(config, device) for rule in refusals(config, device)]
    if errors:
        raise ConfigError(" ".join(errors))
    return [r.message(config, device) for r in RULES if r.severity == "warning" and r.applies(config, device)]


def refusals(config: Config, device: DeviceInfo) -> list[Rule]:
    """The error rules ``config`` breaks on ``device``."""
    return [rule for rule in RULES if rule.severity == "error" and rule.applies(config, device)]


def knob_availability(name: str, device: DeviceInfo) -> tuple[bool, str]:
    """Whether a knob can do anything here, with the reason when it cannot (for disabling controls)."""
    knob = KNOBS[name]
    if device.kind not in knob.applies_to:
        return False, f"{name} only acts on {', '.join(knob.applies_to).upper()}; this machine is {device.kind}."
    return True, ""
