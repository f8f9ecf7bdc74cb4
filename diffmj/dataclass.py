"""Frozen dataclasses that are PyTorch pytrees: tensors are leaves, static fields context.

Static fields (sizes, tuples of ints, enums) describe structure: they are
compared by value, so two models built from the same XML have equal static
parts and ``torch.compile`` guards on them pass. Tensor fields are leaves that
``torch.func`` transforms and ``torch.utils._pytree.tree_map`` see.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree

T = TypeVar("T")


def static_field(**kwargs: Any) -> Any:
    """A dataclass field that is structure, not data (hashable, part of the pytree context)."""
    return dataclasses.field(metadata={"static": True}, **kwargs)


def pytree_dataclass(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen dataclass registered as a pytree node."""
    cls = dataclasses.dataclass(frozen=True, eq=False, kw_only=True)(cls)
    fields = dataclasses.fields(cls)
    data_names = tuple(f.name for f in fields if not f.metadata.get("static"))
    static_names = tuple(f.name for f in fields if f.metadata.get("static"))

    def flatten(obj):
        return [getattr(obj, n) for n in data_names], tuple(getattr(obj, n) for n in static_names)

    def flatten_with_keys(obj):
        children = [(pytree.GetAttrKey(n), getattr(obj, n)) for n in data_names]
        return children, tuple(getattr(obj, n) for n in static_names)

    def unflatten(children, context):
        return cls(**dict(zip(data_names, children)), **dict(zip(static_names, context)))

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )
    cls._data_names = data_names
    cls._static_names = static_names
    return cls


class PyTreeNode:
    """Methods shared by every pytree dataclass."""

    _data_names: tuple[str, ...]
    _static_names: tuple[str, ...]

    def replace(self: T, **changes: Any) -> T:
        """A copy with some fields replaced (the original is untouched)."""
        return dataclasses.replace(self, **changes)

    def static(self) -> tuple:
        """The hashable structure: every static field, recursively, as nested tuples."""
        parts = [(n, getattr(self, n)) for n in self._static_names]
        for n in self._data_names:
            value = getattr(self, n)
            if isinstance(value, PyTreeNode):
                parts.append((n, value.static()))
        return tuple(parts)

    def to(self: T, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> T:
        """Move every tensor to ``device``; cast floating-point tensors to ``dtype``."""

        def move(x):
            if not isinstance(x, torch.Tensor):
                return x
            if dtype is not None and x.is_floating_point():
                return x.to(device=device, dtype=dtype)
            return x.to(device=device)

        return pytree.tree_map(move, self)
