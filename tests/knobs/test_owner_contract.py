"""The knob owner's contract: an :class:`Owner` refuses a declaration that breaks it, the model stages run in their
fixed order whatever owner declares them, and each fact has one owner."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_widgets import Config
from accel_widgets.knobs import MODEL_STAGES, OWNERS, ModelSite, ModelStage, ModelStep, Owner, Rule
from accel_widgets.knobs.base import STYLES, Knob, nothing
from accel_widgets.knobs.owner import merged_facts, run_model_stages


def toy_knob(name: str = "toy", group: str = "toy") -> Knob:
    return Knob(name=name, group=group, kind=bool, default=False, what="A toy.", why="To test.", when="Never.")


def toy_owner(group: str = "toy", **declared: object) -> Owner:
    """An owner of one knob, ``toy``, with a recipe that writes nothing; ``declared`` replaces any field."""
    fields: dict[str, object] = {"group": group, "title": "Toy", "knobs": [toy_knob(group=group)],
                                 "recipe": {"toy": dict.fromkeys(STYLES, nothing)}}
    return Owner(**{**fields, **declared})


def test_an_owner_refuses_a_knob_of_another_group() -> None:
    with pytest.raises(ValueError, match=r"knob owner 'toy': knob 'toy' is of group 'other'"):
        toy_owner(knobs=[toy_knob(group="other")])


def test_an_owner_refuses_a_rule_about_none_of_its_knobs() -> None:
    rule = Rule(("num_workers",), "warning", lambda config, device: False, lambda config, device: "")
    with pytest.raises(ValueError, match=r"knob owner 'toy': a rule names \['num_workers'\], none of them its own"):
        toy_owner(rules=[rule])


def test_an_owner_refuses_a_recipe_that_misses_a_knob_or_a_style() -> None:
    with pytest.raises(ValueError, match=r"knob owner 'toy': its recipe covers \[\], its knobs are \['toy'\]"):
        toy_owner(recipe={})
    with pytest.raises(ValueError, match=r"the recipe of 'toy' covers styles \['pytorch'\]"):
        toy_owner(recipe={"toy": {"pytorch": nothing}})


def test_an_owner_refuses_a_model_step_at_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match=r"knob owner 'toy': a model step at stage 'shard': the stages are layout, "):
        toy_owner(model_steps={"shard": lambda model, config, site: model})


def test_an_owner_is_frozen_and_keeps_no_list_of_its_module() -> None:
    knobs = [toy_knob()]
    owner = toy_owner(knobs=knobs)
    knobs.append(toy_knob("other"))
    assert owner.knobs == (knobs[0],)
    with pytest.raises(TypeError):
        owner.recipe["other"] = {}  # type: ignore[index]


def recording(stage: str, calls: list[str], *, wraps: bool = False) -> ModelStep:
    """A step that records its stage and what it was handed; a wrapping one returns a new module around the model."""

    def step(model: nn.Module, config: Config, site: ModelSite) -> nn.Module:
        calls.append(f"{stage}: {type(model).__name__}, unwrapped {type(site.unwrapped).__name__}")
        return nn.Sequential(model) if wraps else model

    return step


def test_the_stages_run_in_their_order_whichever_owner_declares_them() -> None:
    """Owners in the registry's order, stages in MODEL_STAGES order: the last owner's early stage runs before the first
    owner's late one. The "compile" stage finds the model as "wrap" received it in ``site.unwrapped``."""
    calls: list[str] = []
    first = toy_owner("first", knobs=[toy_knob(group="first")],
                      model_steps={stage: recording(stage, calls) for stage in ("compile", "compile-blocks")})
    last = toy_owner("last", knobs=[toy_knob(group="last")],
                     model_steps={"wrap": recording("wrap", calls, wraps=True), "layout": recording("layout", calls)})
    model = nn.Linear(2, 2)
    site = ModelSite(device=torch.device("cpu"), blocks=None, unwrapped=model)
    called = run_model_stages((first, last), model, Config(), site, MODEL_STAGES)
    assert calls == ["layout: Linear, unwrapped Linear", "compile-blocks: Linear, unwrapped Linear",
                     "wrap: Linear, unwrapped Linear", "compile: Sequential, unwrapped Linear"]
    assert isinstance(called, nn.Sequential) and site.unwrapped is model


def test_a_subset_of_the_stages_runs_in_the_fixed_order_and_an_unknown_one_is_refused() -> None:
    calls: list[str] = []
    owner = toy_owner(model_steps={stage: recording(stage, calls) for stage in MODEL_STAGES})
    model = nn.Linear(2, 2)
    run_model_stages((owner,), model, Config(), ModelSite(torch.device("cpu"), None, model), ("recompute", "layout"))
    assert [call.partition(":")[0] for call in calls] == ["layout", "recompute"]
    with pytest.raises(ValueError, match=r"unknown model stage\(s\) \['shard'\]"):
        run_model_stages((owner,), model, Config(), ModelSite(torch.device("cpu"), None, model),
                         ("shard",))  # type: ignore[arg-type]


def test_the_registry_changes_the_model_at_each_stage_through_its_owner() -> None:
    """torchtitan's order, by owner: the layout, float8's swap, checkpointing, the blocks' compile, DDP or FSDP, the
    whole-model compile."""
    declared: dict[ModelStage, list[str]] = {stage: [owner.group for owner in OWNERS if stage in owner.model_steps]
                                             for stage in MODEL_STAGES}
    assert declared == {"layout": ["system"], "low-precision": ["float8"], "recompute": ["memory"],
                        "compile-blocks": ["compile"], "wrap": ["parallel"], "compile": ["compile"]}


def test_each_fact_has_one_owner() -> None:
    def giving(group: str, **fact: object) -> Owner:
        return toy_owner(group, knobs=[toy_knob(group=group)], facts=lambda config, kind, gpus: fact)

    owners = (giving("a", math="fp32", compiled=False), giving("b", gpus=0, micro_batches=1))
    assert merged_facts(owners, Config(), "cpu", 0).micro_batches == 1
    with pytest.raises(ValueError, match=r"Facts.math is given by knob owners 'a' and 'c'"):
        merged_facts((*owners, giving("c", math="bf16")), Config(), "cpu", 0)
    with pytest.raises(ValueError, match=r"knob owners give \['speed'\], which are no fields of Facts"):
        merged_facts((*owners, giving("c", speed=2)), Config(), "cpu", 0)
