"""The process group is joined in one place, for a burst's ranks and an exported script's alike."""

from pathlib import Path

import torch
import torch.distributed as dist

from accel_widgets.engine.group import joined

PACKAGE = Path(__file__).resolve().parents[2] / "accel_widgets"


def test_only_the_group_module_initialises_a_process_group():
    users = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                   if "init_process_group" in path.read_text())
    assert users == ["engine/group.py"]
    joiners = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if "joined(" in path.read_text())
    assert joiners == ["engine/group.py", "engine/worker.py", "job/run.py"]


def test_a_run_without_a_group_joins_nothing():
    with joined(None, 0, torch.device("cpu"), rendezvous_file=None, timeout_s=1.0):
        assert not dist.is_initialized()
