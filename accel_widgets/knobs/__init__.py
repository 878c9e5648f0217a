"""The knobs: every optimisation the tool can switch, each declared once, by the owner of its group.

One module per optimisation group -- :mod:`.data`, :mod:`.precision`, :mod:`.attention`, :mod:`.batch`,
:mod:`.compiling`, :mod:`.float8`, :mod:`.overhead`, :mod:`.system`, :mod:`.memory`, :mod:`.parallel` -- ends with
its :class:`~.owner.Owner`: its knobs (values, devices, the what/why/when a user reads, how a search tries them), its
rules (conflicts, "no effect here"), its part of the classic ladder, its advice for what the diagnosis reads, its part
of a recipe, and what the knobs do to a run: the model's changes at the :data:`~.owner.MODEL_STAGES`, what those will
do to a workload's model, torch's global flags, and the facts analysis needs. This module lists the owners and
composes what they declare, asking none of them by name: the training step (:mod:`accel_widgets.engine.training`)
prepares its model through :func:`prepare_model` and enters :func:`global_flags`, and the ladder, the tuner and the
diagnosis compose what the owners declare and name no knob themselves.

:data:`KNOBS` is the union of the owners' declarations; the panel's controls, the CLI's flags,
``Config``'s fields and checks, the validation rules and the docs are generated from it. A config is resolved
once for a machine and a workload into a :class:`~.plan.Plan` (:func:`~.plan.resolve`). Adding a knob is its owner
module (or a few lines in the right one), its field in ``Config``, and its test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

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
from .owner import MODEL_STAGES, ModelSite, ModelStage, ModelStep, Owner, merged_facts, run_model_stages

if TYPE_CHECKING:
    from ..inputs.device import DeviceInfo
    from ..inputs.workload import Workload
    from .config import Config

#: The owners, one group each, in the classic order a tuning session walks them (the ladder's too). float8 follows
#: compile, which it needs to gain; memory comes late: its knobs trade speed or nothing for room. Within a model
#: stage, and for global flags and notes, the owners act in this order too.
OWNERS: tuple[Owner, ...] = tuple(module.OWNER for module in (data, precision, attention, batch, compiling, float8,
                                                              overhead, system, memory, parallel))
GROUPS: tuple[Group, ...] = tuple(owner.group for owner in OWNERS)
GROUP_TITLES: dict[Group, str] = {owner.group: owner.title for owner in OWNERS}
KNOBS = KnobRegistry([knob for owner in OWNERS for knob in owner.knobs])
RULES: tuple[Rule, ...] = tuple(rule for owner in OWNERS for rule in owner.rules)
#: The owners' parts of the classic ladder's rungs, in the owners' order (the ladder groups them by rung).
CLIMBS: tuple[Climb, ...] = tuple(climb for owner in OWNERS for climb in owner.ladder)


def owner_of(name: str) -> Owner:
    """The owner that declares (and so implements) knob ``name``."""
    KNOBS[name]  # an unknown name raises, naming the known knobs
    return next(owner for owner in OWNERS if any(knob.name == name for knob in owner.knobs))


def remedy(symptom: Symptom, config: Config, device: DeviceInfo | None = None, *, paths: CodePaths | None = None,
           closed: Collection[Part] = ()) -> Remedy | None:
    """What to try next for ``symptom`` under ``config``: the first owner's advice, owners in the classic order
    (the data pipeline before the arithmetic, the arithmetic before compile), that can act.

    An owner's advice is passed over where it could not act: on ``device``, a knob that does not act on its kind, or
    a value the owners' rules warn about or refuse there (bf16 where bf16 is emulated); a knob whose code path the
    step never ran (``paths``); a knob whose part of the step a headspace ceiling found worth nothing (``closed``:
    the parts whose ceiling reads "same"). The next owner's advice is then the answer, or none."""
    for owner in OWNERS:
        advise = owner.remedies.get(symptom)
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
    """Every owner's global torch switches for the duration, each put back on exit (in the reverse order)."""
    with contextlib.ExitStack() as stack:
        for owner in OWNERS:
            if owner.global_flags is not None:
                stack.enter_context(owner.global_flags(config))
        yield


def facts(config: Config, device_kind: str, visible_gpus: int) -> Facts:
    """The owners' account of how a burst of ``config`` runs on such a machine."""
    return merged_facts(OWNERS, config, device_kind, visible_gpus)


def prepare_model(model: nn.Module, config: Config, device: torch.device, blocks: str | None = None,
                  stages: Collection[ModelStage] = MODEL_STAGES) -> tuple[nn.Module, nn.Module, str]:
    """``model`` (already on ``device``) as the owners change it at ``stages`` (all of them: reformatted,
    converted, checkpointed, wrapped and compiled, in :data:`~.owner.MODEL_STAGES` order); returns ``(model to call,
    unwrapped model, what was compiled)``. ``blocks``: the workload's stack of repeated blocks (None: found in the
    model where a knob works per block).

    The model is not moved here: the step moves it before, and the memory estimate changes fake weights in place,
    which a move would replace."""
    site = ModelSite(device=device, blocks=blocks, unwrapped=model)
    model = run_model_stages(OWNERS, model, config, site, stages)
    return model, site.unwrapped, site.compiled


def model_notes(workload: Workload, config: Config) -> list[str]:
    """What the owners that change the model will do to ``workload``'s, read from its outline before any process
    starts (ValueError: what they cannot do)."""
    return [note for owner in OWNERS if owner.model_notes is not None for note in owner.model_notes(workload, config)]


__all__ = [
    "CLIMBS",
    "GROUPS",
    "GROUP_TITLES",
    "KNOBS",
    "MODEL_STAGES",
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
    "ModelSite",
    "ModelStage",
    "ModelStep",
    "Owner",
    "Part",
    "Remedy",
    "Rule",
    "Search",
    "SearchContext",
    "Symptom",
    "facts",
    "global_flags",
    "model_notes",
    "owner_of",
    "prepare_model",
    "remedy",
]
