"""Flatten nested containers of tensors (tuples, lists, dicts, ParamList/TList) and rebuild them.

A container type may define ``_sg_rebuild(self, children)`` to control how it
is rebuilt (ParamList uses it to keep its requires_grad flags).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.tensor import Tensor


@dataclass(frozen=True)
class TreeDef:
    """The static structure of a nested value; leaves are tensors or NumPy arrays."""

    kind: str  # "leaf" | "static" | "seq" | "dict"
    node_type: Any = None
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()
    static: Any = None
    template: Any = None  # the original container, for _sg_rebuild

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def signature(self) -> Any:
        """A hashable description (types, keys and static values) for caching."""
        if self.kind == "static":
            try:
                hash(self.static)
                return ("static", self.static)
            except TypeError:
                return ("static", id(self.static))
        return (self.kind, self.node_type, self.keys, tuple(c.signature() for c in self.children))


def is_leaf(x: Any) -> bool:
    return isinstance(x, Tensor | np.ndarray)


def flatten(obj: Any) -> tuple[list[Any], TreeDef]:
    leaves: list[Any] = []
    return leaves, _flatten(obj, leaves)


def _flatten(obj: Any, leaves: list[Any]) -> TreeDef:
    if is_leaf(obj):
        leaves.append(obj)
        return TreeDef("leaf")
    if isinstance(obj, tuple | list):
        children = tuple(_flatten(c, leaves) for c in obj)
        return TreeDef("seq", type(obj), children, template=obj)
    if isinstance(obj, dict):
        keys = tuple(obj.keys())
        children = tuple(_flatten(obj[k], leaves) for k in keys)
        return TreeDef("dict", type(obj), children, keys)
    return TreeDef("static", static=obj)


def unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    iterator = iter(leaves)
    result = _unflatten(treedef, iterator)
    return result


def _unflatten(td: TreeDef, leaves: Any) -> Any:
    if td.kind == "leaf":
        return next(leaves)
    if td.kind == "static":
        return td.static
    children = [_unflatten(c, leaves) for c in td.children]
    if td.kind == "dict":
        return td.node_type(zip(td.keys, children, strict=True))
    rebuild: Callable[[list[Any]], Any] | None = getattr(td.template, "_sg_rebuild", None)
    if rebuild is not None:
        return rebuild(children)
    if td.node_type in (tuple, list):
        return td.node_type(children)
    if hasattr(td.node_type, "_fields"):  # namedtuple
        return td.node_type(*children)
    return td.node_type(children)


def unflattener(treedef: TreeDef) -> Callable[[list[Any]], Any]:
    """``unflatten(treedef, ·)`` specialised once: a function of the leaves alone.

    The per-node decisions of :func:`_unflatten` are taken here, so calling the result
    (the compiled-call hot path) only builds containers.
    """
    build = _builder(treedef)
    return lambda leaves: build(iter(leaves))


def _builder(td: TreeDef) -> Callable[[Any], Any]:
    if td.kind == "leaf":
        return next
    if td.kind == "static":
        value = td.static
        return lambda it: value
    kids = [_builder(c) for c in td.children]
    node_type = td.node_type
    if td.kind == "dict":
        keys = td.keys
        return lambda it: node_type(zip(keys, [k(it) for k in kids], strict=True))
    rebuild: Callable[[list[Any]], Any] | None = getattr(td.template, "_sg_rebuild", None)
    if rebuild is not None:
        return lambda it: rebuild([k(it) for k in kids])
    if node_type is tuple:
        return lambda it: tuple([k(it) for k in kids])
    if hasattr(node_type, "_fields"):  # namedtuple
        return lambda it: node_type(*[k(it) for k in kids])
    return lambda it: node_type([k(it) for k in kids])


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Apply ``fn`` leaf-wise over ``tree`` (and trees of the same structure in ``rest``)."""
    leaves, td = flatten(tree)
    others = [flatten(r)[0] for r in rest]
    return unflatten(td, [fn(leaf, *(o[i] for o in others)) for i, leaf in enumerate(leaves)])
