"""Which modules are the user's own code, as opposed to a library's: what travels to the ranks by value.

A user module is a Python source file outside the interpreter's standard library, every site-packages and any
folder holding installed distributions (``*.dist-info``: a ``pip install --target`` folder on ``PYTHONPATH``), and
outside this package: the user's ``models.py`` next to the notebook, a package on ``sys.path``, a package installed
in editable mode (its files stay in the source tree). Such a module may change while the kernel runs (an edit and
``importlib.reload``, ``%autoreload``), so its code travels to the ranks by value (:mod:`.payload` says why), and
the forked server keeps no copy of it (:func:`forget_user_modules`). Libraries do not change under a running
process and travel by name, from the server's preloaded copy.

Standard library only: the forkserver imports this before the caller imports torch.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import types

_PACKAGE = __name__.split(".")[0]
_MAIN_MODULES = ("__main__", "__mp_main__")  # cloudpickle sends their contents by value already


def library_dirs() -> tuple[str, ...]:
    """Where installed code lives, each ending in a separator: the standard library, every site-packages, torch's
    own directory (a source build of torch may sit outside site-packages) and any ``sys.path`` folder that holds
    installed distributions."""
    return _library_dirs(tuple(sys.path), _torch_dir())


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if torch is not None and getattr(torch, "__file__", None) else ""


@functools.lru_cache(maxsize=8)
def _library_dirs(path: tuple[str, ...], torch_dir: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages())
    dirs.update((site.getusersitepackages(), torch_dir))
    dirs.update(entry for entry in path if _holds_distributions(entry))
    return tuple(sorted({os.path.join(os.path.realpath(d), "") for d in dirs if d}))


def _holds_distributions(entry: str) -> bool:
    """Whether a ``sys.path`` folder is an install target (``pip install --target``): it holds ``*.dist-info``."""
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(entry or "."))
    except OSError:
        return False


def is_user_module(name: str, module: types.ModuleType | None, libraries: tuple[str, ...] | None = None) -> bool:
    """Whether ``module`` is the user's own Python source, not a library's (``libraries``: :func:`library_dirs`)."""
    if module is None or name in _MAIN_MODULES or name == _PACKAGE or name.startswith(_PACKAGE + "."):
        return False
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isabs(path):
        return False  # a relative "file" is no file: torch.ops and torch.classes name theirs "_ops.py"
    return not _real(path).startswith(libraries if libraries is not None else library_dirs())


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    return os.path.realpath(path)


def user_modules() -> list[str]:
    """The names of the user modules this process holds, sorted."""
    libraries = library_dirs()
    return sorted(name for name, module in list(sys.modules.items()) if is_user_module(name, module, libraries))


def forget_user_modules() -> None:
    """Drop every user module from this process's ``sys.modules`` (in the forked server): a rank that needs one by
    name then imports it from its file as it is at the burst, never the copy taken at the fork, stale after an edit
    or half-executed when the fork happened inside its import."""
    for name in user_modules():
        sys.modules.pop(name, None)


def travelling_by_value() -> list[str]:
    """The user modules whose code can travel by value: all but packages with a native extension below them (a
    compiled class cannot be rebuilt from its code; a native module loaded into a process cannot be replaced
    there, in the caller either)."""
    libraries = library_dirs()
    native_parents = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (isinstance(path, str) and os.path.isabs(path) and not path.endswith(".py")
                and not _real(path).startswith(libraries)):
            parts = name.split(".")
            native_parents.update(".".join(parts[:end]) for end in range(1, len(parts)))
    return [name for name in user_modules() if name not in native_parents]
