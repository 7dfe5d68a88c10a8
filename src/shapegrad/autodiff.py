"""Reverse-mode autodiff shared by both interpreters.

The eager tape and the graph IR both answer ``producer(t)`` (which primitive
made ``t`` and from what); ``backward`` walks that DAG in reverse
topological order applying the single VJP rule set of ``ops/vjp.py``. In
eager mode the walk executes NumPy at once; in graph mode it *builds* the
backward graph. The sort is iterative, so 100k-op chains are fine.

A ``sg.custom_vjp`` output is marked by a STOP_GRADIENT carrying a
:class:`CustomVjpCall` (``attrs["custom_vjp"]``): the walk sees the function's
arguments as that node's inputs and applies the user's backward instead of a rule.
Every interpreter and backend already runs STOP_GRADIENT as the identity (the graph
passes drop it once autodiff has run), so the marker needs nothing from them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad.ops import prims
from shapegrad.ops.eager import EAGER, STATE, quiet, tensor
from shapegrad.ops.protocol import Prim
from shapegrad.ops.vjp import vjp_rule
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

Producer = Callable[[Tensor], "tuple[Prim, Sequence[Tensor], Any] | None"]
CustomRule = Callable[[Tensor, Sequence[bool]], Sequence["Tensor | None"]]
_serials = itertools.count()


@dataclass(frozen=True)
class CustomVjpCall:
    """One call of a ``sg.custom_vjp`` function: ``attrs["custom_vjp"]`` of its marker.

    ``inputs`` are the call's tensor arguments (the marker's inputs for autodiff) and
    ``rule(cotangent, needs)`` returns one cotangent (or None) per input. Equality is the
    serial number, so two calls never hash-cons to one graph node; no field enters a
    graph key (``metadata["key"]``): the user's backward is traced into the graph itself.
    """

    serial: int = field(default_factory=lambda: next(_serials), metadata={"key": False})
    inputs: tuple[Tensor, ...] = field(
        default=(), compare=False, repr=False, metadata={"key": False}
    )
    rule: CustomRule | None = field(
        default=None, compare=False, repr=False, metadata={"key": False}
    )
    name: str = field(default="function", compare=False, metadata={"key": False})


def _custom_call(made_by: tuple[Prim, Sequence[Tensor], Any] | None) -> CustomVjpCall | None:
    if made_by is None or made_by[0] is not Prim.STOP_GRADIENT:
        return None
    call: CustomVjpCall | None = made_by[2].get("custom_vjp")
    return call


def _with_custom(producer: Producer) -> Producer:
    """``producer`` that answers a custom_vjp marker with the call's arguments as inputs."""

    def resolved(t: Tensor) -> tuple[Prim, Sequence[Tensor], Any] | None:
        made_by = producer(t)
        call = _custom_call(made_by)
        if call is None or made_by is None:
            return made_by
        if t.is_traced and any(x.is_traced and x._ops is not t._ops for x in call.inputs):
            # A replayed body rebuilds its calls (``_custom_vjp.replay_marker``); one that
            # was never staged still holds the first trace's arguments.
            raise NotImplementedError(
                f"custom_vjp {call.name}: this call was recorded in another trace and replayed "
                "here without its staged backward, so it cannot be differentiated here"
            )
        return made_by[0], call.inputs, made_by[2]

    return resolved


def _eager_producer(t: Tensor) -> tuple[Prim, Sequence[Tensor], Any] | None:
    """``EAGER.producer`` without the method dispatch (the tape node's fields; a custom_vjp
    marker's tape node already lists the call's arguments as its inputs)."""
    node = t._tape
    return None if node is None else (node.prim, node.inputs, node.attrs)


def _topological_order(outputs: Sequence[Tensor], leaf_keys: set[Any]) -> list[Tensor]:
    """Tensors reachable from ``outputs``, inputs before their users."""
    ops = outputs[0]._ops
    if ops is EAGER:
        return [t for t, _, _ in _walk_order(outputs, leaf_keys, id, _eager_producer)]
    ident, producer = ops.identity, _with_custom(ops.producer)  # type: ignore[attr-defined]
    return [t for t, _, _ in _walk_order(outputs, leaf_keys, ident, producer)]


