"""The process group is joined in one place, for a burst's ranks and an exported script's alike."""

import ast
from pathlib import Path

import torch
import torch.distributed as dist

from accel_widgets.engine.group import joined

PACKAGE = Path(__file__).resolve().parents[2] / "accel_widgets"


def calls(name: str) -> list[str]:
    """The package's modules that call ``name`` (a recipe's code that a user will run is text, not a call)."""
    def called(path: Path) -> bool:
        return any(isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == name
                                                   or getattr(node.func, "id", None) == name)
                   for node in ast.walk(ast.parse(path.read_text())))
    return sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if called(path))


def test_only_the_group_module_initialises_a_process_group():
    assert calls("init_process_group") == ["engine/group.py"]
    assert calls("joined") == ["engine/worker.py", "job/run.py"]


def test_a_run_without_a_group_joins_nothing():
    with joined(None, 0, torch.device("cpu"), rendezvous=None, timeout_s=1.0):
        assert not dist.is_initialized()
