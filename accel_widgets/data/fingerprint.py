"""Fingerprints of a dataset's definition, shared by the engine's data cache and the run history.

It lives apart from both because both need it and neither should import the other: the data cache
(``engine/datacache.py``) names its on-disk caches by it, and the history (``history.py``) groups runs
of the same workload by it. Hashing lives here once, so the two can never disagree about "the same data".
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import cloudpickle
import torch

_PICKLE_PROTOCOL = 5


class FingerprintError(ValueError):
    """The dataset cannot be fingerprinted (it does not pickle); the message says why."""


def dataset_fingerprint(dataset: Any) -> str:
    """Hex digest of the dataset's *definition*: sha256 over ``cloudpickle.dumps(dataset)`` and ``len(dataset)``.

    The same object, or two objects built from the same class and arguments, give the same digest; a
    different seed, size or any other attribute gives a different one. Limits, all by design of hashing the
    pickle rather than the items (which would mean computing them, the very cost a cache avoids):

    * a dataset reading files is fingerprinted by its paths, not the files' contents: edit the files and
      a stale cache is reused (pass ``fingerprint=`` to the cache or delete the cache directory);
    * a class importable from a module is pickled by reference, so editing its ``__getitem__`` does not
      change the digest (classes defined in a notebook or ``__main__`` are pickled by value and do);
    * mutable state (e.g. a call counter) is part of the definition, and objects whose pickle is not
      deterministic (sets of strings under hash randomisation) give a different digest per process.

    Raises :class:`FingerprintError` when the dataset does not pickle.
    """
    buffer = io.BytesIO()
    try:
        _ContentPickler(buffer, protocol=_PICKLE_PROTOCOL).dump(dataset)
    except Exception as exc:  # cloudpickle raises whatever the object's reducer raises
        raise FingerprintError(f"cannot fingerprint {type(dataset).__name__}: it does not pickle ({exc})") from exc
    digest = hashlib.sha256(buffer.getvalue())
    digest.update(f"len={length_of(dataset)}".encode())
    return digest.hexdigest()


def length_of(dataset: Any) -> int | None:
    """``len(dataset)``, or None for a stream (an IterableDataset without ``__len__``)."""
    try:
        return len(dataset)
    except TypeError:
        return None


class _ContentPickler(cloudpickle.Pickler):
    """Pickles tensors by content: torch's own pickle names each storage by its memory address, which would
    give equal datasets (or one dataset sent to a worker) a different fingerprint every time."""

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        tensor = obj.detach().cpu().contiguous()
        content = hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy()).hexdigest()
        return ("tensor", str(tensor.dtype), tuple(tensor.shape), content)
