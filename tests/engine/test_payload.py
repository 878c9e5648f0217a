"""The payload carries the user's modules' code as this process holds it: by value, with its file name; what cannot
travel that way goes by name and is said, naming the module."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

from accel_widgets.engine.payload import UserCodeWarning, pickle_for_ranks

ROOT = Path(__file__).resolve().parents[2]
MODELS = '''
import layers

SCALE = {scale}


class Net:
    def forward(self, x):
        return layers.shift(x * SCALE)
'''
LAYERS = "def shift(x):\n    return x + 0\n"
#: Another process unpickles what was sent (in this one, cloudpickle hands back the class it pickled).
RECEIVE = '''
import json, sys
import cloudpickle
import layers
Net = cloudpickle.loads(open(sys.argv[1], "rb").read())
forward = Net.forward
print(json.dumps({"module_loaded": "models" in sys.modules, "file": forward.__code__.co_filename,
                  "scale": forward.__globals__["SCALE"], "layers_by_name": forward.__globals__["layers"] is layers,
                  "out": Net().forward(2)}))
'''
LOCKED = '''
import threading

LOCK = threading.Lock()


def loss(output, target):
    with LOCK:
        return ((output - target) ** 2).mean()
'''


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of the user's own modules on ``sys.path``; they are forgotten again after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # two edits within one second must both be seen
    yield tmp_path
    for name in ("models", "layers", "tools", "tools.locked"):
        sys.modules.pop(name, None)


def _write(where: Path, name: str, source: str) -> None:
    (where / f"{name}.py").write_text(textwrap.dedent(source))
    importlib.invalidate_caches()


def test_a_reloaded_module_travels_as_it_is_now_with_its_file_name_and_its_module_objects_by_name(user_dir):
    _write(user_dir, "layers", LAYERS)
    _write(user_dir, "models", MODELS.format(scale=1.0))
    import models

    _write(user_dir, "models", MODELS.format(scale=3.0))
    importlib.reload(models)
    payload, notes = pickle_for_ranks(models.Net)
    assert notes == [] and cloudpickle.list_registry_pickle_by_value() == set()  # the registry is as it was
    (user_dir / "payload").write_bytes(payload)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(user_dir)]), "ACCEL_WIDGETS_PRESTART": "0"}
    done = subprocess.run([sys.executable, "-c", RECEIVE, str(user_dir / "payload")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    received = json.loads(done.stdout)
    assert received == {"module_loaded": False,  # rebuilt from its code, by value: models was never imported there
                        "file": models.__file__,  # a traceback names models.py, not cloudpickle's <dynamic-code>
                        "scale": 3.0, "layers_by_name": True, "out": 6.0}


def test_a_module_whose_code_cannot_be_pickled_travels_by_name_and_is_named_before_the_burst(user_dir):
    """The module that cannot travel sits in a package of the user's: both leave the by-value registry (the
    package's registration would cover it), the rest of the user's code still travels by value."""
    _write(user_dir, "layers", LAYERS)
    _write(user_dir, "models", MODELS.format(scale=1.0))
    (user_dir / "tools").mkdir()
    _write(user_dir / "tools", "__init__", "")
    _write(user_dir / "tools", "locked", LOCKED)
    import models
    from tools import locked

    with pytest.warns(UserCodeWarning, match=r"tools.locked \(locked.py\) travels to the ranks by name.*cannot be "
                                             r"pickled \(TypeError: cannot pickle '_thread.lock' object\)"):
        payload, notes = pickle_for_ranks((models.Net, locked.loss))
    assert len(notes) == 1 and notes[0].startswith("tools.locked (locked.py)")
    assert b"_make_skeleton_class" in payload  # Net: by value, still
    assert cloudpickle.loads(payload)[1] is locked.loss  # the refused one: by name


def test_a_user_module_registered_by_value_by_the_user_stays_registered(user_dir):
    _write(user_dir, "layers", LAYERS)
    import layers

    cloudpickle.register_pickle_by_value(layers)
    try:
        pickle_for_ranks(layers.shift)
        assert cloudpickle.list_registry_pickle_by_value() == {"layers"}
    finally:
        cloudpickle.unregister_pickle_by_value(layers)
