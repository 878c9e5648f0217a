"""An item's layout: its structure (tuples, lists, str-keyed dicts) and its fields (shape and dtype), shared by
every item of a dataset a cache stores.

The caches (:mod:`.cache`) and the shards (:mod:`.shards`) store items field by field and rebuild them from the
layout without the dataset. Fields come back as tensors with the dtype ``default_collate`` would give them, so
collated batches are identical to uncached ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_CONTAINERS: dict[type, str] = {tuple: "tuple", list: "list", dict: "dict"}


#: An item's structure with its leaves left out: ``None`` for a leaf, ``[kind, children]`` for a container
#: (dict children are ``[key, spec]`` pairs). Lists only, so it survives a JSON round trip unchanged.
Spec = Any


#: An item's leaves as ``(path, value)`` pairs, depth first.
Leaves = list[tuple[str, Any]]


class DataCacheError(ValueError):
    """The dataset cannot be cached as asked; the message says what to change (often: set data_cache='none')."""


@dataclass(frozen=True)
class Field:
    """One leaf position in an item: ``path`` names it in messages, e.g. ``[0]`` or ``[1]['input_ids']``."""

    path: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Layout:
    """The fixed structure every item shares; it rebuilds items from stored rows without the dataset."""

    spec: Spec
    fields: tuple[Field, ...]

    def pack(self, values: list[Any]) -> Any:
        """Reassemble one item from its field values, in field order."""
        return unflatten(self.spec, iter(values))

    def to_json(self) -> dict[str, Any]:
        """The layout as JSON data for ``meta.json``."""
        fields = [{"path": f.path, "shape": list(f.shape), "dtype": dtype_name(f.dtype)} for f in self.fields]
        return {"spec": self.spec, "fields": fields}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        """Parse ``to_json`` output; raises ValueError/KeyError/TypeError on anything malformed."""
        fields = tuple(Field(f["path"], tuple(int(s) for s in f["shape"]), dtype_from_name(f["dtype"]))
                       for f in data["fields"])
        layout = cls(data["spec"], fields)
        try:
            rebuilt = layout.pack(list(range(len(fields))))
        except StopIteration as exc:
            raise ValueError("meta.json spec has more leaves than fields") from exc
        if flatten(rebuilt)[1] != [(f.path, k) for k, f in enumerate(fields)]:
            raise ValueError("meta.json spec does not match its fields")
        return layout


def flatten(obj: Any, path: str = "", leaves: Leaves | None = None) -> tuple[Spec, Leaves]:
    """Split an item into its structure and its ``(path, leaf)`` pairs, depth first."""
    leaves = [] if leaves is None else leaves
    kind = _CONTAINERS.get(type(obj))
    if kind == "dict":
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"dict field {shown(path)} has non-str keys {list(obj)!r}; data_cache needs str keys")
        return ["dict", [[k, flatten(v, f"{path}[{k!r}]", leaves)[0]] for k, v in obj.items()]], leaves
    if kind is not None:
        return [kind, [flatten(v, f"{path}[{i}]", leaves)[0] for i, v in enumerate(obj)]], leaves
    leaves.append((path, obj))
    return None, leaves


def unflatten(spec: Spec, leaves: Iterator[Any]) -> Any:
    """Inverse of ``flatten``: consume leaves in order and rebuild the containers."""
    if spec is None:
        return next(leaves)
    kind, children = spec
    if kind == "dict":
        return {key: unflatten(child, leaves) for key, child in children}
    if kind not in ("tuple", "list"):
        raise ValueError(f"unknown container kind {kind!r}")
    values = [unflatten(child, leaves) for child in children]
    return tuple(values) if kind == "tuple" else values


def _leaf_tensor(value: Any, index: int, path: str) -> torch.Tensor:
    """One field as a CPU-storable tensor, with the dtype ``default_collate`` would give it."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    if isinstance(value, (np.ndarray, np.generic)):
        with contextlib.suppress(TypeError):  # str/object arrays fall through to the error below
            return torch.from_numpy(np.asarray(value, order="C"))
    kind = f"numpy {value.dtype}" if isinstance(value, (np.ndarray, np.generic)) else type(value).__name__
    raise DataCacheError(
        f"data_cache cannot store item {index} field {shown(path)}: {kind}; it stores tensors, numeric numpy "
        "arrays and python int/float/bool. Set data_cache='none' for this dataset."
    )


def read_item(dataset: Any, index: int) -> tuple[Spec, list[tuple[str, torch.Tensor]]]:
    """Compute item ``index`` and split it into structure and tensor fields."""
    item = dataset[index]
    try:
        spec, leaves = flatten(item)
    except TypeError as exc:
        raise DataCacheError(f"item {index}: {exc}") from exc
    return spec, [(path, _leaf_tensor(value, index, path)) for path, value in leaves]


def layout_of(spec: Spec, fields: list[tuple[str, torch.Tensor]]) -> Layout:
    """The layout item 0 sets for all the others."""
    if not fields:
        raise DataCacheError("data_cache found no values in item 0: nothing to cache")
    return Layout(spec, tuple(Field(path, tuple(t.shape), t.dtype) for path, t in fields))


def check_matches(layout: Layout, index: int, spec: Spec, fields: list[tuple[str, torch.Tensor]]) -> None:
    """Raise DataCacheError naming the first field of item ``index`` that differs from item 0."""
    if spec != layout.spec:
        raise DataCacheError(
            f"data_cache needs fixed-shape items: item {index} has a different structure from item 0 "
            f"({len(fields)} fields vs {len(layout.fields)}). Set data_cache='none' for this dataset."
        )
    for field, (path, tensor) in zip(layout.fields, fields, strict=True):
        if (tuple(tensor.shape), tensor.dtype) != (field.shape, field.dtype):
            raise DataCacheError(
                f"data_cache needs fixed-shape items: item {index} field {shown(path)} is "
                f"{tuple(tensor.shape)} {tensor.dtype}, item 0's is {field.shape} {field.dtype}. "
                "Set data_cache='none' for datasets with variable-size items."
            )


def shown(path: str) -> str:
    """A field path for messages; the empty path is an item that is a single value."""
    return path or "(the whole item)"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, the spelling stored in meta.json."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of ``dtype_name``; TypeError for anything that is not a torch dtype."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown torch dtype {name!r}")
    return dtype


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a field is written as: numpy has no bfloat16/float8, so those go as same-width integers.

    The bits are kept exactly and viewed back as ``dtype`` on read.
    """
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:
        return _INT_OF_WIDTH[dtype.itemsize]
    return dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of the file storing a field of torch ``dtype``."""
    return torch.empty(0, dtype=storage_dtype(dtype)).numpy().dtype
