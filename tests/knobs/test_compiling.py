"""The compiling owner: what compile_scope compiles, the ladder's choice of it, and what torch.compile did, read from
torch's own records (graphs, graph breaks with the user's line, recompiles with the failed guard)."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import io
import json
import logging

import pytest
import torch
from torch import nn

from accel_widgets import Config
from accel_widgets.demos import demo_workload
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs import compiling, prepare_model
from accel_widgets.knobs.compiling import CompileReport, CompileWatch, GraphBreak, Recompile
from accel_widgets.knobs.rules import check_config
from accel_widgets.search.ladder import classic_ladder
from tests.devices import cpu_device
from tests.workloads import TinyNet, tiny_workload


class Stack(nn.Module):
    """An embedding, three alike blocks and a head: the blocks hold most of the parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


#: Python's own print, as this module found it on import.
PRINT = builtins.print


class Chatty(nn.Module):
    """Prints in forward: torch.compile breaks the graph there."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x @ self.weight
        print("between the matmuls")
        return x @ self.weight


def test_blocks_are_compiled_in_place_and_the_model_is_the_same_object():
    model = Stack()
    called, scope = compiling.compile_model(model, model, Config(compile_mode="default", compile_scope="blocks"), None)
    assert called is model  # in place: a DDP wrapper or hooks around the model stay as they were
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert model._compiled_call_impl is None and model.embed._compiled_call_impl is None
    assert scope.startswith("3 x Sequential at layers (")


def test_the_whole_model_is_compiled_by_default_and_when_it_has_no_alike_blocks():
    model = TinyNet()
    called, scope = compiling.compile_model(model, model, Config(compile_mode="default"), None)
    assert isinstance(called, torch._dynamo.eval_frame.OptimizedModule) and scope == "the whole model"
    with pytest.warns(compiling.CompileScopeWarning, match="TinyNet has no stack of alike blocks"):
        called, scope = compiling.compile_model(model, model, Config(compile_mode="default", compile_scope="blocks"),
                                                None)
    assert isinstance(called, torch._dynamo.eval_frame.OptimizedModule)
    assert scope == "the whole model (no stack of alike blocks found)"


def test_blocks_without_a_compile_mode_and_blocks_with_cuda_graphs_are_warned_about():
    cpu = cpu_device()
    gpu = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "NVIDIA H200", 143_771 << 20),))
    assert any("compile_mode='off' compiles nothing" in w for w in check_config(Config(compile_scope="blocks"), cpu))
    graphs = Config(compile_mode="reduce-overhead", compile_scope="blocks")
    assert any("records a CUDA graph per block" in w for w in check_config(graphs, gpu))
    assert not any("per block" in w for w in check_config(graphs.replace(compile_scope="model"), gpu))


def test_the_ladder_compiles_by_blocks_where_alike_blocks_hold_most_of_the_model():
    lm = next(rung for rung in classic_ladder(demo_workload("lm", num_samples=64), cpu_device())
              if rung.name == "+compile")
    assert (lm.config.compile_mode, lm.config.compile_scope) == ("default", "blocks")
    assert "regional compilation" in lm.why
    tiny = next(rung for rung in classic_ladder(tiny_workload(), cpu_device()) if rung.name == "+compile")
    assert (tiny.config.compile_mode, tiny.config.compile_scope) == ("default", "model")


def _graph_breaks_of_chatty() -> CompileReport:
    with CompileWatch() as watch, contextlib.redirect_stdout(io.StringIO()):
        chatty = torch.compile(Chatty(), backend="eager")
        for _ in range(3):
            chatty(torch.ones(2, 4))
    return watch.report("the whole model")


def test_graph_breaks_are_recorded_with_the_users_line_and_reason(monkeypatch):
    monkeypatch.setattr(builtins, "print", PRINT)  # Python's own, whoever replaced it in this process before
    report = _graph_breaks_of_chatty()
    assert (report.graphs, report.graph_break_count, report.recompiles) == (2, 1, 0)
    (found,) = report.graph_breaks
    assert found.file == __file__ and found.function == "forward"
    assert found.code == 'print("between the matmuls")'
    assert found.reason == "Failed to trace builtin operator" and "`print`" in found.explanation
    assert found.hint.startswith("Avoid calling builtin `print`")
    line = Chatty.forward.__code__.co_firstlineno + 2
    assert found.line == line
    assert found.text() == (f'1x at test_compiling.py:{line} in forward (`print("between the matmuls")`): Failed to '
                            "trace builtin operator")
    assert report.compile_s > 0


def test_a_break_inside_a_library_the_users_line_called_names_the_users_line(monkeypatch):
    """Ray, once a cluster is joined, replaces ``print`` with its own function, in which torch then breaks: the break
    is named at the user's line that called it, not inside Ray."""
    tqdm_ray = pytest.importorskip("ray.experimental.tqdm_ray")
    monkeypatch.setattr(builtins, "print", tqdm_ray.safe_print)
    (found,) = _graph_breaks_of_chatty().graph_breaks
    assert (found.file, found.function, found.code) == (__file__, "forward", 'print("between the matmuls")')
    assert found.line == Chatty.forward.__code__.co_firstlineno + 2


