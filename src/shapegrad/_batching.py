"""``sg.vmap``: a batching interpreter, one batching rule per primitive (as JAX does it).

Inside ``vmap(f)``, ``f`` sees tensors of a :class:`BatchOps` interpreter. Each carries its
per-example shape (``aval``) and, as payload, a :class:`_Slot`: the underlying value
with the batch axis moved to the front (or without one: an unbatched value, such as an
``in_axes=None`` argument or a constant), plus the op that made it. ``apply`` runs one
rule per primitive on the underlying values through ``prims.bind``, so the batched
function is built from ordinary primitives of the interpreter below: eager NumPy, a
``sg.compile`` trace (the batched function compiles to an ordinary graph) or an outer
``vmap`` (nesting). Recording each op's per-example form (``producer``/``identity``, the
hooks ``autodiff.backward`` walks, as for ``GraphOps``) lets ``sg.grad``/``sg.jvp`` run
*inside* ``vmap``: ``vmap(grad(loss), in_axes=(None, 0, 0))`` gives per-example gradients.
"""

from __future__ import annotations

import functools
import itertools
import string
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad._custom_vjp import bind_marker, replay_nodes
from shapegrad.autodiff import CustomVjpCall
from shapegrad.ir import Graph
from shapegrad.ops import prims
from shapegrad.ops.eager import STATE
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import (
    COLLECTIVES,
    ELEMENTWISE,
    REDUCTIONS,
    Attrs,
    AVal,
    Prim,
    infer_aval,
    parse_einsum_spec,
)
from shapegrad.ops.scan import Body
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

MadeBy = tuple[Prim, Sequence[Tensor], Attrs]


class _Depth(threading.local):
    def __init__(self) -> None:
        self.value = 0


_DEPTH = _Depth()
_serials = itertools.count()  # active vmaps: an inner vmap's interpreter outranks an outer one's


@dataclass(eq=False)
class _Slot:
    """A batched tensor's payload: ``value`` (batch axis first when ``batched``) and the
    op that made it (None for the arguments of the vmapped function)."""

    value: Tensor
    batched: bool
    made_by: MadeBy | None = None
    # A serial, as graph nodes have: how a scan body trace keys a captured tensor.
    id: int = field(default_factory=lambda: next(_serials))
    # Code that inspects a traced payload as a graph node (``_scan._zero_range``, which
    # skips cotangents it can prove zero) sees an opaque value: never provably zero.
    prim = Prim.INPUT


