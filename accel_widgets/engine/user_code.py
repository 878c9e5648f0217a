"""Which modules are the user's own code, as opposed to a library's: what travels to the ranks by value.

A user module is a Python source file outside the interpreter's standard library, every site-packages and any
folder holding installed distributions (``*.dist-info``: a ``pip install --target`` folder on ``PYTHONPATH``), and
outside this package: the user's ``models.py`` next to the notebook, a package on ``sys.path``, a package installed
in editable mode (its files stay in the source tree). Such a module may change while the kernel runs (an edit and
``importlib.reload``, ``%autoreload``), so its code travels to the ranks by value (:mod:`.payload` says why), and
the forked server keeps no copy of it. Libraries do not change under a running
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
from dataclasses import dataclass

_PACKAGE = __name__.split(".")[0]
_MAIN_MODULES = ("__main__", "__mp_main__")  # cloudpickle sends their contents by value already


@dataclass(frozen=True)
class Libraries:
    """Where installed code lives: the standard library, every site-packages, torch's own directory (a source build
    of torch may sit outside site-packages) and any ``sys.path`` folder holding installed distributions; each path
    ends in a separator. ``fixed``: the standard library's and torch's, whose files are never the user's and are
    told by their path as written (a process holds ~1,700 modules, most of them there; resolving every link of
    each path took ~60 ms of the first burst)."""

    fixed: tuple[str, ...]
    resolved: tuple[str, ...]

    def hold(self, path: str) -> bool:
        """Whether the file ``path`` is installed code (a link is followed: an install may link the user's folder)."""
        return path.startswith(self.fixed) or _real(path).startswith(self.resolved)


def libraries() -> Libraries:
    """This process's :class:`Libraries` (``sys.path`` read now)."""
    return _libraries(tuple(sys.path), _torch_dir())


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if torch is not None and getattr(torch, "__file__", None) else ""


@functools.lru_cache(maxsize=8)
def _libraries(path: tuple[str, ...], torch_dir: str) -> Libraries:
    paths = sysconfig.get_paths()
    fixed = {paths["stdlib"], torch_dir}  # not platstdlib: in a virtual environment it holds site-packages
    dirs = {*fixed, paths["purelib"], paths["platlib"], *site.getsitepackages(), site.getusersitepackages()}
    dirs.update(entry for entry in path if _holds_distributions(entry))
    return Libraries(fixed=tuple(sorted({os.path.join(d, "") for d in fixed if d})),
                     resolved=tuple(sorted({os.path.join(os.path.realpath(d), "") for d in dirs if d})))


def _holds_distributions(entry: str) -> bool:
    """Whether a ``sys.path`` folder is an install target (``pip install --target``): it holds ``*.dist-info``."""
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(entry or "."))
    except OSError:
        return False


def is_user_module(name: str, module: types.ModuleType | None, installed: Libraries | None = None) -> bool:
    """Whether ``module`` is the user's own Python source, not a library's (``installed``: :func:`libraries`)."""
    path = _file_of(module)
    return isinstance(path, str) and path.endswith(".py") and _is_user_file(name, path, installed or libraries())


def _is_user_file(name: str, path: str, installed: Libraries) -> bool:
    if name in _MAIN_MODULES or name == _PACKAGE or name.startswith(_PACKAGE + "."):
        return False
    # A relative "file" is no file: torch.ops and torch.classes name theirs "_ops.py".
    return os.path.isabs(path) and not installed.hold(path)


def _file_of(module: object) -> object:
    """A module's ``__file__``, read from its namespace: a lazy module's ``__getattr__`` (transformers' submodules)
    would import or compute on every miss."""
    return vars(module).get("__file__") if isinstance(module, types.ModuleType) else None


@functools.lru_cache(maxsize=8192)
def _real(path: str) -> str:
    """``os.path.realpath``, each folder resolved once for all its files."""
    if os.path.islink(path):
        return os.path.realpath(path)
    return os.path.join(_real_folder(os.path.dirname(path)), os.path.basename(path))


@functools.lru_cache(maxsize=2048)
def _real_folder(path: str) -> str:
    return os.path.realpath(path)


def user_modules() -> list[str]:
    """The names of the user modules this process holds, sorted."""
    return _read_modules()[0]


def travelling_by_value() -> list[str]:
    """The user modules whose code can travel by value: all but packages with a native extension below them (a
    compiled class cannot be rebuilt from its code; a native module loaded into a process cannot be replaced
    there, in the caller either)."""
    users, native_parents = _read_modules()
    return [name for name in users if name not in native_parents]


def _read_modules() -> tuple[list[str], set[str]]:
    """One pass over ``sys.modules``: the user modules, sorted, and the packages above a native module outside the
    libraries."""
    installed = libraries()
    users, native_parents = [], set()
    for name, module in list(sys.modules.items()):
        path = _file_of(module)
        if not isinstance(path, str):
            continue
        if path.endswith(".py"):
            if _is_user_file(name, path, installed):
                users.append(name)
        elif os.path.isabs(path) and not installed.hold(path):
            parts = name.split(".")
            native_parents.update(".".join(parts[:end]) for end in range(1, len(parts)))
    return sorted(users), native_parents
