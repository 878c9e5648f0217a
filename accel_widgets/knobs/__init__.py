"""The knobs: every optimisation the tool can switch, each declared once, in the module that owns it.

One module per optimisation group -- :mod:`.data`, :mod:`.precision`, :mod:`.attention`, :mod:`.batch`,
:mod:`.compiling`, :mod:`.float8`, :mod:`.overhead`, :mod:`.system`, :mod:`.memory`, :mod:`.parallel` -- declares its
knobs (values, devices, the what/why/when a user reads, how a search tries them), its rules (conflicts, "no effect
here"), its part of the classic ladder (``LADDER``), its advice for what the diagnosis reads (``REMEDIES``), and
everything the knobs do: to the loader, the model, the step, torch's global flags, and the facts analysis needs. The
training step (:mod:`accel_widgets.engine.training`) calls the owners at fixed points and reads top to bottom; the
ladder, the tuner and the diagnosis compose what the owners declare and name no knob themselves.

:data:`KNOBS` is the union of the modules' declarations; the panel's controls, the CLI's flags,
``Config``'s fields and checks, the validation rules and the docs are generated from it. A config is resolved
once for a machine and a workload into a :class:`~.plan.Plan` (:func:`~.plan.resolve`). Adding a knob is one
module (or a few lines in the right one) plus its test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from . import attention, batch, compiling, data, float8, memory, overhead, parallel, precision, system
from .base import (
    RUNGS,
    Climb,
    CodePaths,
    DeviceKind,
    Facts,
    Group,
    Knob,
    KnobRegistry,
    KnobValueError,
    Part,
    Remedy,
    Rule,
    Search,
    SearchContext,
    Symptom,
)

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from .config import Config

#: The owning modules, one group each, in the classic order a tuning session walks them (the ladder's too). float8
#: follows compile, which it needs to gain; memory comes late: its knobs trade speed or nothing for room.
OWNERS: tuple[ModuleType, ...] = (data, precision, attention, batch, compiling, float8, overhead, system, memory,
                                  parallel)
GROUPS: tuple[Group, ...] = tuple(owner.GROUP for owner in OWNERS)
GROUP_TITLES: dict[Group, str] = {owner.GROUP: owner.TITLE for owner in OWNERS}
KNOBS = KnobRegistry([knob for owner in OWNERS for knob in owner.KNOBS])
RULES: tuple[Rule, ...] = tuple(rule for owner in OWNERS for rule in owner.RULES)
#: The owners' parts of the classic ladder's rungs, in the owners' order (the ladder groups them by rung).
CLIMBS: tuple[Climb, ...] = tuple(climb for owner in OWNERS for climb in owner.LADDER)


def owner_of(name: str) -> ModuleType:
    """The module that declares (and so implements) knob ``name``."""
    KNOBS[name]  # an unknown name raises, naming the known knobs
    return next(owner for owner in OWNERS if any(knob.name == name for knob in owner.KNOBS))


def remedy(symptom: Symptom, config: Config, device: DeviceInfo | None = None, *, paths: CodePaths | None = None,
           closed: Collection[Part] = ()) -> Remedy | None:
    """What to try next for ``symptom`` under ``config``: the first owner's advice, owners in the classic order
    (the data pipeline before the arithmetic, the arithmetic before compile), that can act.

    An owner's advice is passed over where it could not act: on ``device``, a knob that does not act on its kind, or
    a value the owners' rules warn about or refuse there (bf16 where bf16 is emulated); a knob whose code path the
    step never ran (``paths``); a knob whose part of the step a headspace ceiling found worth nothing (``closed``:
    the parts whose ceiling reads "same"). The next owner's advice is then the answer, or none."""
    for owner in OWNERS:
        advise = owner.REMEDIES.get(symptom)
        found = advise(config) if advise is not None else None
        if found is not None and not _cannot_act(found, config, device, paths, closed):
            return found
    return None


def _cannot_act(advice: Remedy, config: Config, device: DeviceInfo | None, paths: CodePaths | None,
                closed: Collection[Part]) -> str:
    """Why ``advice`` could not act here ("" when it can): the knob's device kinds, the step's code paths, a closed
    ceiling, or a rule that the suggested value breaks on ``device`` and ``config`` as it is does not."""
    knob = KNOBS[advice.knob]
    if knob.part in closed:
        return f"the {knob.part} ceiling leaves {knob.name} nothing to win"
    if paths is not None and (idle := knob.idle_on(paths)):
        return idle
    if device is None:
        return ""
    if device.kind not in knob.applies_to:
        return f"{knob.name} acts only on {', '.join(knob.applies_to)}"
    if advice.value is None:
        return ""
    try:
        suggested = config.replace(**{knob.name: advice.value})
    except ValueError as exc:  # a value the config cannot hold with the rest of it
        return str(exc)
    broken = [rule for rule in RULES if knob.name in rule.knobs and rule.applies(suggested, device)
              and not rule.applies(config, device)]
    return broken[0].message(suggested, device) if broken else ""


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
        sharded=parallel.sharded(config),
    )


__all__ = [
    "CLIMBS",
    "GROUPS",
    "GROUP_TITLES",
    "KNOBS",
    "OWNERS",
    "RULES",
    "RUNGS",
    "Climb",
    "CodePaths",
    "DeviceKind",
    "Facts",
    "Group",
    "Knob",
    "KnobRegistry",
    "KnobValueError",
    "Part",
    "Remedy",
    "Rule",
    "Search",
    "SearchContext",
    "Symptom",
    "facts",
    "global_flags",
    "owner_of",
    "remedy",
]
