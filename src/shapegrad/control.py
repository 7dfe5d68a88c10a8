"""Structured control flow: the layer loop ``sg.scan`` and rematerialization ``sg.checkpoint``.

Both are one primitive, ``SCAN``, whose body is a sub-graph traced **once**
(:class:`Body`, an attribute of the node):

* inputs: initial carry leaves, per-layer inputs ``xs`` (leading dim = the loop
  length), then loop-invariant inputs (explicit ones, then tensors the body
  captured from its closure: closure conversion makes them inputs);
* output: ONE flat buffer of the carry/output dtype, laid out as
  ``[final carry (C) | carry into each layer (L*C, only with save) | ys (L*Y)]``;
  the user's pytrees are slices + reshapes of it (index maps, never copies, in
  compiled code). One output per primitive keeps the IR, autodiff and memory
  planner unchanged.

The VJP of ``SCAN`` is another ``SCAN`` running the other way, whose body is the
forward body *replayed* and differentiated (traced once per body): each layer's
forward is recomputed from its stored carry input, as ANEForge's CheckpointedStack
does (``policy="recompute"``), or the forward loop also stores the body's residuals
(values the backward reads) per layer and the backward body reads them
(``policy="residuals"``). The reverse loop's body lives in its own sub-graph, so
common-subexpression elimination can never merge the recomputation back into the
forward pass: that is what makes ``sg.checkpoint`` = a one-iteration scan work in
compiled graphs. Eagerly the same primitive runs its body with NumPy in a Python
loop (``ops/reference.py`` calls :meth:`Body.run`), and the same VJP rule applies.

Randomness inside a body (dropout) is part of the traced body, so a recomputation
replays the same mask; every layer of a loop sees the same seed (pass per-layer
noise through ``xs`` for different masks).

Where the pieces live, bottom to top: SCAN's IR data (``Body``, ``Layout``, the shape
rule, the NumPy semantics) in ``ops/scan.py``, read by the compiler
(``compiler/layerloop.py``); tracing a body and the recompute VJP in ``_scan.py``; the
residuals policy in ``_remat.py``; this module: the user API and the VJP rule that
picks a policy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad._remat import residual_forward, residual_vjp
from shapegrad._scan import _scan_vjp, bind_scan, trace_body, unpack
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.ops.scan import Body, Policy
from shapegrad.ops.vjp import rule
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["Body", "checkpoint", "scan"]

_POLICIES = ("recompute", "residuals")


@rule(Prim.SCAN)
def _scan_rule(
    inputs: Sequence[Tensor], out: Tensor, ct: Tensor, attrs: Any, needs: Sequence[bool]
) -> list[Tensor | None]:
    """SCAN's VJP: a reverse loop recomputing each layer, or reading stored residuals."""
    if attrs["policy"] == "residuals":
        return residual_vjp(attrs["body"], inputs, out, ct, attrs, tuple(bool(n) for n in needs))
    return _scan_vjp(inputs, out, ct, attrs, needs)


# --- the user API -----------------------------------------------------------------------


