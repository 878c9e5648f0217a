"""User modules are told from libraries by where their files are: the user's own source travels by value."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from accel_widgets.engine import user_code, worker


def test_libraries_this_package_and_main_are_not_user_modules_the_users_files_are():
    assert not user_code.is_user_module("torch", torch)
    assert not user_code.is_user_module("torch.ops", torch.ops)  # its __file__ is "_ops.py": no file at all
    assert not user_code.is_user_module("json", sys.modules["json"])
    assert not user_code.is_user_module(worker.__name__, worker)  # this package, wherever it is installed
    assert not user_code.is_user_module("__main__", sys.modules["__main__"])
    assert user_code.is_user_module("tests.workloads", importlib.import_module("tests.workloads"))
    assert "tests.workloads" in user_code.user_modules() and "torch" not in user_code.user_modules()


def test_a_folder_of_installed_distributions_on_sys_path_is_a_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``pip install --target DIR`` and DIR on PYTHONPATH: its packages are libraries, not the user's code. A source
    folder on the path is the user's, as is a package installed in editable mode (its ``.dist-info`` goes to
    site-packages, its files stay in the source folder, which its ``.pth`` puts on the path)."""
    for folder in ("target", "mine"):
        (tmp_path / folder).mkdir()
        monkeypatch.syspath_prepend(str(tmp_path / folder))
    (tmp_path / "target" / "vendored.py").write_text("X = 1\n")
    (tmp_path / "target" / "vendored-1.0.dist-info").mkdir()
    (tmp_path / "mine" / "own.py").write_text("X = 2\n")
    importlib.invalidate_caches()
    try:
        import own
        import vendored

        assert not user_code.is_user_module("vendored", vendored)
        assert user_code.is_user_module("own", own)
    finally:
        sys.modules.pop("vendored", None)
        sys.modules.pop("own", None)
