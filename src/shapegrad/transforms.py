"""Forward mode and Jacobians, derived exactly from the one VJP rule set.

No primitive has a JVP rule of its own. For ``out, pullback = vjp(f, x)`` the map
``g(u) = pullback(u)`` is linear in the output cotangent ``u`` (every VJP rule is), so
its own VJP at any point is its transpose, the Jacobian-vector product:
``jvp_f(x)(t) = vjp_g(u0)(t)``. ``linearize`` builds ``g`` once (recorded on the tape, or
traced into the graph) and transposes it with the same rules; every primitive with a VJP
rule, and every rule whose own primitives have VJP rules, gets forward mode for free,
in eager and compiled modes alike. ``jacrev`` pulls back a basis of the output,
``jacfwd`` pushes forward a basis of the input, ``hessian`` is ``jacfwd(jacrev(f))``.

A ``sg.custom_vjp`` function is linearized through its backward, which must then be
linear in its cotangent (a clipped backward is not: its tangent is that of the clip at 0).
A ``sg.custom_jvp`` function is a ``custom_vjp`` whose backward transposes the user's JVP
rule (``_custom_jvp.py``), so this transposition gives back the rule.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shapegrad import autodiff, tree
from shapegrad.ops import prims
from shapegrad.ops.eager import STATE
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

_serials = itertools.count()


@dataclass(frozen=True)
class LinearPoint:
    """``attrs["linear_point"]`` of the STOP_GRADIENT that makes ``linearize``'s point ``u0``
    a node of its own: a plain constant node hash-conses with any equal constant of the
    forward (ReLU's ``max(x, 0)``), which the transposition would then count as ``u``.
    Never part of a graph key (the node is dead once the tangent graph is built)."""

    serial: int = field(default_factory=lambda: next(_serials), metadata={"key": False})


def _out_leaves(out: Any, fname: str) -> tuple[list[Tensor], tree.TreeDef]:
    leaves, td = tree.flatten(out)
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise TypeError(
                f"{fname}: the function must return Tensors (or a pytree of them), "
                f"got a {type(leaf).__name__} leaf"
            )
    return leaves, td


def _point(like: Tensor) -> Tensor:
    """The point ``u0`` at which the cotangent map is transposed: ones shaped like ``like``,
    its own graph node (see LinearPoint). Any value gives the same (linear) transpose, but
    not zeros: a zero cotangent is one that SCAN's VJP may skip by value
    (``_scan._zero_range``), which would cut ``u`` out of the map."""
    ones = prims.ones_like(like)
    return prims.bind(Prim.STOP_GRADIENT, [ones], linear_point=LinearPoint())


def _shape(value: Any) -> tuple[int, ...]:
    return value.shape if isinstance(value, Tensor) else tuple(np.shape(value))


def _check_tangents(primals: Sequence[Any], tangents: Sequence[Any], fname: str) -> None:
    if len(tangents) != len(primals):
        raise TypeError(
            f"{fname}: got {len(primals)} primals but {len(tangents)} tangents (one per primal)"
        )
    for i, (p, t) in enumerate(zip(primals, tangents, strict=True)):
        p_leaves, p_td = tree.flatten(p)
        t_leaves, t_td = tree.flatten(t)
        if p_td.signature() != t_td.signature():
            raise TypeError(
                f"{fname}: tangent {i} must have the structure of primal {i} "
                f"({p_td.num_leaves} leaves), got {t_td.num_leaves} leaves"
            )
        for pl, tl in zip(p_leaves, t_leaves, strict=True):
            ps, ts = _shape(pl), _shape(tl)
            if ps != ts:
                raise ShapeError(
                    fname,
                    f"tangent {i} has shape {fmt(ts)} but its primal has shape "
                    f"{fmt(ps)}; a tangent is shaped like its primal",
                )
            if isinstance(pl, Tensor) and isinstance(tl, Tensor) and pl.dtype != tl.dtype:
                raise TypeError(
                    f"{fname}: tangent {i} is {tl.dtype} but its primal is {pl.dtype}; "
                    "a tangent has its primal's dtype"
                )


def linearize(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """``(fn(*primals), f_jvp)``: ``f_jvp(*tangents)`` is the Jacobian of ``fn`` at
    ``primals`` applied to ``tangents`` (one per primal, shaped like it). ``fn`` runs once;
    each ``f_jvp`` call runs only the tangent computation.

    Example:
        >>> y, f_jvp = sg.linearize(sg.sin, sg.tensor([0.0, 1.0]))
        >>> f_jvp(sg.tensor([1.0, 1.0])).numpy()   # cos(x) * t
        array([1.       , 0.5403023], dtype=float32)
    """
    _float_leaves(list(primals), "jvp")
    outer = STATE.grad_depth
    STATE.grad_depth += 1  # everything below is recorded: it is differentiated once more
    try:
        out, pullback = autodiff.vjp(fn, *primals)
        out_leaves, out_td = _out_leaves(out, "jvp")
        floats = [k for k, o in enumerate(out_leaves) if o.dtype.is_float]

        def cotangent_map(*us: Tensor) -> tuple[Any, ...]:
            full = [prims.zeros_like(o) for o in out_leaves]
            for k, u in zip(floats, us, strict=True):
                full[k] = u
            return pullback(tree.unflatten(out_td, full))

        _, transpose = autodiff.vjp(cotangent_map, *(_point(out_leaves[k]) for k in floats))
    finally:
        STATE.grad_depth -= 1

    def f_jvp(*tangents: Any) -> Any:
        _check_tangents(primals, tangents, "jvp")
        tangents = tuple(
            tree.tree_map(lambda t, p: prims.coerce(t, p) if isinstance(p, Tensor) else t, t, p)
            for t, p in zip(tangents, primals, strict=True)
        )
        moved = transpose(tangents) if floats else ()
        result: list[Tensor] = [prims.zeros_like(o) for o in out_leaves]  # non-float: zero
        for k, t in zip(floats, moved, strict=True):
            result[k] = t
        return tree.unflatten(out_td, result)

    if outer == 0:  # the caller's own ops on the value need no tape
        out = tree.unflatten(out_td, [autodiff.detached(o) for o in out_leaves])
    return out, f_jvp


def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """Forward mode: ``(fn(*primals), J(primals) @ tangents)``.

    Args:
        fn: a function of tensors (pytrees allowed) returning tensors.
        primals: the point, one entry per positional argument of ``fn``.
        tangents: one per primal, with its structure, shapes and dtypes.
    Example:
        >>> y, t = sg.jvp(lambda x: x * x, (sg.tensor([3.0]),), (sg.tensor([1.0]),))
        >>> t.item()
        6.0
    """
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TypeError(
            "jvp: primals and tangents must be tuples (one entry per argument of fn), "
            f"got {type(primals).__name__} and {type(tangents).__name__}"
        )
    _check_tangents(primals, tangents, "jvp")
    out, f_jvp = linearize(fn, *primals)
    return out, f_jvp(*tangents)


# ---------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------


def _argnums(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _split(
    fn: Callable[..., Any], args: tuple[Any, ...], nums: tuple[int, ...], fname: str
) -> tuple[Callable[..., Any], list[Any]]:
    """``fn`` as a function of the arguments in ``nums`` only, and their values."""
    for i in nums:
        if not -len(args) <= i < len(args):
            raise TypeError(
                f"{fname}: argnums={i} but the function was called with {len(args)} arguments"
            )
    positions = [i % len(args) for i in nums]

    def partial(*chosen: Any) -> Any:
        full = list(args)
        for i, value in zip(positions, chosen, strict=True):
            full[i] = value
        return fn(*full)

    return partial, [args[i] for i in positions]


def _basis(like: Tensor, index: int) -> Tensor:
    """The ``index``-th one-hot tensor shaped like ``like`` (a constant of its trace)."""
    one_hot = np.zeros(like.size, dtype=like.dtype.numpy)
    one_hot[index] = 1
    return prims.constant(one_hot.reshape(like.shape), like.dtype, like=like)


def _stack(parts: list[Tensor], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """``parts`` stacked on a new leading axis, reshaped to ``shape`` (zeros when empty)."""
    if not parts:
        return prims.full(shape, 0, like.dtype, like=like)
    rows = [prims.reshape(p, (1, *p.shape)) for p in parts]
    return prims.reshape(prims.concat(rows, 0), shape)


def _float_leaves(values: list[Any], fname: str) -> list[list[Tensor]]:
    per_arg = []
    for k, value in enumerate(values):
        leaves, _ = tree.flatten(value)
        tensors = [
            leaf if isinstance(leaf, Tensor) else prims.as_tensor(leaf, fname) for leaf in leaves
        ]
        for t in tensors:
            if not t.dtype.is_float:
                raise TypeError(
                    f"{fname}: cannot differentiate with respect to a {t.dtype} input "
                    f"(argument {k}); close over it instead of passing it"
                )
        per_arg.append(tensors)
    return per_arg


def _assemble(
    out_leaves: list[Tensor],
    out_td: tree.TreeDef,
    values: list[Any],
    blocks: dict[tuple[int, int, int], Tensor],
    single: bool,
) -> Any:
    """Jacobian blocks (out leaf, argument, argument leaf) in the structure JAX uses: the
    output's tree of (one argument's tree, or a tuple over ``argnums``)."""
    per_out = []
    for o in range(len(out_leaves)):
        per_arg = []
        for a, value in enumerate(values):
            leaves, td = tree.flatten(value)
            per_arg.append(tree.unflatten(td, [blocks[o, a, j] for j in range(len(leaves))]))
        per_out.append(per_arg[0] if single else tuple(per_arg))
    return tree.unflatten(out_td, per_out)


def jacrev(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Jacobian of ``fn`` by reverse mode (one pullback per output element).

    Each block has shape ``out.shape + in.shape``; pytrees give the output's structure of
    the arguments' structures (a tuple over ``argnums`` when it is a sequence).

    Example:
        >>> sg.jacrev(lambda x: x * x)(sg.tensor([1.0, 2.0])).numpy()
        array([[2., 0.],
               [0., 4.]], dtype=float32)
    """
    nums = _argnums(argnums)

    @functools.wraps(fn)
    def jacobian(*args: Any) -> Any:
        partial, values = _split(fn, args, nums, "jacrev")
        per_arg = _float_leaves(values, "jacrev")
        out, pullback = autodiff.vjp(partial, *values)
        out_leaves, out_td = _out_leaves(out, "jacrev")
        blocks: dict[tuple[int, int, int], Tensor] = {}
        for o, y in enumerate(out_leaves):
            if not y.dtype.is_float:
                raise TypeError(
                    f"jacrev: output {o} is {y.dtype}; only float outputs have a Jacobian"
                )
            rows: list[tuple[Any, ...]] = []
            for i in range(y.size):
                cts = [
                    _basis(y, i) if k == o else prims.zeros_like(z)
                    for k, z in enumerate(out_leaves)
                ]
                rows.append(pullback(tree.unflatten(out_td, cts)))
            for a, leaves in enumerate(per_arg):
                row_leaves = [tree.flatten(r[a])[0] for r in rows]
                for j, x in enumerate(leaves):
                    blocks[o, a, j] = _stack([r[j] for r in row_leaves], y.shape + x.shape, x)
        return _assemble(out_leaves, out_td, values, blocks, isinstance(argnums, int))

    return jacobian


