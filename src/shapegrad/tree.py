"""Pytrees: flatten nested containers of tensors into leaves and rebuild them.

Containers understood out of the box: tuples, lists, dicts, namedtuples,
ParamList/TList, ``@dataclass`` instances (every field is a child), and
:class:`shapegrad.nn.Module`. Other container types are registered once:

    >>> sg.tree.register(MyPair, lambda p: ((p.a, p.b), ("a", "b"), None),
    ...                  lambda aux, children: MyPair(*children))

A *list* made only of Python/NumPy numbers (``[[1.0, 2.0]]``) is data, not a
container: it becomes one array leaf, as ``sg.tensor`` would make it.
Tuples of numbers stay containers of scalars (JAX's convention), so
``(lr, momentum)`` hyper-parameters keep working.

Any other object is a static (opaque) leaf - unless it holds tensors or
arrays, in which case flattening raises a TypeError naming its path
(``args[0].model``): silently treating parameters as constants gave wrong
gradients. A type with a class attribute ``__sg_static__ = True`` is always
static.

A sequence type may define ``_sg_rebuild(self, children)`` to control how it
is rebuilt (ParamList uses it to keep its requires_grad flags and names).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.tensor import Tensor

__all__ = [
    "TreeDef",
    "align",
    "flatten",
    "is_leaf",
    "leaf_flags",
    "leaf_paths",
    "register",
    "tensor_inside",
    "tree_map",
    "unflatten",
    "unflattener",
]

# flatten(obj) -> (children, keys, aux); unflatten(aux, children) -> obj
FlattenFn = Callable[[Any], tuple[Iterable[Any], Iterable[str], Any]]
UnflattenFn = Callable[[Any, list[Any]], Any]


@dataclass(frozen=True)
class _Node:
    flatten: FlattenFn
    unflatten: UnflattenFn


_REGISTRY: dict[type, _Node] = {}


def register(node_type: type, flatten: FlattenFn, unflatten: UnflattenFn) -> None:
    """Make ``node_type`` a pytree node.

    Args:
        node_type: the container class (exact type; subclasses register separately
            unless they inherit a ``__sg_tree__`` protocol, see :class:`shapegrad.nn.Module`).
        flatten: ``obj -> (children, keys, aux)``: the child values, one name per
            child (used in checkpoint keys and error paths) and hashable static data.
        unflatten: ``(aux, children) -> obj``.
    Example:
        >>> sg.tree.register(Pair, lambda p: ((p.a, p.b), ("a", "b"), None),
        ...                  lambda aux, kids: Pair(*kids))
    """
    if not isinstance(node_type, type):
        raise TypeError(f"tree.register: expected a class, got {node_type!r}")
    _REGISTRY[node_type] = _Node(flatten, unflatten)


def _dataclass_node(cls: type) -> _Node:
    names = tuple(f.name for f in dataclasses.fields(cls))

    def flatten(obj: Any) -> tuple[Iterable[Any], Iterable[str], Any]:
        return [getattr(obj, n) for n in names], names, None

    def unflatten(aux: Any, children: list[Any]) -> Any:
        # Bypass __init__/__post_init__: the leaves may be gradients or traced values
        # that a constructor's validation was never meant to see (Equinox does the same).
        obj: Any = object.__new__(cls)
        for n, child in zip(names, children, strict=True):
            object.__setattr__(obj, n, child)
        return obj

    return _Node(flatten, unflatten)


def node_for(kind: type) -> _Node | None:
    """The registered (or automatic: dataclass, ``sg.nn.Module``) container node of
    ``kind``, or None when ``kind`` is not a pytree container."""
    return _node_for(kind)


def _node_for(kind: type) -> _Node | None:
    node = _REGISTRY.get(kind)
    if node is not None:
        return node
    protocol = getattr(kind, "__sg_tree__", None)  # sg.nn.Module and its subclasses
    if protocol is not None:
        node = _Node(protocol[0], protocol[1])
    elif dataclasses.is_dataclass(kind) and not getattr(kind, "__sg_static__", False):
        node = _dataclass_node(kind)
    else:
        return None
    _REGISTRY[kind] = node
    return node


@dataclass(frozen=True)
class TreeDef:
    """The static structure of a nested value; leaves are tensors or NumPy arrays.

    ``kind`` is "leaf", "static" (an opaque value kept as is), "seq" (tuple/list/
    ParamList), "dict" or "node" (a registered type: ``keys`` name the children,
    ``static`` holds its aux data).
    """

    kind: str
    node_type: Any = None
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()
    static: Any = None
    template: Any = None  # the original sequence, for _sg_rebuild

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def signature(self) -> Any:
        """A hashable description (types, keys and static values) for caching."""
        if self.kind == "static" or self.kind == "node":
            static = self.static
            try:
                hash(static)
            except TypeError:
                static = ("id", id(static))
            if self.kind == "static":
                return ("static", static)
            return ("node", self.node_type, self.keys, static, tuple(c.signature() for c in self.children))
        return (self.kind, self.node_type, self.keys, tuple(c.signature() for c in self.children))


def is_leaf(x: Any) -> bool:
    return isinstance(x, Tensor | np.ndarray)


_LEAF = TreeDef("leaf")


class _HoldsTensors(TypeError):
    """Raised while flattening; the path is completed as the recursion unwinds."""

    def __init__(self, obj: Any, inner: str) -> None:
        super().__init__()
        self.obj = obj
        self.inner = inner
        self.path: list[str] = []

    def message(self, root: str) -> str:
        path = root + "".join(reversed(self.path))
        name = type(self.obj).__name__
        return (
            f"{path} is a {name} object holding tensors (at {path}{self.inner}) that shapegrad "
            f"cannot see inside, so they would be treated as constants. Make {name} a "
            "@dataclass, subclass sg.nn.Module, or register it with sg.tree.register("
            f"{name}, flatten, unflatten)"
        )


def flatten(obj: Any, root: str = "value") -> tuple[list[Any], TreeDef]:
    """``(leaves, treedef)``; ``root`` names ``obj`` in error messages.

    Raises:
        TypeError: an unregistered object somewhere in ``obj`` holds tensors or arrays.
    """
    leaves: list[Any] = []
    try:
        return leaves, _flatten(obj, leaves)
    except _HoldsTensors as error:
        raise TypeError(error.message(root)) from None


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, Tensor)


def is_data_list(obj: Any) -> bool:
    """A non-empty ``list`` (possibly nested) whose elements are all numbers: array data."""
    if type(obj) is not list or not obj:
        return False
    return all(_is_number(x) or is_data_list(x) for x in obj)


def _as_data(obj: list[Any]) -> Any:
    from shapegrad.ops.eager import tensor

    return tensor(obj)


def _flatten(obj: Any, leaves: list[Any]) -> TreeDef:
    if is_leaf(obj):
        leaves.append(obj)
        return _LEAF
    if isinstance(obj, tuple | list):
        if type(obj) is list and is_data_list(obj):
            leaves.append(_as_data(obj))
            return _LEAF
        children = []
        for i, c in enumerate(obj):
            try:
                children.append(_flatten(c, leaves))
            except _HoldsTensors as error:
                error.path.append(f"[{i}]")
                raise
        return TreeDef("seq", type(obj), tuple(children), template=obj)
    if isinstance(obj, dict):
        keys = tuple(obj.keys())
        children = []
        for k in keys:
            try:
                children.append(_flatten(obj[k], leaves))
            except _HoldsTensors as error:
                error.path.append(f"[{k!r}]")
                raise
        return TreeDef("dict", type(obj), tuple(children), keys)
    node = _node_for(type(obj))
    if node is not None:
        values, names, aux = node.flatten(obj)
        keys = tuple(names)
        children = []
        for name, c in zip(keys, values, strict=True):
            try:
                children.append(_flatten(c, leaves))
            except _HoldsTensors as error:
                error.path.append(f".{name}")
                raise
        return TreeDef("node", type(obj), tuple(children), keys, static=aux)
    inner = _find_tensor(obj)
    if inner is not None:
        raise _HoldsTensors(obj, inner)
    return TreeDef("static", static=obj)


def tensor_inside(obj: Any) -> str | None:
    """A path (``[0]``, ``.w``) to a tensor or array inside ``obj`` (``""`` for ``obj``
    itself), or None: how a static value is told apart from one that hides parameters."""
    return _find_tensor(obj)


def _find_tensor(obj: Any, depth: int = 0) -> str | None:
    """A path (``.w``, ``.layers[0]``) to a tensor/array inside an opaque object, or None."""
    if depth > 4 or isinstance(obj, type) or getattr(type(obj), "__sg_static__", False):
        return None
    if is_leaf(obj):
        return ""
    items: Iterable[tuple[str, Any]]
    if isinstance(obj, dict):
        items = ((f"[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        items = ((f"[{i}]", v) for i, v in enumerate(obj))
    else:
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            slots = [s for c in type(obj).__mro__ for s in getattr(c, "__slots__", ())]
            attrs = {s: getattr(obj, s) for s in slots if s != "__weakref__" and hasattr(obj, s)}
        if callable(obj) and not attrs:
            return None
        items = ((f".{k}", v) for k, v in attrs.items())
    for label, value in items:
        found = _find_tensor(value, depth + 1)
        if found is not None:
            return label + found
    return None


def unflatten(treedef: TreeDef, leaves: list[Any], typed: bool = True) -> Any:
    """The value of structure ``treedef`` with ``leaves``. With ``typed=False`` a typed
    sequence (ParamList, TList) comes back as a plain tuple, unchecked: for leaves its
    annotations do not describe (``sg.vmap``'s per-example results carry a batch dim)."""
    return _unflatten(treedef, iter(leaves), typed)


def _unflatten(td: TreeDef, leaves: Any, typed: bool = True) -> Any:
    if td.kind == "leaf":
        return next(leaves)
    if td.kind == "static":
        return td.static
    children = [_unflatten(c, leaves, typed) for c in td.children]
    if td.kind == "dict":
        return td.node_type(zip(td.keys, children, strict=True))
    if td.kind == "node":
        return _REGISTRY[td.node_type].unflatten(td.static, children)
    rebuild: Callable[[list[Any]], Any] | None = getattr(td.template, "_sg_rebuild", None)
    if rebuild is not None:
        return rebuild(children) if typed else tuple(children)
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
    if td.kind == "node":
        make = _REGISTRY[node_type].unflatten
        aux = td.static
        return lambda it: make(aux, [k(it) for k in kids])
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


# --- names and flags per leaf ----------------------------------------------------------------


def leaf_paths(obj: Any, sep: str = ".") -> list[str]:
    """One readable name per leaf of ``obj``: ``blocks.0.attn.w_qkv``, ``w1``, ``0.1``.

    ParamList elements use their names, dict entries their keys, registered nodes
    (modules, dataclasses) their field names, sequences their positions.
    """
    out: list[str] = []
    _leaf_paths(obj, "", sep, out)
    return out


def _leaf_paths(obj: Any, prefix: str, sep: str, out: list[str]) -> None:
    def join(label: Any) -> str:
        return f"{prefix}{sep}{label}" if prefix else str(label)

    if is_leaf(obj) or is_data_list(obj):
        out.append(prefix or "value")
    elif isinstance(obj, tuple | list):
        names = getattr(obj, "_sg_names", None)
        for i, child in enumerate(obj):
            label = names[i] if names is not None and i < len(names) else i
            _leaf_paths(child, join(label), sep, out)
    elif isinstance(obj, dict):
        for key, child in obj.items():
            _leaf_paths(child, join(key), sep, out)
    else:
        node = _node_for(type(obj))
        if node is None:
            return
        values, names, _ = node.flatten(obj)
        for name, child in zip(tuple(names), values, strict=True):
            _leaf_paths(child, join(name), sep, out)


def leaf_flags(obj: Any) -> tuple[bool, ...]:
    """One ``requires_grad`` flag per leaf: the flags of every ParamList/Module inside, else True."""
    out: list[bool] = []
    _leaf_flags(obj, out)
    return tuple(out)


def _leaf_flags(obj: Any, out: list[bool]) -> None:
    flags = getattr(obj, "requires_grad", None)
    if isinstance(flags, tuple) and not isinstance(obj, Tensor):
        out.extend(bool(f) for f in flags)
        return
    if is_leaf(obj) or is_data_list(obj):
        out.append(True)
    elif isinstance(obj, tuple | list):
        for child in obj:
            _leaf_flags(child, out)
    elif isinstance(obj, dict):
        for child in obj.values():
            _leaf_flags(child, out)
    else:
        node = _node_for(type(obj))
        if node is not None:
            for child in node.flatten(obj)[0]:
                _leaf_flags(child, out)


# --- matching a value against a known structure -----------------------------------------------


def align(value: Any, like: Any, root: str = "value") -> list[Any]:
    """The leaves of ``value`` in the flatten order of ``like``, matched by structure.

    Dict entries match by key (whatever their order), registered nodes (modules,
    dataclasses) by type and field names, sequences by position (a ParamList's names,
    when both sides have them, must agree). Used where a user hands back a structure
    the library already holds (``trainer.set_params``): matching leaves by position
    alone silently swapped ``{"w2": b, "w1": a}`` into a ``{"w1", "w2"}`` model.

    Raises:
        TypeError: a container of another kind than expected (a dict for a list...).
        ValueError: a different length, different keys or names; the message names the
            path (``value['w1']``, ``value.blocks[0]``) and what was expected.
    """
    _, treedef = flatten(like, root)
    out: list[Any] = []
    _align(value, treedef, like, root, out)
    return out


def _kind_name(x: Any) -> str:
    return type(x).__name__.split("[")[0]


def _align(value: Any, td: TreeDef, like: Any, path: str, out: list[Any]) -> None:
    if td.kind == "static":
        return
    if td.kind == "leaf":
        if isinstance(value, dict) or (
            isinstance(value, tuple | list) and not is_data_list(value)
        ) or (not is_leaf(value) and _node_for(type(value)) is not None):
            raise TypeError(f"{path}: expected a tensor, got a {_kind_name(value)}")
        out.append(value)
        return
    if td.kind == "dict":
        if not isinstance(value, dict):
            raise TypeError(
                f"{path}: expected a dict with keys {list(td.keys)}, got a {_kind_name(value)}"
            )
        missing = [k for k in td.keys if k not in value]
        unexpected = [k for k in value if k not in td.keys]
        if missing or unexpected:
            raise ValueError(
                f"{path}: keys {list(value)} do not match the expected {list(td.keys)} "
                f"(missing {missing}, unexpected {unexpected})"
            )
        for key, child in zip(td.keys, td.children, strict=True):
            _align(value[key], child, like[key], f"{path}[{key!r}]", out)
        return
    if td.kind == "seq":
        if not isinstance(value, tuple | list) or is_data_list(value):
            raise TypeError(
                f"{path}: expected a {_kind_name(like)} of {len(td.children)} entries, "
                f"got a {_kind_name(value)}"
            )
        if len(value) != len(td.children):
            raise ValueError(
                f"{path}: got {len(value)} entries, expected {len(td.children)} "
                f"(a {_kind_name(like)})"
            )
        mine, theirs = getattr(value, "_sg_names", None), getattr(like, "_sg_names", None)
        if mine is not None and theirs is not None and tuple(mine) != tuple(theirs):
            raise ValueError(f"{path}: parameter names {list(mine)}, expected {list(theirs)}")
        for i, (item, child) in enumerate(zip(value, td.children, strict=True)):
            _align(item, child, like[i], f"{path}[{i}]", out)
        return
    node = _node_for(type(value))
    if type(value) is not td.node_type or node is None:
        raise TypeError(
            f"{path}: expected a {getattr(td.node_type, '__name__', td.node_type)}, "
            f"got a {_kind_name(value)}"
        )
    values, names, _ = node.flatten(value)
    like_values, _, _ = _REGISTRY[td.node_type].flatten(like)
    if tuple(names) != td.keys:  # e.g. a list field of another length
        raise ValueError(f"{path}: fields {list(names)}, expected {list(td.keys)}")
    for name, item, child, template in zip(td.keys, values, td.children, like_values, strict=True):
        _align(item, child, template, f"{path}.{name}", out)
