"""One knob, one place: every knob is declared by exactly one module, which owns its behaviour too."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable

import pytest
import torch
from torch import nn

from accel_widgets import Config
from accel_widgets.knobs import (
    GROUPS,
    KNOBS,
    OWNERS,
    RUNGS,
    Facts,
    Owner,
    Symptom,
    compiling,
    facts,
    overhead,
    owner_of,
)
from accel_widgets.knobs.data import DEFAULT_BATCH_SIZE, copy_batch, resolve_batch_size
from tests.workloads import TinyNet, tiny_workload


def _declared_by(name: str) -> list[Owner]:
    return [owner for owner in OWNERS if any(knob.name == name for knob in owner.knobs)]


def test_every_config_field_is_a_knob_owned_by_exactly_one_module():
    for field in dataclasses.fields(Config):
        assert len(_declared_by(field.name)) == 1, f"{field.name} is owned by {_declared_by(field.name)}"
    assert sorted(KNOBS) == sorted(f.name for f in dataclasses.fields(Config))


def test_each_module_owns_one_group_in_the_classic_order():
    for owner in OWNERS:
        assert {knob.group for knob in owner.knobs} == {owner.group}, owner.group
    assert [owner.group for owner in OWNERS] == list(GROUPS)
    assert GROUPS[:2] == ("data", "precision") and GROUPS[-1] == "parallel"


def test_every_rule_names_its_owners_knob_and_only_registry_knobs():
    """A rule lives with one of the knobs it involves, and names only knobs of the registry."""
    for owner in OWNERS:
        own = {knob.name for knob in owner.knobs}
        for rule in owner.rules:
            assert set(rule.knobs) <= set(KNOBS), (owner.group, rule.knobs)
            assert own & set(rule.knobs), f"{owner.group} holds a rule about {rule.knobs}, none of them its own"


def test_every_owner_declares_its_part_of_the_ladder_and_its_remedies():
    for owner in OWNERS:
        assert all(climb.rung in RUNGS for climb in owner.ladder), owner.group
        assert all(isinstance(advice, Callable) for advice in owner.remedies.values()), owner.group
        for symptom, advise in owner.remedies.items():
            assert symptom in typing.get_args(Symptom), (owner.group, symptom)
            remedy = advise(Config())
            assert remedy is None or owner_of(remedy.knob) is owner, (owner.group, symptom, remedy)


def test_facts_are_the_owners_account_of_a_run():
    assert facts(Config(), "cpu", 0) == Facts(math="fp32", compiled=False, gpus=0, micro_batches=1)
    assert facts(Config(tf32=True), "cuda", 1).math == "tf32"
    assert facts(Config(tf32=True), "cpu", 0).math == "fp32"  # TF32 is CUDA-only
    gpu = facts(Config(precision="bf16", compile_mode="default", grad_accum_steps=4), "cuda", 8)
    assert (gpu.math, gpu.compiled, gpu.gpus, gpu.micro_batches) == ("bf16", True, 1, 4)
    assert facts(Config(parallel="dataparallel"), "cuda", 4).gpus == 4
    assert facts(Config(parallel="ddp", world_size=2), "cuda", 4).gpus == 2


def test_batch_size_and_the_copy_to_the_device():
    assert resolve_batch_size(Config(), tiny_workload()) == 32
    assert resolve_batch_size(Config(batch_size=8), tiny_workload()) == 8
    workload = tiny_workload()
    workload.batch_size = None
    assert resolve_batch_size(Config(), workload) == DEFAULT_BATCH_SIZE
    batch = copy_batch([torch.zeros(4, 3, 2, 2), {"y": torch.ones(4)}], torch.device("cpu"), Config(),
                       channels_last=True)
    assert batch[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(("impl", "flags"), [("for-loop", (False, False)), ("foreach", (True, False)),
                                             ("fused", (False, True))])
def test_optimizer_implementation_is_rebuilt_with_the_same_hyperparameters(impl, flags):
    workload = tiny_workload(optimizer=lambda p: torch.optim.AdamW(p, lr=0.123, weight_decay=0.5))
    optimizer = overhead.build_optimizer(workload, list(TinyNet().parameters()), Config(optimizer_impl=impl))
    group = optimizer.param_groups[0]
    assert (group["foreach"], group["fused"]) == flags
    assert (group["lr"], group["weight_decay"]) == (0.123, 0.5)


def test_optimizer_without_the_implementation_is_a_clear_error():
    workload = tiny_workload(optimizer=lambda p: torch.optim.LBFGS(p))
    with pytest.raises(ValueError, match="LBFGS has no 'foreach' option"):
        overhead.build_optimizer(workload, list(TinyNet().parameters()), Config(optimizer_impl="foreach"))


def test_compiler_failures_are_said_in_terms_of_the_knob():
    class Boom(Exception):
        pass

    Boom.__module__ = "torch._inductor.exc"
    error = compiling.first_step_error(Boom("C++ compiler not found"), Config(compile_mode="default"))
    assert isinstance(error, compiling.CompileError)
    assert "failed at the first step: Boom: C++ compiler not found" in str(error)
    assert compiling.first_step_error(Boom("x"), Config()) is None  # not compiling: not the compiler's fault
    assert compiling.first_step_error(ValueError("x"), Config(compile_mode="default")) is None
    assert compiling.default_warmup_steps(Config(compile_mode="default")) == 3
    model = nn.Linear(2, 2)
    assert compiling.compile_model(model, model, Config(), None) == (model, "")  # not compiling: as it was


def test_loss_reads_follow_sync_every():
    assert overhead.loss_read_due(1, Config())
    assert not overhead.loss_read_due(2, Config(sync_every=3)) and overhead.loss_read_due(3, Config(sync_every=3))
    assert not overhead.loss_read_due(1000, Config(sync_every=0))