def test_recompiles_are_recorded_with_the_failed_guard():
    """A new length recompiles once (torch then makes that dimension dynamic); a Python number on the module that
    changes every call recompiles on every call."""

    class Counted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.calls

    counted = Counted()
    with CompileWatch() as watch:
        lengths = torch.compile(lambda x: x.sum(), backend="eager")
        for length in (2, 3, 4, 5):
            lengths(torch.ones(length))
        compiled = torch.compile(counted, backend="eager")
        for calls in range(4):
            counted.calls = calls
            compiled(torch.ones(2))
    report = watch.report("the whole model")
    assert report.recompiles == 1 + 3 and report.graph_break_count == 0
    by_reason = {r.reason: r for r in report.recompile_reasons}
    assert by_reason["tensor 'x' size mismatch at index 0. expected 2, actual 3"].count == 1
    changed = [r for r in report.recompile_reasons if "calls" in r.reason]
    assert len(changed) == 1 and changed[0].count == 3 and changed[0].function.startswith("forward (test_compiling")


def test_the_watch_puts_torchs_logging_back():
    from torch._logging._internal import log_registry

    names = [name for name in log_registry.get_artifact_log_qnames() if name.endswith(".__graph_breaks")]
    before = [(logging.getLogger(n).level, logging.getLogger(n).propagate, list(logging.getLogger(n).handlers))
              for n in names]
    with CompileWatch():
        pass
    assert [(logging.getLogger(n).level, logging.getLogger(n).propagate, list(logging.getLogger(n).handlers))
            for n in names] == before


def test_reports_merge_over_ranks_and_survive_json():
    one = CompileReport("the whole model", 2, 3, (GraphBreak("Failed to trace builtin operator", "", "", "/m.py", 42,
                                                               "forward", "print(x)", 3),), 1,
                        (Recompile("tensor 'x' size mismatch at index 0. expected 8, actual 12", "forward (m.py:40)",
                                   1),), 5.0)
    two = CompileReport("the whole model", 2, 2, (GraphBreak("Failed to trace builtin operator", "", "", "/m.py", 42,
                                                               "forward", "print(x)", 2),), 2,
                        (Recompile("tensor 'x' size mismatch at index 0. expected 12, actual 16",
                                   "forward (m.py:40)", 2),), 7.0)
    merged = CompileReport.merged([one, two])
    assert (merged.graph_break_count, merged.recompiles, merged.compile_s) == (3, 2, 7.0)
    assert [b.count for b in merged.graph_breaks] == [3] and [r.count for r in merged.recompile_reasons] == [2]
    assert CompileReport.from_dict(json.loads(json.dumps(dataclasses.asdict(merged)))) == merged
    assert merged.text() == "2 graphs, 3 graph breaks, 2 recompiles; torch compiled for 7.0 s"
    assert CompileReport.merged([]) is None