def _walk_order(
    outputs: Sequence[Tensor],
    leaf_keys: set[Any],
    ident: Callable[[Tensor], Any],
    producer: Producer,
) -> list[tuple[Tensor, Any, tuple[Prim, Sequence[Tensor], Any] | None]]:
    """``(tensor, key, producer)`` of every tensor reachable from ``outputs``, inputs
    before their users (iterative DFS; leaves and stop_gradient cut the walk)."""
    order: list[tuple[Tensor, Any, tuple[Prim, Sequence[Tensor], Any] | None]] = []
    visited: set[Any] = set()
    for root in outputs:
        stack: list[tuple[Tensor, Any, bool]] = [(root, ident(root), False)]
        while stack:
            t, key, expanded = stack.pop()
            if expanded:
                made_by = None if key in leaf_keys else producer(t)
                order.append((t, key, made_by))
                continue
            if key in visited:
                continue
            visited.add(key)
            stack.append((t, key, True))
            if key in leaf_keys:
                continue
            made_by = producer(t)
            if made_by is not None and (
                made_by[0] is not Prim.STOP_GRADIENT or "custom_vjp" in made_by[2]
            ):
                for parent in made_by[1]:
                    pkey = ident(parent)
                    if pkey not in visited:
                        stack.append((parent, pkey, False))
    return order


def backward(
    outputs: Sequence[Tensor],
    cotangents: Sequence[Tensor],
    leaves: Sequence[Tensor],
    release: bool = True,
) -> list[Tensor]:
    """Cotangents of ``leaves`` given cotangents of ``outputs`` (zeros where unconnected).

    ``release``: free the eager tape afterwards (outermost level only); False keeps it for
    another walk (a ``vjp`` pullback may be called once per row of a Jacobian).
    """
    if not outputs:
        return [prims.zeros_like(leaf) for leaf in leaves]
    ops = outputs[0]._ops
    if ops is EAGER:
        # The walk runs VJP rules (and custom_vjp backwards): one errstate for all of its
        # ops (inf/NaN are values here, as in the forward).
        with quiet():
            return _backward(outputs, cotangents, leaves, id, _eager_producer, release)
    ident = ops.identity  # type: ignore[attr-defined]
    return _backward(outputs, cotangents, leaves, ident, _with_custom(ops.producer), False)  # type: ignore[attr-defined]


def _backward(
    outputs: Sequence[Tensor],
    cotangents: Sequence[Tensor],
    leaves: Sequence[Tensor],
    ident: Callable[[Tensor], Any],
    producer: Producer,
    release: bool,
) -> list[Tensor]:
    leaf_keys = {ident(leaf) for leaf in leaves}
    order = _walk_order(outputs, leaf_keys, ident, producer)

    # Which tensors depend on a leaf: only those need cotangents.
    relevant: set[Any] = set()
    for _, key, made_by in order:
        if key in leaf_keys:
            relevant.add(key)
        elif made_by is not None and (
            made_by[0] is not Prim.STOP_GRADIENT or "custom_vjp" in made_by[2]
        ):
            for parent in made_by[1]:
                if ident(parent) in relevant:
                    relevant.add(key)
                    break

    grads: dict[Any, Tensor] = {}
    for out, ct in zip(outputs, cotangents, strict=True):
        key = ident(out)
        if key in relevant:
            grads[key] = grads[key] + ct if key in grads else ct

    for t, key, made_by in reversed(order):
        if made_by is None or key not in grads:
            continue
        prim, inputs, attrs = made_by
        needs = [ident(p) in relevant and p.aval.dtype.is_float for p in inputs]
        if True not in needs:
            continue
        ct = grads.pop(key)
        call = attrs.get("custom_vjp") if prim is Prim.STOP_GRADIENT else None
        if call is not None and call.rule is not None:
            input_cts = call.rule(ct, needs)
        else:
            input_cts = vjp_rule(prim)(inputs, t, ct, attrs, needs)
        for parent, need, g in zip(inputs, needs, input_cts, strict=True):
            if not need or g is None:
                continue
            pkey = ident(parent)
            grads[pkey] = grads[pkey] + g if pkey in grads else g

    if release:
        EAGER.release([t for t, _, _ in order])
    result = []
    for leaf in leaves:
        g = grads.get(ident(leaf))
        result.append(g if g is not None else prims.zeros_like(leaf))
    return result


# ---------------------------------------------------------------------------
# User-facing transformations
# ---------------------------------------------------------------------------