def _as_tensor(x: Any, like: Tensor | None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    from shapegrad.ops.eager import tensor

    return tensor(np.asarray(x))


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    policy: Policy = "recompute",
) -> tuple[Any, Any]:
    """A loop over the leading axis of ``xs`` whose body is traced and compiled once
    (``jax.lax.scan``'s contract).

    ``f(carry, x) -> (carry, y)``: ``carry`` keeps its structure, shapes and dtypes;
    ``x`` is one layer's slice of ``xs`` (e.g. one block's parameters from a
    stacked ParamList whose annotations have a leading ``layers`` dim); the ``y`` of
    every layer are stacked along a new leading axis. Tensors the body uses from its
    closure are loop invariants (their gradients are accumulated across layers).

    Args:
        f: the layer body, a pure function of tensors (no Python control flow on values).
        init: the initial carry (a pytree of tensors).
        xs: per-layer inputs (a pytree of tensors with one leading length), or None.
        length: the number of layers when ``xs`` is None (else it must agree).
        reverse: run from the last layer to the first (outputs stay in layer order).
        policy: gradients recompute each layer's forward from its stored carry input
            (``"recompute"``: memory of one carry per layer) or read residuals the
            forward loop stored (``"residuals"``: no recomputation, more memory).
    Returns:
        ``(final carry, stacked ys)`` with the structures ``f`` returned.
    Example:
        >>> def layer(h, wb):
        ...     w, b = wb
        ...     return sg.relu(h @ w.T + b), None
        >>> h, _ = sg.scan(layer, x, (ws, bs))     # ws: [layers, d, d], bs: [layers, d]
    """
    if policy not in _POLICIES:
        raise ValueError(f"scan: policy must be one of {_POLICIES}, got {policy!r}")
    carry_leaves, carry_td = tree.flatten(init)
    x_leaves, x_td = tree.flatten(xs)
    carry_leaves = [_as_tensor(c, None) for c in carry_leaves]
    x_leaves = [_as_tensor(x, None) for x in x_leaves]
    lengths = {x.shape[0] if x.ndim else -1 for x in x_leaves}
    if length is not None:
        lengths.add(length)
    if len(lengths) != 1 or -1 in lengths:
        shown = ", ".join(fmt(x.shape) for x in x_leaves)
        raise ShapeError(
            "scan",
            f"every xs leaf needs the same leading (layers) length"
            f"{'' if length is None else f' = {length}'}: got {shown or 'no xs and no length'}",
        )
    (n_layers,) = lengths
    if n_layers < 1:
        raise ShapeError("scan", "the loop needs at least one layer")
    in_avals = [c.aval for c in carry_leaves] + [AVal(x.shape[1:], x.dtype) for x in x_leaves]
    nc, nx = len(carry_leaves), len(x_leaves)
    y_td_box: list[tree.TreeDef] = []

    def fn(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        carry = tree.unflatten(carry_td, inputs[:nc])
        x = tree.unflatten(x_td, inputs[nc : nc + nx])
        result = f(carry, x)
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError("scan: the body must return a pair (new_carry, y)")
        new_carry, y = result
        new_leaves, new_td = tree.flatten(new_carry)
        if new_td.signature() != carry_td.signature() or len(new_leaves) != nc:
            raise TypeError("scan: the body must return a carry with the structure of init")
        for old, new in zip(inputs[:nc], new_leaves, strict=True):
            if not isinstance(new, Tensor) or new.aval != old.aval:
                got = new.aval if isinstance(new, Tensor) else type(new).__name__
                raise ShapeError(
                    "scan", f"the body changes a carry from {old.aval} to {got}; it must keep it"
                )
        y_leaves, y_td = tree.flatten(y)
        y_td_box.append(y_td)
        return list(new_leaves), [_as_tensor(t, None) for t in y_leaves]

    name = getattr(f, "__name__", "body")
    body, captured = trace_body(fn, in_avals, nc, nx, name)
    n_ys = len(body.y_avals)
    if policy == "residuals":
        body = residual_forward(body)
    flat = bind_scan(body, [*carry_leaves, *x_leaves, *captured], n_layers, reverse, True, policy)
    carry, ys = unpack(flat, body, n_layers, True, reverse)
    return tree.unflatten(carry_td, carry), tree.unflatten(y_td_box[0], ys[:n_ys])


def checkpoint(fn: Callable[..., Any], policy: Policy = "recompute") -> Callable[..., Any]:
    """``fn`` whose intermediate values are not kept for the backward pass but recomputed
    (``jax.checkpoint`` / ``torch.utils.checkpoint``); works eagerly and compiled.

    Tensor arguments (and tensors ``fn`` captures) are the region's inputs; its outputs
    (a pytree) must share one floating-point dtype. Non-tensor arguments are static.
    Example:
        >>> block = sg.checkpoint(lambda h, w: sg.gelu(h @ w))
        >>> loss = block(x, w).sum()      # backward recomputes gelu(h @ w)'s internals
    """
    if policy not in _POLICIES:  # checked here, not at the first call deep in a trace
        raise ValueError(f"sg.checkpoint: policy must be one of {_POLICIES}, got {policy!r}")
    if not callable(fn):
        raise TypeError(f"sg.checkpoint: expected a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        leaves, td = tree.flatten(args)
        tensors = [_as_tensor(t, None) for t in leaves]
        out_td_box: list[tree.TreeDef] = []

        def region(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
            result = fn(*tree.unflatten(td, inputs))
            out_leaves, out_td = tree.flatten(result)
            out_td_box.append(out_td)
            return [], [_as_tensor(t, None) for t in out_leaves]

        name = getattr(fn, "__name__", "region")
        body, captured = trace_body(region, [t.aval for t in tensors], 0, 0, f"checkpoint_{name}")
        n_ys = len(body.y_avals)
        if policy == "residuals":
                body = residual_forward(body)
        flat = bind_scan(body, [*tensors, *captured], 1, False, True, policy)
        _, ys = unpack(flat, body, 1, True, False)
        ys = ys[:n_ys]
        return tree.unflatten(out_td_box[0], [p.reshape(y, y.shape[1:]) for y in ys])

    return wrapped
