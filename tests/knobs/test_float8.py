"""The float8 owner, driven by fakes: which layers torchao's per-shape rule converts at real sizes, and each refusal.

No float8 kernel can run here (no CUDA, no torchao): the GPU check's second script runs it for real
(``benchmarks/gpu_modern.py``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import pytest
import torch
from torch import nn

from accel_widgets import Config, ConfigError, Workload, check_config
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs import float8
from accel_widgets.knobs.plan import resolve
from tests.workloads import tensors

MiB = 2**20
CPU = DeviceInfo(cpu_count=2, cpu_name="Test CPU")


def gpu(name: str, capability: tuple[int, int], mib: int) -> DeviceInfo:
    return DeviceInfo(cpu_count=16, cpu_name="Host", driver="1.0",
                      gpus=(GpuInfo(0, 0, name, mib * MiB, compute_capability=capability),))


H200, H100, L40S, A100 = (gpu("NVIDIA H200", (9, 0), 143_771), gpu("NVIDIA H100 80GB HBM3", (9, 0), 81_559),
                          gpu("NVIDIA L40S", (8, 9), 46_068), gpu("NVIDIA A100-SXM4-80GB", (8, 0), 81_920))
COMPILED = Config(compile_mode="default", precision="bf16")


class LlamaishBlock(nn.Module):
    """A Llama-3-8B-shaped block: attention projections 4096 x 4096 (k/v 4096 -> 1024: grouped-query) and the MLP
    4096 -> 14336 -> 4096, next to a small 256 x 256 adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(4096, 4096), nn.Linear(4096, 1024), nn.Linear(4096, 1024),
                                          nn.Linear(4096, 4096))
        self.gate, self.up, self.down = nn.Linear(4096, 14336), nn.Linear(4096, 14336), nn.Linear(14336, 4096)
        self.adapter = nn.Linear(256, 256)


def llamaish() -> nn.Module:
    """Two blocks on the meta device: shapes without memory."""
    with torch.device("meta"):
        return nn.Sequential(LlamaishBlock(), LlamaishBlock())


def workload() -> Workload:
    """Its 0.9 billion parameters on the meta device: no memory here."""
    return Workload(model=llamaish, dataset=tensors(64), loss_fn=lambda out, y: out.sum(), name="llamaish")


@pytest.mark.parametrize(("out_features", "in_features", "tensorwise", "rowwise"), [
    (14336, 4096, True, True),  # the MLP's up and gate projections
    (4096, 14336, True, True),  # its down projection
    (4096, 4096, True, True),  # attention's q and o projections
    (4096, 2048, True, False),  # rowwise's scaling costs more than it gains where out <= 4096 and in <= 2048
    (1024, 4096, False, False),  # grouped-query k/v: too narrow an output for either
    (256, 256, False, False),  # small layers lose to the casts
    (14336, 4100, False, False),  # a dimension that is no multiple of 16: no float8 kernel
    (8192, 1024, True, False),  # rowwise needs in > 1024
])
def test_torchaos_per_shape_rule_at_real_sizes(out_features, in_features, tensorwise, rowwise):
    assert float8.gains_from_float8(out_features, in_features, "tensorwise") is tensorwise
    assert float8.gains_from_float8(out_features, in_features, "rowwise") is rowwise


def test_the_layers_converted_and_kept_are_named():
    chosen, left = float8.selected_layers(llamaish(), Config(float8="tensorwise"))
    assert len(chosen) == 10 and len(left) == 6
    assert "0.up (4096 -> 14336)" in chosen and "0.adapter (256 -> 256)" in left and "0.k (4096 -> 1024)" in left


@pytest.mark.parametrize(("device", "reason"), [
    (CPU, "needs a CUDA GPU with float8 tensor cores .* this machine has no CUDA GPU"),
    (A100, r"NVIDIA A100-SXM4-80GB \(compute capability 8.0\) has none. Use precision='bf16' there"),
])
def test_float8_is_refused_where_no_float8_tensor_core_runs_it(device, reason):
    with pytest.raises(ConfigError, match=reason):
        check_config(COMPILED.replace(float8="rowwise"), device)


@pytest.mark.parametrize("device", [H200, H100, L40S])
def test_hopper_and_ada_run_it_and_without_compile_it_warns(device):
    assert check_config(COMPILED.replace(float8="tensorwise"), device) == []
    warnings = check_config(Config(float8="tensorwise"), device)
    assert any("without torch.compile" in w for w in warnings)


def test_without_torchao_the_refusal_gives_the_install_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else _spec(name))
    with pytest.raises(ConfigError, match=r"torchao, which is not installed here: pip install torchao"):
        resolve(COMPILED.replace(float8="tensorwise"), H200, workload())


def _spec(name: str) -> Any:
    return importlib.machinery.ModuleSpec(name, None)


def test_before_any_process_starts_the_plan_says_what_float8_converts(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _spec)  # torchao "installed"
    (note,) = resolve(COMPILED.replace(float8="tensorwise"), H200, workload()).warnings
    assert note.startswith("float8='tensorwise' converts 10 of 16 linear layers of Workload.model (Sequential); left "
                           "in high precision (too small to gain): 0.k (4096 -> 1024), 0.v (4096 -> 1024), 0.adapter")
    small = Workload(model=nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256)), dataset=tensors(64),
                     loss_fn=lambda out, y: out.sum())
    (nothing,) = resolve(COMPILED.replace(float8="rowwise"), H200, small).warnings
    assert "converts no layer of Workload.model (Sequential): each of its 2 linear layers is below" in nothing


def test_the_conversion_hands_torchao_the_rule_and_the_recipe(monkeypatch):
    """A stand-in for ``torchao.float8`` records what the owner asks of it; the filter it is given is the rule."""
    calls: dict[str, Any] = {}

    def convert_to_float8_training(model, *, module_filter_fn, config):
        calls["recipe"], calls["kept"] = config, [name for name, module in model.named_modules()
                                                  if isinstance(module, nn.Linear) and module_filter_fn(module, name)]
        return model

    fake = types.ModuleType("torchao.float8")
    fake.convert_to_float8_training = convert_to_float8_training
    fake.Float8LinearConfig = types.SimpleNamespace(from_recipe_name=lambda recipe: f"recipe:{recipe}")
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    model = llamaish()
    assert float8.convert(model, Config(float8="rowwise")) is model
    assert calls["recipe"] == "recipe:rowwise"
    assert calls["kept"] == [f"{block}.{name}" for block in (0, 1) for name in ("q", "o", "gate", "up", "down")]
    assert float8.convert(model, Config()) is model and len(calls) == 2  # off: torchao is not asked