class BatchOps:
    """The batching interpreter of one ``vmap`` call (batch size ``size``)."""

    name = "vmap"

    def __init__(self, size: int, inner: Any, grad_depth: int) -> None:
        self.size = size
        self.inner = inner  # the interpreter of sources (constants, iota, random)
        # Above eager (0), graph (1), the interpreter below and any enclosing vmap.
        self.priority = max(2 + _DEPTH.value, getattr(inner, "priority", 0) + 1)
        self.grad_depth = grad_depth  # STATE.grad_depth when the vmap began

    # --- the Ops protocol ------------------------------------------------------------

    def apply(self, prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor:
        slots = [self.slot(t) for t in inputs]
        aval = infer_aval(prim, [t.aval for t in inputs], attrs)  # per-example checks
        if prim is Prim.STOP_GRADIENT and "custom_vjp" in attrs:
            return self._custom_marker(slots[0], attrs["custom_vjp"], (prim, tuple(inputs), attrs))
        if not any(s.batched for s in slots):
            value = self._unbatched(prim, [s.value for s in slots], attrs)
            return self.wrap(_Slot(value, False, (prim, tuple(inputs), attrs)), aval)
        rule = _RULES.get(prim)
        if rule is None:
            raise _unsupported(prim)
        value = rule(self, slots, attrs, aval)
        return self.wrap(_Slot(value, True, (prim, tuple(inputs), attrs)), aval)

    def _custom_marker(self, packed: _Slot, call: CustomVjpCall, made_by: MadeBy) -> Tensor:
        """A custom_vjp marker. It stays at this level (an inner ``sg.grad`` applies the
        user's backward per example) and is rebuilt below on the underlying values with
        the backward batched (an outer ``sg.grad`` sees one call over the whole batch):
        the per-example rule runs on the batch of cotangents here, and an unbatched
        argument (shared by every example) gets the sum of the per-example cotangents.
        The output is batched even where no argument is: a backward that is not linear in
        the cotangent (clipping) then sees each example's, as a loop of ``grad`` would."""
        arg_slots = [self.slot(t) for t in call.inputs]
        aval = made_by[1][0].aval
        per_example = call.rule
        assert per_example is not None

        def rule(ct: Tensor, needs: Sequence[bool]) -> list[Tensor | None]:
            cts = per_example(self.wrap(_Slot(ct, True), aval), needs)
            result: list[Tensor | None] = []
            for arg, c in zip(arg_slots, cts, strict=True):
                if c is None:
                    result.append(None)
                    continue
                got = self.slot(c)
                if arg.batched:
                    result.append(self.batched(got))
                elif got.batched:
                    result.append(prims.reduce_sum(got.value, (0,)))
                else:  # the same cotangent for every example
                    result.append(prims.binary(Prim.MUL, got.value, self.size))
            return result

        below = CustomVjpCall(inputs=tuple(s.value for s in arg_slots), rule=rule, name=call.name)
        value = bind_marker(self.batched(packed), below)
        return self.wrap(_Slot(value, True, made_by), aval)

    def _unbatched(self, prim: Prim, values: list[Tensor], attrs: Attrs) -> Tensor:
        """An op on values without a batch axis runs once, as itself (a collective too)."""
        if prim is Prim.INPUT:
            raise _unsupported(prim)
        ops = None if values else self.inner
        return prims.bind(prim, values, ops=ops, **attrs)

    # --- tensors of this interpreter -----------------------------------------------------

    def wrap(self, slot: _Slot, aval: AVal) -> Tensor:
        return Tensor(self, slot, aval)

    def slot(self, t: Tensor) -> _Slot:
        """``t``'s slot; a tensor of another interpreter (captured) is an unbatched value."""
        if t._ops is self:
            payload: _Slot = t._payload
            return payload
        return _Slot(t, False)

    def batched(self, s: _Slot) -> Tensor:
        """``s``'s value with a batch axis (an unbatched value broadcast along it)."""
        if s.batched:
            return s.value
        v = s.value
        return prims.broadcast_in_dim(v, (self.size, *v.shape), tuple(range(1, v.ndim + 1)))

    # --- hooks used by the shared autodiff ---------------------------------------------

    def producer(self, t: Tensor) -> MadeBy | None:
        if t._ops is not self:
            return None
        made_by: MadeBy | None = t._payload.made_by
        return made_by

    def identity(self, t: Tensor) -> Any:
        return id(t._payload) if t._ops is self else ("outer", id(t))


def _unsupported(prim: Prim) -> Exception:
    if prim in COLLECTIVES:
        return NotImplementedError(
            f"vmap: the collective {prim.value} has no batching rule (a collective runs once "
            "per process, not per example); call it outside the vmapped function"
        )
    return NotImplementedError(f"vmap: no batching rule for the primitive {prim.value}")


# ---------------------------------------------------------------------------------------
# Batching rules: ``rule(ops, slots, attrs, aval)`` -> the underlying batched value (batch
# axis first). ``aval`` is the per-example result.
# ---------------------------------------------------------------------------------------

Rule = Callable[[BatchOps, list[_Slot], Attrs, AVal], Tensor]


def _same(prim: Prim) -> Rule:
    """Operands given the batch axis, attributes unchanged (elementwise, cast, where)."""

    def rule(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
        return prims.bind(prim, [ops.batched(s) for s in slots], **attrs)

    return rule


def _reduce(prim: Prim) -> Rule:
    def rule(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
        axes = tuple(a + 1 for a in attrs["axes"])
        return prims.bind(prim, [slots[0].value], **{**attrs, "axes": axes})

    return rule


def _einsum(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    spec: str = attrs["spec"]
    terms, out = parse_einsum_spec(spec, len(slots))
    letter = next(c for c in string.ascii_letters if c not in spec)
    new_terms = [letter + t if s.batched else t for t, s in zip(terms, slots, strict=True)]
    new_spec = ",".join(new_terms) + "->" + letter + out
    return prims.bind(Prim.EINSUM, [s.value for s in slots], **{**attrs, "spec": new_spec})


def _layout(prim: Prim) -> Rule:
    def rule(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
        x = slots[0].value
        b = ops.size
        if prim is Prim.RESHAPE:
            return prims.bind(prim, [x], **{**attrs, "shape": (b, *aval.shape)})
        if prim is Prim.PERMUTE:
            perm = (0, *(p + 1 for p in attrs["perm"]))
            return prims.bind(prim, [x], **{**attrs, "perm": perm})
        if prim is Prim.BROADCAST:
            dims = (0, *(d + 1 for d in attrs["dims"]))
            return prims.bind(prim, [x], **{**attrs, "shape": (b, *attrs["shape"]), "dims": dims})
        if prim is Prim.SLICE:
            new = {
                "starts": (0, *attrs["starts"]),
                "stops": (b, *attrs["stops"]),
                "steps": (1, *attrs["steps"]),
            }
            return prims.bind(prim, [x], **{**attrs, **new})
        # PAD
        return prims.bind(
            prim, [x], **{**attrs, "low": (0, *attrs["low"]), "high": (0, *attrs["high"])}
        )

    return rule


def _argsort(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    """Each example's rows are rows of the batched value: the sorted axis moves by one."""
    return prims.bind(Prim.ARGSORT, [slots[0].value], **{**attrs, "axis": attrs["axis"] + 1})


def _concat(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    parts = [ops.batched(s) for s in slots]
    return prims.bind(Prim.CONCAT, parts, **{**attrs, "axis": attrs["axis"] + 1})


def _offsets(ops: BatchOps, idx: Tensor, stride: int) -> Tensor:
    """``idx`` (batch axis first) plus ``b * stride`` in row ``b``: indices into the batch
    flattened into the indexed axis."""
    rows = prims.iota(idx.shape, 0, idx.dtype, like=idx)  # int32 or int64, as the indices
    return prims.binary(Prim.ADD, idx, prims.binary(Prim.MUL, rows, stride))


def _wrap_negative(idx: Tensor, size: int) -> Tensor:
    """Negative indices counted from the end (as one example's gather reads them), before
    offsets move them into another example's rows."""
    negative = prims.binary(Prim.LT, idx, 0)
    return prims.where(negative, prims.binary(Prim.ADD, idx, size), idx)


def _move(x: Tensor, source: int, dest: int) -> Tensor:
    order = [a for a in range(x.ndim) if a != source]
    order.insert(dest, source)
    return prims.permute(x, order)


def _gather(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    xs, idxs = slots
    axis: int = attrs["axis"]
    if not idxs.batched:  # the indices select along a shifted axis
        return prims.bind(Prim.GATHER, [xs.value, idxs.value], **{**attrs, "axis": axis + 1})
    idx = idxs.value
    n_idx = idx.ndim - 1
    if not xs.batched:  # one table, a batch of index sets: the batch axis lands at ``axis``
        out = prims.bind(Prim.GATHER, [xs.value, idx], **attrs)
        return _move(out, axis, 0)
    # Both batched: the batch folded into the indexed axis, each row's indices offset.
    x = _move(xs.value, axis + 1, 1)  # (B, A, rest...)
    size = x.shape[1]
    flat = prims.reshape(x, (ops.size * size, *x.shape[2:]))
    offset = _offsets(ops, _wrap_negative(idx, size), size)
    out = prims.bind(Prim.GATHER, [flat, offset], **{**attrs, "axis": 0})  # (B, I.., rest..)
    # rest is x[:axis] + x[axis+1:]: move the index axes to just after x[:axis]
    order = [*range(0, 1 + n_idx)]
    pre = list(range(1 + n_idx, 1 + n_idx + axis))
    post = list(range(1 + n_idx + axis, out.ndim))
    return prims.permute(out, [0, *pre, *order[1:], *post])


def _scatter_add(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    us, idxs = slots
    axis: int = attrs["axis"]
    size: int = attrs["size"]
    if not idxs.batched:
        return prims.bind(Prim.SCATTER_ADD, [us.value, idxs.value], **{**attrs, "axis": axis + 1})
    idx = idxs.value
    n_idx = idx.ndim - 1
    u = ops.batched(us)  # (B, pre, I.., post)
    # the index axes first after the batch: (B, I.., pre, post)
    order = [0, *range(1 + axis, 1 + axis + n_idx), *range(1, 1 + axis)]
    order += list(range(1 + axis + n_idx, u.ndim))
    u = prims.permute(u, order)
    offset = _offsets(ops, _wrap_negative(idx, size), size)
    out = prims.bind(
        Prim.SCATTER_ADD, [u, offset], **{**attrs, "axis": 0, "size": ops.size * size}
    )  # (B * size, pre, post)
    out = prims.reshape(out, (ops.size, size, *out.shape[1:]))
    return _move(out, 1, 1 + axis)


def _scan(ops: BatchOps, slots: list[_Slot], attrs: Attrs, aval: AVal) -> Tensor:
    """SCAN with a batched body: every carry and output leaf gets the batch axis in front,
    batched ``xs`` are passed as ``[L, B, ...]``, invariants keep their own form. The flat
    output is then regrouped example by example (``_regroup``)."""
    body: Body = attrs["body"]
    nc, nx = body.n_carry, body.n_xs
    b = ops.size
    operands: list[Tensor] = []
    in_batched: list[bool] = []
    for k, s in enumerate(slots):
        if k < nc:
            operands.append(ops.batched(s))
            in_batched.append(True)
        elif k < nc + nx and s.batched:
            operands.append(_move(s.value, 0, 1))
            in_batched.append(True)
        else:
            operands.append(s.value)
            in_batched.append(s.batched)
    new_body = _batched_body(body, in_batched, b)
    flat = prims.bind(Prim.SCAN, operands, **{**attrs, "body": new_body})
    return _regroup(flat, body, attrs, b)


def _batched_body(body: Body, in_batched: list[bool], size: int) -> Body:
    """``body`` traced once more through a batching interpreter: inputs flagged in
    ``in_batched`` carry a leading batch axis, and so do all of its outputs."""
    graph_ops = GraphOps()
    ops = BatchOps(size, graph_ops, 0)
    env: dict[int, Tensor] = {}
    for k, (node, batched) in enumerate(zip(body.graph.inputs, in_batched, strict=True)):
        shape = (size, *node.aval.shape) if batched else node.aval.shape
        value = graph_ops.add_input(f"in{k}", AVal(shape, node.aval.dtype))
        env[node.id] = ops.wrap(_Slot(value, batched), node.aval)
    _DEPTH.value += 1
    try:
        replay_nodes(body.graph.outputs, env, ops)
    finally:
        _DEPTH.value -= 1
    outputs = [ops.batched(ops.slot(env[o.id])) for o in body.graph.outputs]
    graph = Graph(list(graph_ops.inputs), [graph_ops.lift(t) for t in outputs], graph_ops.table)
    return Body(graph, body.n_carry, body.n_xs, f"{body.name}[vmap]")


def _regroup(flat: Tensor, body: Body, attrs: Attrs, b: int) -> Tensor:
    """The batched body's flat output (each leaf ``[B, ...]`` inside every slot) as
    ``[B, size]``: one per-example flat output per row."""
    length, save = attrs["length"], attrs["save"]
    slots = length + 1 if save else 1  # carry slots: history and final, or the final only
    sizes = [int(np.prod(a.shape)) for a in body.carry_avals]
    carry = sum(sizes)
    pieces: list[Tensor] = []
    if carry:
        region = prims.reshape(
            prims.slice_(flat, [0], [slots * carry * b], [1]), (slots, carry * b)
        )
        leaves, at = [], 0
        for n in sizes:
            cols = prims.slice_(region, [0, at * b], [slots, (at + n) * b], [1, 1])
            leaves.append(prims.reshape(cols, (slots, b, n)))
            at += n
        grouped = prims.permute(prims.concat(leaves, 2), (1, 0, 2))
        pieces.append(prims.reshape(grouped, (b, slots * carry)))
    at = slots * carry * b
    for a in body.y_avals:
        n = int(np.prod(a.shape))
        block = prims.slice_(flat, [at], [at + length * b * n], [1])
        rows = prims.permute(prims.reshape(block, (length, b, n)), (1, 0, 2))
        pieces.append(prims.reshape(rows, (b, length * n)))
        at += length * b * n
    return prims.concat(pieces, 1)


_RULES: dict[Prim, Rule] = {p: _same(p) for p in ELEMENTWISE}
_RULES.update({p: _reduce(p) for p in REDUCTIONS})
_RULES.update({p: _layout(p) for p in (Prim.RESHAPE, Prim.PERMUTE, Prim.BROADCAST)})
_RULES.update({p: _layout(p) for p in (Prim.SLICE, Prim.PAD)})
_RULES[Prim.CONCAT] = _concat
_RULES[Prim.EINSUM] = _einsum
_RULES[Prim.GATHER] = _gather
_RULES[Prim.SCATTER_ADD] = _scatter_add
_RULES[Prim.SCAN] = _scan
_RULES[Prim.ARGSORT] = _argsort
# Sources (CONSTANT, IOTA, RANDOM) have no operands: always unbatched (``_unbatched``).
# Collectives and INPUT have no rule: ``_unsupported``.


# ---------------------------------------------------------------------------------------
# The user API
# ---------------------------------------------------------------------------------------

AxisSpec = Any  # int | None | a pytree (prefix) of them


def _axes_per_leaf(spec: AxisSpec, values: Sequence[Any], what: str) -> list[list[int | None]]:
    """One axis (or None) per leaf of each value: ``spec`` an int/None for all, or a
    sequence with one entry per value (an int/None, or a pytree like that value)."""
    if spec is None or isinstance(spec, int):
        return [[spec] * len(tree.flatten(v)[0]) for v in values]
    if not isinstance(spec, tuple | list) or len(spec) != len(values):
        count = len(spec) if isinstance(spec, tuple | list) else "no"
        raise ValueError(
            f"vmap: {what} must be an int, None, or a tuple with one entry per "
            f"{'argument' if what == 'in_axes' else 'output'} ({len(values)}), got {count} "
            f"entries: {spec!r}"
        )
    result = []
    for i, (entry, value) in enumerate(zip(spec, values, strict=True)):
        n = len(tree.flatten(value)[0])
        if entry is None or isinstance(entry, int):
            result.append([entry] * n)
            continue
        leaves = [a.item() for a in tree.flatten(_as_leaves(entry))[0]]
        if len(leaves) != n or not all(a is None or isinstance(a, int) for a in leaves):
            raise ValueError(
                f"vmap: {what}[{i}] = {entry!r} does not match the structure of "
                f"{'argument' if what == 'in_axes' else 'output'} {i} ({n} leaves)"
            )
        result.append(list(leaves))
    return result


def _as_leaves(spec: Any) -> Any:
    """``spec`` with each int/None axis as a 0-d object array: a pytree leaf (a bare int is
    static and None an empty node), so it flattens in step with the argument's leaves."""
    if spec is None or isinstance(spec, int):
        return np.array(spec, dtype=object)
    if isinstance(spec, dict):
        return {k: _as_leaves(v) for k, v in spec.items()}
    if isinstance(spec, tuple | list):
        return type(spec)(_as_leaves(v) for v in spec)
    return spec


def _normal_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ShapeError("vmap", f"{what}: axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def vmap(
    fn: Callable[..., Any], in_axes: AxisSpec = 0, out_axes: AxisSpec = 0
) -> Callable[..., Any]:
    """Vectorize ``fn`` over a batch axis of its arguments (as ``jax.vmap``).

    Args:
        fn: a function of tensors (pytrees allowed) returning tensors, written for one
            example.
        in_axes: the batch axis of each argument: an int or None for all, or a tuple with
            one entry per argument (an int, None for an unbatched argument, or a pytree of
            them shaped like the argument).
        out_axes: where the batch axis goes in each output (same forms; None: an output
            that does not depend on the batch).
    Example:
        >>> f = sg.vmap(lambda w, x: (w * x).sum(), in_axes=(None, 0))
        >>> f(sg.tensor([1.0, 2.0]), sg.tensor([[1.0, 1.0], [2.0, 3.0]])).numpy()
        array([3., 8.], dtype=float32)
    """

    @functools.wraps(fn)
    def batched(*args: Any) -> Any:
        axes = _axes_per_leaf(in_axes, args, "in_axes")
        size, inner = _batch_size(args, axes)
        ops = BatchOps(size, inner, STATE.grad_depth)
        new_args = [
            _wrap_argument(ops, value, arg_axes, i)
            for i, (value, arg_axes) in enumerate(zip(args, axes, strict=True))
        ]
        _DEPTH.value += 1
        try:
            out = fn(*new_args)
        finally:
            _DEPTH.value -= 1
        return _unwrap_outputs(ops, out, out_axes)

    return batched


def _batch_size(args: Sequence[Any], axes: list[list[int | None]]) -> tuple[int, Any]:
    sizes: list[tuple[int, str]] = []
    tensors: list[Tensor] = []
    for i, (value, arg_axes) in enumerate(zip(args, axes, strict=True)):
        leaves, _ = tree.flatten(value)
        for j, (leaf, axis) in enumerate(zip(leaves, arg_axes, strict=True)):
            if isinstance(leaf, Tensor):
                tensors.append(leaf)
            if axis is None:
                continue
            shape = tuple(np.shape(leaf)) if not isinstance(leaf, Tensor) else leaf.shape
            where = f"argument {i}" + (f" leaf {j}" if len(leaves) > 1 else "")
            n = _normal_axis(axis, len(shape), f"in_axes of {where} (shape {fmt(shape)})")
            sizes.append((shape[n], f"{where} has size {shape[n]} on axis {axis}"))
    if not sizes:
        raise ValueError(
            "vmap: no argument has a batch axis (in_axes is None for all of them); "
            "give at least one argument an int in_axes"
        )
    if len({s for s, _ in sizes}) != 1:
        raise ShapeError("vmap", "mismatched batch sizes: " + "; ".join(w for _, w in sizes))
    return sizes[0][0], prims.pick_ops(tensors)


def _wrap_argument(ops: BatchOps, value: Any, arg_axes: list[int | None], i: int) -> Any:
    leaves, td = tree.flatten(value)
    wrapped: list[Any] = []
    for leaf, axis in zip(leaves, arg_axes, strict=True):
        if axis is None and not isinstance(leaf, Tensor | np.ndarray):
            wrapped.append(leaf)  # a static value (a Python scalar, a string)
            continue
        t = prims.as_tensor(leaf, "vmap")
        if axis is None:
            wrapped.append(ops.wrap(_Slot(t, False), t.aval))
            continue
        n = _normal_axis(axis, t.ndim, f"in_axes of argument {i}")
        front = _move(t, n, 0)
        wrapped.append(ops.wrap(_Slot(front, True), AVal(front.shape[1:], t.dtype)))
    return tree.unflatten(td, wrapped)


def _unwrap_outputs(ops: BatchOps, out: Any, out_axes: AxisSpec) -> Any:
    leaves, td = tree.flatten(out)
    single = not isinstance(out, tuple | list)
    values = [out] if single else list(out)
    if single and not (out_axes is None or isinstance(out_axes, int | tuple | list)):
        out_axes = (out_axes,)  # a pytree of axes for the one (pytree) output
    axes_nested = _axes_per_leaf(out_axes, values, "out_axes")
    axes = [a for per in axes_nested for a in per]
    result = []
    for k, (leaf, axis) in enumerate(zip(leaves, axes, strict=True)):
        if not isinstance(leaf, Tensor):
            raise TypeError(
                f"vmap: the function must return Tensors (or a pytree of them), got a "
                f"{type(leaf).__name__} at output leaf {k}"
            )
        s = ops.slot(leaf)
        if axis is None:
            if s.batched:
                raise ValueError(
                    f"vmap: out_axes is None for output leaf {k}, but it depends on the "
                    "batched arguments; give it an int out_axes"
                )
            result.append(s.value)
            continue
        value = ops.batched(s)
        n = _normal_axis(axis, value.ndim, f"out_axes of output leaf {k}")
        result.append(_move(value, 0, n))
    try:
        return tree.unflatten(td, result)
    except ShapeError:  # a typed ParamList/TList cannot hold batched leaves: plain tuples
        return tree.unflatten(td, result, typed=False)
