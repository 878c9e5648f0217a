"""The knobs: every optimisation the tool can switch, each declared once, in the module that owns it.

One module per optimisation group -- :mod:`.data`, :mod:`.precision`, :mod:`.attention`, :mod:`.batch`,
:mod:`.compiling`, :mod:`.overhead`, :mod:`.system`, :mod:`.parallel` -- declares its knobs (values, devices, the
what/why/when a user reads), its rules (conflicts, "no effect here"), and everything the knobs do: to
the loader, the model, the step, torch's global flags, and the facts analysis needs. The training
step (:mod:`accel_widgets.engine.training`) calls the owners at fixed points and reads top to bottom.

:data:`KNOBS` is the union of the modules' declarations; the panel's controls, the CLI's flags,
``Config``'s fields and checks, the validation rules and the docs are generated from it. Adding a knob
is one module (or a few lines in the right one) plus its test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from . import attention, batch, compiling, data, overhead, parallel, precision, system
from .base import CodePaths, DeviceKind, Facts, Group, Knob, KnobRegistry, KnobValueError, Rule

if TYPE_CHECKING:
    from ..config import Config

#: The owning modules, one group each, in the classic order a tuning session walks them (the ladder's too).
OWNERS: tuple[ModuleType, ...] = (data, precision, attention, batch, compiling, overhead, system, parallel)
GROUPS: tuple[Group, ...] = tuple(owner.GROUP for owner in OWNERS)
GROUP_TITLES: dict[Group, str] = {owner.GROUP: owner.TITLE for owner in OWNERS}
KNOBS = KnobRegistry([knob for owner in OWNERS for knob in owner.KNOBS])
RULES: tuple[Rule, ...] = tuple(rule for owner in OWNERS for rule in owner.RULES)


def owner_of(name: str) -> ModuleType:
    """The module that declares (and so implements) knob ``name``."""
    KNOBS[name]  # an unknown name raises, naming the known knobs
    return next(owner for owner in OWNERS if any(knob.name == name for knob in owner.KNOBS))


@contextlib.contextmanager
def global_flags(config: Config) -> Iterator[None]:
    """Every owner's global torch switches for the duration, each put back on exit."""
    with precision.global_flags(config), system.global_flags(config):
        yield


def facts(config: Config, device_kind: str, visible_gpus: int) -> Facts:
    """The owners' account of how a burst of ``config`` runs on such a machine."""
    return Facts(
        math=precision.math_precision(config, device_kind),
        compiled=compiling.compiled(config),
        gpus=parallel.gpus_used(config, device_kind, visible_gpus),
        micro_batches=batch.micro_batches(config),
    )


__all__ = [
    "GROUPS",
    "GROUP_TITLES",
    "KNOBS",
    "OWNERS",
    "RULES",
    "CodePaths",
    "DeviceKind",
    "Facts",
    "Group",
    "Knob",
    "KnobRegistry",
    "KnobValueError",
    "Rule",
    "facts",
    "global_flags",
    "owner_of",
]
