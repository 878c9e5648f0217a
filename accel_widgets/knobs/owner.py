"""What a knob owner is: the :class:`Owner` each owner module declares, and the stages it may change the model at.

An owner module (``data``, ``precision``, ...) ends with one ``OWNER = Owner(...)``; :mod:`accel_widgets.knobs`
composes the owners and names none of them. The contract is checked when the owner is built, so a knob of another
group, a rule about nobody's knobs or a recipe that forgets a knob fails at import, naming the owner.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from .base import RUNGS, STYLES, Climb, Facts, Group, Knob, RecipeEntry, Remedy, Rule, Style, Symptom

if TYPE_CHECKING:
    from ..inputs.workload import Workload
    from .config import Config

#: Where an owner may change the model, in the order the stages run (:func:`run_model_stages`): torchtitan's order.
#: The layout ("layout": channels_last) is given to the weights before anything else holds them; float8 swaps the
#: linear layers ("low-precision") before anything holds them; checkpointing ("recompute") replaces the blocks'
#: forwards before FSDP shards those blocks (its all-gather hooks then run around the recompute too); the blocks are
#: compiled ("compile-blocks", ``compile_scope='blocks'``) before DDP or FSDP takes them ("wrap"); and a whole-model
#: compile ("compile") comes last, over everything the step runs. FSDP changes the model in place, so under it the
#: unwrapped model is the sharded one (its parameters are what the optimizer steps).
ModelStage = Literal["layout", "low-precision", "recompute", "compile-blocks", "wrap", "compile"]
MODEL_STAGES: tuple[ModelStage, ...] = typing.get_args(ModelStage)


@dataclass
class ModelSite:
    """What a model stage needs besides the model and the config, and what the stages tell the caller.

    ``device``: the device the step runs on (the model is already there); ``blocks``: the workload's stack of repeated
    blocks (None: found in the model where a knob works per block). ``unwrapped``: the model as the "wrap" stage
    received it, set by :func:`run_model_stages` as that stage begins (the model it was given until then): what the
    optimizer steps and what the "compile" stage finds the blocks in. ``compiled``: what the "compile" stage compiled,
    in words ("" when nothing).
    """

    device: torch.device
    blocks: str | None
    unwrapped: nn.Module
    compiled: str = ""


#: One owner's change to the model at one stage: the model to hand the next step (the same module where it changed
#: it in place).
ModelStep = Callable[[nn.Module, "Config", ModelSite], nn.Module]


@dataclass(frozen=True, eq=False)
class Owner:
    """One optimisation group's knobs and everything about them, declared once by the module that owns them.

    ``group``/``title``: the group every knob names and its title; ``knobs``: the declarations; ``rules``: the
    combinations that cannot run or make no sense, each naming at least one of these knobs; ``ladder``: the owner's
    part of the classic ladder's rungs; ``remedies``: per symptom the diagnosis reads, the advice (or None where there
    is none for a config); ``recipe``: per knob and style (every knob, every style), what a recipe writes.

    What the knobs do to a run, each optional: ``model_steps``: per :data:`ModelStage`, the change to the model
    (stages run in :data:`MODEL_STAGES` order, owners in the registry's order within one); ``model_notes``: what
    those changes will do to a workload's model, said before any process starts, read from its outline (ValueError:
    what they cannot do); ``global_flags``: torch's global switches for the duration of a run, each put back on exit;
    ``facts``: the owner's fields of :class:`~.base.Facts` for a config on a device kind with so many visible GPUs (no
    two owners give the same field).

    Equality is identity: there is one owner per group, and the registry hands out the declared object itself.
    """

    group: Group
    title: str
    knobs: Sequence[Knob]
    recipe: Mapping[str, Mapping[Style, RecipeEntry]]
    rules: Sequence[Rule] = ()
    ladder: Sequence[Climb] = ()
    remedies: Mapping[Symptom, Callable[[Config], Remedy | None]] = field(default_factory=dict)
    model_steps: Mapping[ModelStage, ModelStep] = field(default_factory=dict)
    model_notes: Callable[[Workload, Config], list[str]] | None = None
    global_flags: Callable[[Config], AbstractContextManager[None]] | None = None
    facts: Callable[[Config, str, int], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        # The owner keeps read-only copies: the module's lists and dicts are its building blocks, not its state.
        for name in ("knobs", "rules", "ladder"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("recipe", "remedies", "model_steps"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        problems = [*self._knob_problems(), *self._declaration_problems()]
        if problems:
            raise ValueError(f"knob owner {self.group!r}: " + "; ".join(problems))

    def _knob_problems(self) -> list[str]:
        """Knobs of another group, rules about none of this owner's knobs, recipes that miss a knob or a style."""
        names = [knob.name for knob in self.knobs]
        problems = [f"knob {knob.name!r} is of group {knob.group!r}" for knob in self.knobs if knob.group != self.group]
        problems += [f"a rule names {list(rule.knobs)}, none of them its own knobs {names}" for rule in self.rules
                     if not set(rule.knobs) & set(names)]
        if set(self.recipe) != set(names):
            problems.append(f"its recipe covers {sorted(self.recipe)}, its knobs are {sorted(names)}")
        problems += [f"the recipe of {name!r} covers styles {sorted(entries)}, not {list(STYLES)}"
                     for name, entries in self.recipe.items() if set(entries) != set(STYLES)]
        return problems

    def _declaration_problems(self) -> list[str]:
        """Climbs of no rung, remedies for no symptom, model steps at no stage."""
        symptoms = typing.get_args(Symptom)
        problems = [f"a climb is on rung {climb.rung!r}, not one of {RUNGS}" for climb in self.ladder
                    if climb.rung not in RUNGS]
        problems += [f"a remedy for {symptom!r}, which is no Symptom" for symptom in self.remedies
                     if symptom not in symptoms]
        problems += [f"a model step at stage {stage!r}: the stages are {', '.join(MODEL_STAGES)}"
                     for stage in self.model_steps if stage not in MODEL_STAGES]
        return problems