# -- the loss a model computes itself, under CUDA graphs ---------------------------------------------------------------
class OwnLoss(nn.Module):
    """A Hugging Face-style model: given ``labels`` it returns ``{"loss": ...}`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyNet()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


class GraphReplayed(nn.Module):
    """What a model compiled with CUDA graphs hands back: its outputs in the graph's static memory, which the next
    replay overwrites in place (the copy keeps the gradient flowing, as the replayed graph's backward does)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.static: torch.Tensor | None = None

    def forward(self, **batch: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = self.model(**batch)["loss"]
        if self.static is None:
            self.static = torch.zeros_like(loss.detach())
        return {"loss": self.static.detach_().copy_(loss)}


def own_loss_workload():
    from accel_widgets import Workload

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 16, generator=generator), torch.randint(0, 4, (256,), generator=generator)
    items = [{"x": x[i], "labels": y[i]} for i in range(256)]
    return Workload(model=OwnLoss, dataset=items, batch_size=32, name="own-loss")


def losses_read(config: Config, steps: int = 8) -> list[float]:
    """The losses a loop over the graph-replayed model reads, ``config``'s sync_every apart."""
    import tempfile
    import time

    from accel_widgets.engine.training import build_loop
    from accel_widgets.knobs.plan import resolve

    workload = own_loss_workload()
    with tempfile.TemporaryDirectory() as cache:
        loop, raw = build_loop(workload, resolve(config, cpu_device(), workload), torch.device("cpu"), 0,
                               cache_dir=cache, emit=lambda event: None, clock_origin=time.perf_counter())
        loop.model = GraphReplayed(raw)  # instead of the compiled model, which compiles at its first call: CUDA
        # graphs exist on a GPU only
        return loop.losses() if loop.measure(steps, None, 0.0) else []


@pytest.mark.parametrize("sync_every", [0, 4])
def test_under_cuda_graphs_a_model_computed_loss_held_past_the_next_step_keeps_its_value(sync_every):
    """reduce-overhead with sync_every != 1: each held loss is its own step's, as one read every step gives, not the
    last replay's value in the graph's memory (on a GPU torch raises instead: pytorch/pytorch#96693's error)."""
    replayed = Config(compile_mode="reduce-overhead", sync_every=sync_every)
    every_step = losses_read(Config(compile_mode="reduce-overhead"))
    held = losses_read(replayed)
    assert len(set(every_step)) == 8 and held == pytest.approx(every_step)


def test_a_held_loss_is_copied_only_under_the_cuda_graph_modes():
    loss = torch.tensor(2.5, requires_grad=True) * 1.0
    for mode in compiling.CUDA_GRAPH_COMPILE_MODES:
        held = compiling.held_loss(loss, Config(compile_mode=mode))
        assert held.untyped_storage().data_ptr() != loss.untyped_storage().data_ptr() and not held.requires_grad
    plain = compiling.held_loss(loss, Config(compile_mode="default"))
    assert plain.untyped_storage().data_ptr() == loss.untyped_storage().data_ptr()


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_blocks_are_compiled_before_ddp_or_fsdp_takes_them(monkeypatch, parallel):
    """torchtitan's order: checkpointing, then each block compiled, then fully_shard per block (or DDP's wrapper).
    What the wrapper is handed is read at the moment it is called (the wrapper itself is replaced: no process group
    here), and the compile after it leaves the compiled blocks as they are."""
    from accel_widgets.knobs import parallel as parallel_owner

    handed: list[list[bool]] = []

    def wrap_model(model, config, device, blocks_path=None):
        handed.append([layer._compiled_call_impl is not None for layer in model.layers])
        return model

    monkeypatch.setattr(parallel_owner, "wrap_model", wrap_model)
    config = Config(compile_mode="default", compile_scope="blocks", parallel=parallel, world_size=2)
    model = Stack()
    called, raw, scope = prepare_model(model, config, torch.device("cpu"))
    compiled = [layer._compiled_call_impl for layer in model.layers]
    assert handed == [[True, True, True]] and called is raw is model
    assert scope == "3 x Sequential at layers (88% of the parameters), each compiled; the code between them eager"
    called, _ = compiling.compile_model(model, model, config, None)
    assert [layer._compiled_call_impl for layer in model.layers] == compiled  # not compiled a second time
