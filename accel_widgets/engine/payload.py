"""What a burst sends its ranks, pickled so that they run the code the caller holds at the moment of the burst.

The ranks are forked from a long-lived server (:mod:`.forkserver`), often itself a fork of the caller taken when
``accel_widgets`` was imported. cloudpickle sends a class or function of a notebook cell (``__main__``) by value,
but one of an importable module by reference: the rank would look its name up in its own copy of the module, the
server's, as old as the server. After an edit and ``importlib.reload`` or ``%autoreload`` a burst then trained the
old code, and a module that imports ``accel_widgets`` before defining its classes had been forked half-executed:
its classes could not be found at all.

The mechanism: **the user's modules travel by value, as notebook cells already do.** While the payload is
pickled, every user module (:mod:`.user_code`) is registered with ``cloudpickle.register_pickle_by_value``, so each
of their classes and functions the workload reaches (the model's class, the Dataset, the loss, a factory, what
their code calls) goes as the caller holds it now, ``%autoreload``'s in-place patches and a monkeypatch included.
A user module *object* the code names (``layers.Block`` after ``import layers``) goes by name, not as a copy of its
whole namespace (module-level data, handles): the rank imports it, and since the forked server forgot every user
module (:mod:`.forkserver`), from its file as it is at the burst, as with a spawned server.

Why not the alternatives. Refreshing the server when a module changed means forking the caller again, which is
unsafe once its OpenMP pool ran (any CPU forward pass in the notebook) or it loaded CUDA; the refreshed server
would then be spawned and import torch again, ~2.7 s on a 2-core machine before every burst after a reload, and
it would still run the file's copy, not the caller's. Forking at the first burst instead of at import has the same
limits and loses the early start the first burst's speed comes from. By value costs a few kB of code per class
and milliseconds of pickling (``benchmarks/first_burst_vs_peer.py`` measures the burst after a reload), whatever
the server is.

What cannot travel by value is said before the burst starts, naming the module (:class:`UserCodeWarning`, and the
result's warnings): a module whose reachable globals cannot be pickled (a lock, an open file) and a package with
a native extension below it travel by name, and the ranks run their files as they are now.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .user_code import is_user_module, libraries, travelling_by_value

#: cloudpickle's by-value registry is process-wide: one pickling at a time changes it (bursts run from threads).
_REGISTRY_LOCK = threading.Lock()


class UserCodeWarning(UserWarning):
    """A user module's code could not travel to the ranks as this process holds it: they import it by name."""


def pickle_for_ranks(obj: Any) -> tuple[bytes, list[str]]:
    """``obj`` cloudpickled with the user modules' code by value; returns the bytes and one note per user module
    whose code goes by name instead (each also warned, before any rank starts, as a :class:`UserCodeWarning`).

    A module whose code cannot be pickled is found by the attempt that fails (the module of the last object sent
    by value before the error) and sent by name; the rest still go by value. Raises the plain pickling error when
    ``obj`` cannot travel even with every module by name (something the workload itself holds).
    """
    by_value = travelling_by_value()
    refused: dict[str, str] = {}
    with _REGISTRY_LOCK:
        attempt = _Attempt.run(obj, by_value)
        if attempt.error is not None and by_value:
            plain = _Attempt.run(obj, [])
            if plain.error is not None:
                raise plain.error
            while attempt.error is not None:
                culprit = attempt.last_by_value or by_value[-1]
                refused[culprit] = f"{type(attempt.error).__name__}: {attempt.error}"
                # The culprit and the packages above it: any of them registered sends it by value still.
                by_value = [name for name in by_value if not _within(culprit, frozenset([name]))]
                attempt = _Attempt.run(obj, by_value)
        if attempt.error is not None:
            raise attempt.error
    notes = [_by_name_note(name, refused.get(name)) for name in sorted(attempt.by_name | set(refused))]
    for note in notes:
        warnings.warn(note, UserCodeWarning, stacklevel=3)
    return attempt.payload, notes


def _by_name_note(name: str, why: str | None) -> str:
    module = sys.modules.get(name)
    where = os.path.basename(getattr(module, "__file__", None) or name)
    reason = (f"its code cannot be pickled ({why.splitlines()[0][:160]})" if why is not None
              else "a native extension module lives below it")
    return (f"{name} ({where}) travels to the ranks by name, not as this process holds it: {reason}. They import "
            f"{where} as the file is now: an edit not reloaded here yet runs there already")


@dataclass
class _Attempt:
    """One pickling with ``by_value``'s modules registered: its bytes or its error, the last user module whose code
    went by value before it (the likely culprit of an error), and the user modules whose code went by name."""

    payload: bytes = b""
    error: Exception | None = None
    last_by_value: str | None = None
    by_name: set[str] = field(default_factory=set)

    @classmethod
    def run(cls, obj: Any, by_value: list[str]) -> _Attempt:
        attempt = cls()
        buffer = io.BytesIO()
        with _registered(by_value):
            try:
                _Pickler(buffer, attempt, frozenset(by_value)).dump(obj)
            except Exception as exc:  # every pickling error is this attempt's outcome, judged by pickle_for_ranks()
                attempt.error = exc
        if attempt.error is None:
            attempt.payload = buffer.getvalue()
        return attempt


@contextlib.contextmanager
def _registered(names: Iterable[str]) -> Iterator[None]:
    """``names`` in cloudpickle's by-value registry for the duration; modules the user registered stay registered."""
    already = cloudpickle.list_registry_pickle_by_value()
    added = [sys.modules[name] for name in names if name not in already and name in sys.modules]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)


_UNNAMED = "<dynamic-code>"  # what cloudpickle names the code it sends by value


def _named_code(code: types.CodeType, filename: str) -> types.CodeType:
    """In the rank: the code sent by value with its file name back."""
    return code.replace(co_filename=filename)


def _within(name: str, packages: frozenset[str]) -> bool:
    """Whether ``name`` or a package above it is one of ``packages`` (cloudpickle's registry covers submodules)."""
    parts = name.split(".")
    return any(".".join(parts[:end]) in packages for end in range(len(parts), 0, -1))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, noting which user code goes by value and which by name, sending a user module object
    by name rather than as cloudpickle's copy of its whole namespace, and keeping the file name of the code it
    sends by value (cloudpickle writes ``<dynamic-code>``): a rank's traceback, a graph break and a hang's stack
    then name ``models.py:12``, with its source line, as they do for code imported by name."""

    def __init__(self, file: io.BytesIO, attempt: _Attempt, by_value: frozenset[str]) -> None:
        super().__init__(file, protocol=cloudpickle.DEFAULT_PROTOCOL)
        self._attempt, self._by_value, self._installed = attempt, by_value, libraries()
        self._files = {getattr(sys.modules.get(name), "__file__", None) for name in by_value} - {None}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType) and _within(obj.__name__, self._by_value):
            return importlib.import_module, (obj.__name__,)
        if isinstance(obj, types.CodeType) and obj.co_filename in self._files:
            return _named_code, (obj.replace(co_filename=_UNNAMED), obj.co_filename)
        if isinstance(obj, (type, types.FunctionType)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and _within(module, self._by_value):
                self._attempt.last_by_value = module
            elif isinstance(module, str) and is_user_module(module, sys.modules.get(module), self._installed):
                self._attempt.by_name.add(module)
        return super().reducer_override(obj)