def run_model_stages(owners: Sequence[Owner], model: nn.Module, config: Config, site: ModelSite,
                     stages: Collection[ModelStage]) -> nn.Module:
    """``model`` after each of ``stages`` (a subset of :data:`MODEL_STAGES`, run in that order whatever order it is
    given in), each stage's steps in ``owners``' order. ``site.unwrapped`` is the model as the "wrap" stage began,
    whether or not "wrap" is among ``stages``."""
    unknown = [stage for stage in stages if stage not in MODEL_STAGES]
    if unknown:
        raise ValueError(f"unknown model stage(s) {unknown}: the stages are {', '.join(MODEL_STAGES)}")
    for stage in MODEL_STAGES:
        if stage == "wrap":
            site.unwrapped = model
        if stage not in stages:
            continue
        for owner in owners:
            step = owner.model_steps.get(stage)
            if step is not None:
                model = step(model, config, site)
    return model


def merged_facts(owners: Sequence[Owner], config: Config, device_kind: str, visible_gpus: int) -> Facts:
    """The owners' account of how a burst of ``config`` runs on such a machine: each owner's fields of
    :class:`~.base.Facts`, every field from one owner only (ValueError naming both where two give it)."""
    given: dict[str, Any] = {}
    said_by: dict[str, Group] = {}
    for owner in owners:
        if owner.facts is None:
            continue
        for name, value in owner.facts(config, device_kind, visible_gpus).items():
            if name in said_by:
                raise ValueError(f"Facts.{name} is given by knob owners {said_by[name]!r} and {owner.group!r}: "
                                 "each fact has one owner")
            given[name], said_by[name] = value, owner.group
    unknown = set(given) - {f.name for f in fields(Facts)}
    if unknown:
        raise ValueError(f"knob owners give {sorted(unknown)}, which are no fields of Facts")
    return Facts(**given)
