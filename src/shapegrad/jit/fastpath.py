"""The per-call fast path of a compiled function (see ``Compiled.__call__``).

A call whose arguments have exactly the structure, leaf types, shapes, dtypes and
contiguity of an earlier call reuses that call's Lowered without re-flattening into
TreeDefs, re-deriving signatures or re-validating: the fast key below is built in one
cheap pass and *is* the validation (anything it does not describe exactly - static
values it cannot hash, subclasses, traced tensors - takes the full path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad.backends.base import Array
from shapegrad.dtypes import to_numpy
from shapegrad.jit.stages import Lowered
from shapegrad.ops.protocol import AVal
from shapegrad.tensor import Tensor

SCALARS = (float, int, bool)  # Python scalars: weakly typed arguments


def fast_key(obj: Any, leaves: list[Any], parts: list[Any]) -> bool:
    """Append ``obj``'s leaves (raw arrays / scalars) and key parts; False when not keyable."""
    kind = type(obj)
    if kind is np.ndarray:
        leaves.append(obj)
        parts.append((obj.shape, obj.dtype, obj.flags.c_contiguous))
        return True
    if kind is Tensor:
        payload = obj._payload
        if type(payload) is not np.ndarray:
            return False  # traced (inline it) or an unusual payload: the full path decides
        leaves.append(payload)
        # The aval's dtype name too: cheaper to hash than the AVal, and exact.
        parts.append((payload.shape, payload.dtype, payload.flags.c_contiguous, obj.dtype.name))
        return True
    if kind is list and tree.is_data_list(obj):
        return False  # a list of numbers is one array leaf (tree.flatten): the full path
    if kind is tuple or kind is list or isinstance(obj, tuple | list):  # ParamList too
        parts.append((kind, len(obj)))
        for child in obj:  # noqa: SIM110 - a loop, not all(genexpr): per-call hot path
            if not fast_key(child, leaves, parts):
                return False
        return True
    if isinstance(obj, dict):
        parts.append((kind, tuple(obj)))
        for k in obj:  # noqa: SIM110 - as above
            if not fast_key(obj[k], leaves, parts):
                return False
        return True
    if kind in SCALARS or isinstance(obj, np.generic):
        leaves.append(obj)
        parts.append(kind)  # the value is an input, its type fixes the dtype
        return True
    if obj is None or kind is str:
        parts.append((kind, obj))
        return True
    node = tree.node_for(kind)  # a registered container: sg.nn.Module, a dataclass, ...
    if node is None:
        return False
    children, keys, aux = node.flatten(obj)
    try:
        parts.append((kind, tuple(keys), aux, hash(aux)))
    except TypeError:
        return False  # unhashable static data: the full path compares it
    for child in children:  # noqa: SIM110 - as above
        if not fast_key(child, leaves, parts):
            return False
    return True


@dataclass
class FastEntry:
    """What a fast-key hit needs: the Lowered, leaf conversions and prebuilt output avals."""

    lowered: Lowered
    convert: list[tuple[int, np.dtype[Any]]]  # leaves that are not ready-to-use arrays
    out_avals: list[AVal]
    run: Callable[[Sequence[Array]], list[Array]]
    rebuild: Callable[[list[Any]], Any]  # tree.unflatten specialised to the output tree


def fast_entry(lowered: Lowered, leaves: list[Any]) -> FastEntry:
    inputs = lowered.executable.graph.inputs
    convert = []
    for k, (leaf, node) in enumerate(zip(leaves, inputs, strict=True)):
        want = node.aval.dtype.numpy
        ready = (
            type(leaf) is np.ndarray and leaf.dtype == want and leaf.flags.c_contiguous
        )  # fixed by the fast key: true for every later call with this key
        if not ready:
            convert.append((k, want))
    out_avals = [AVal(tuple(n.shape), n.aval.dtype) for n in lowered.executable.graph.outputs]
    run = lowered.executable.run_validated  # the key validated: skip the executable's check
    return FastEntry(lowered, convert, out_avals, run, tree.unflattener(lowered.out_treedef))


def ready_array(leaf: Any, dtype: np.dtype[Any]) -> Array:
    array = to_numpy(leaf, dtype, what="compiled call")
    # Not np.ascontiguousarray: it turns 0-d scalars into shape [1].
    return array if array.flags.c_contiguous else array.copy(order="C")