def jacfwd(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Jacobian of ``fn`` by forward mode (one tangent per input element); the same
    shapes and structure as :func:`jacrev`, cheaper when inputs are fewer than outputs.

    Example:
        >>> sg.jacfwd(lambda x: x.sum() * x)(sg.tensor([1.0, 2.0])).numpy()
        array([[4., 1.],
               [2., 5.]], dtype=float32)
    """
    nums = _argnums(argnums)

    @functools.wraps(fn)
    def jacobian(*args: Any) -> Any:
        partial, values = _split(fn, args, nums, "jacfwd")
        per_arg = _float_leaves(values, "jacfwd")
        out, f_jvp = linearize(partial, *values)
        out_leaves, out_td = _out_leaves(out, "jacfwd")
        structures = [tree.flatten(v)[1] for v in values]
        blocks: dict[tuple[int, int, int], Tensor] = {}
        for a, leaves in enumerate(per_arg):
            for j, x in enumerate(leaves):
                columns: list[list[Tensor]] = []
                for i in range(x.size):
                    tangents = [
                        tree.unflatten(
                            td,
                            [
                                _basis(z, i) if (b, m) == (a, j) else prims.zeros_like(z)
                                for m, z in enumerate(zs)
                            ],
                        )
                        for b, (td, zs) in enumerate(zip(structures, per_arg, strict=True))
                    ]
                    columns.append(tree.flatten(f_jvp(*tangents))[0])
                for o, y in enumerate(out_leaves):
                    stacked = _stack([c[o] for c in columns], (x.size, *y.shape), y)
                    moved = prims.permute(stacked, [*range(1, y.ndim + 1), 0])
                    blocks[o, a, j] = prims.reshape(moved, y.shape + x.shape)
        return _assemble(out_leaves, out_td, values, blocks, isinstance(argnums, int))

    return jacobian


def hessian(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Hessian of a scalar ``fn``: ``jacfwd(jacrev(fn))``, shape ``in.shape * 2``.

    Example:
        >>> sg.hessian(lambda x: (x ** 3).sum())(sg.tensor([1.0, 2.0])).numpy()
        array([[ 6.,  0.],
               [ 0., 12.]], dtype=float32)
    """
    return jacfwd(jacrev(fn, argnums), argnums)