def _as_tensor_leaf(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else tensor(np.asarray(x))


def _prepare_args(
    args: tuple[Any, ...], argnums: tuple[int, ...]
) -> tuple[list[Any], list[Tensor], list[tree.TreeDef]]:
    """Replace the differentiated arguments by leaves the autodiff can find."""
    new_args = list(args)
    all_leaves: list[Tensor] = []
    treedefs: list[tree.TreeDef] = []
    for i in argnums:
        if i >= len(args):
            raise TypeError(
                f"grad: argnums={i} but the function was called with {len(args)} arguments"
            )
        leaves, td = tree.flatten(args[i])
        tensors = [_as_tensor_leaf(leaf) for leaf in leaves]
        for t in tensors:
            if not t.dtype.is_float:
                raise TypeError(
                    f"grad: cannot differentiate with respect to a {t.dtype} input (argument {i})"
                )
        tensors = [EAGER.make_leaf(t) if not t.is_traced else t for t in tensors]
        new_args[i] = tree.unflatten(td, tensors)
        all_leaves.extend(tensors)
        treedefs.append(td)
    return new_args, all_leaves, treedefs


def _check_scalar(value: Any, fname: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{fname}: the function must return a scalar Tensor, got {type(value).__name__}"
        )
    if value.size != 1:
        raise ShapeError(
            fname,
            f"the function must return a scalar, got shape {fmt(value.shape)}; "
            "reduce it (e.g. .sum() or .mean()) or use sg.vjp with a cotangent",
        )
    if not value.dtype.is_float:
        raise TypeError(f"{fname}: the output must be floating point, got {value.dtype}")
    return value


def value_and_grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., tuple[Any, Any]]:
    """Transform ``fn`` into ``(value, gradients)``; gradients have the structure of the arguments.

    Args:
        fn: function returning a scalar Tensor (or ``(scalar, aux)`` with ``has_aux``).
        argnums: which positional argument(s) to differentiate.
        has_aux: ``fn`` returns ``(loss, aux)``; the value returned is then ``(loss, aux)``.
    Example:
        >>> loss, g = sg.value_and_grad(lambda w: (w * w).sum())(sg.tensor([1.0, 2.0]))
        >>> g.numpy()
        array([2., 4.], dtype=float32)
    """
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        STATE.grad_depth += 1
        try:
            new_args, leaves, treedefs = _prepare_args(args, nums)
            result = fn(*new_args, **kwargs)
            value, aux = result if has_aux else (result, None)
            value = _check_scalar(value, "grad")
            one = prims.full(value.shape, 1, value.dtype, like=value)
            previous = STATE.grad_enabled
            STATE.grad_enabled = STATE.grad_depth > 1  # record only when an outer grad needs it
            try:
                grads = backward([value], [one], leaves)
            finally:
                STATE.grad_enabled = previous
        finally:
            STATE.grad_depth -= 1
        structured = []
        offset = 0
        for td in treedefs:
            structured.append(tree.unflatten(td, grads[offset : offset + td.num_leaves]))
            offset += td.num_leaves
        out_grads = structured[0] if isinstance(argnums, int) else tuple(structured)
        if not value.is_traced and STATE.grad_depth == 0:
            value = prims.stop_gradient(value)
        return ((value, aux) if has_aux else value), out_grads

    return wrapped


def grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """Transform ``fn`` into a function returning the gradient of its scalar output.

    Example:
        >>> sg.grad(lambda x: (x ** 2).sum())(sg.tensor([3.0])).item()
        6.0
    """
    vg = value_and_grad(fn, argnums, has_aux)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


def vjp(fn: Callable[..., Any], *args: Any) -> tuple[Any, Callable[[Any], tuple[Any, ...]]]:
    """``(fn(*args), pullback)``; ``pullback(cotangent)`` returns one gradient per argument.

    The pullback may be called any number of times (once per row of a Jacobian); it keeps
    the eager tape of ``fn`` alive until it is dropped. Called inside another transform,
    its backward is recorded, so it can be differentiated again.
    """
    STATE.grad_depth += 1
    try:
        new_args, leaves, treedefs = _prepare_args(args, tuple(range(len(args))))
        out = fn(*new_args)
    finally:
        STATE.grad_depth -= 1
    out_leaves, out_td = tree.flatten(out)

    def pullback(cotangent: Any) -> tuple[Any, ...]:
        ct_leaves, ct_td = tree.flatten(cotangent)
        if ct_td.signature() != out_td.signature():
            raise TypeError("vjp: the cotangent must have the structure of the output")
        cts = []
        for o, c in zip(out_leaves, ct_leaves, strict=True):
            c = prims.coerce(c, o) if not isinstance(c, Tensor) else c
            if c.shape != o.shape:
                raise ShapeError(
                    "vjp",
                    f"cotangent shape {fmt(c.shape)} differs from output shape {fmt(o.shape)}",
                )
            cts.append(c)
        previous = STATE.grad_enabled
        STATE.grad_enabled = STATE.grad_depth > 0
        try:
            grads = backward(out_leaves, cts, leaves, release=False)
        finally:
            STATE.grad_enabled = previous
        result = []
        offset = 0
        for td in treedefs:
            result.append(tree.unflatten(td, grads[offset : offset + td.num_leaves]))
            offset += td.num_leaves
        return tuple(result)

    if STATE.grad_depth == 0:  # the caller's own ops on the value need no tape
        out = tree.unflatten(out_td, [detached(leaf) for leaf in out_leaves])
    return out, pullback


def detached(leaf: Any) -> Any:
    """An eager tensor's value without its tape (anything else unchanged)."""
    if isinstance(leaf, Tensor) and not leaf.is_traced:
        return prims.stop_gradient(leaf)
    return leaf
