"""``sg.custom_vjp``: a function whose backward the user writes.

A call runs the user's ``fwd`` and marks its output with one STOP_GRADIENT carrying a
:class:`~shapegrad.autodiff.CustomVjpCall`: the call's tensor arguments and a rule that
runs the user's ``bwd``. Reverse mode (``autodiff.backward``) walks from the marker to
the arguments and applies that rule instead of differentiating ``fwd``; the eager tape
records it as a node, the graph trace as a node, so eager, numpy, C and CUDA all honour
it with nothing new below autodiff (STOP_GRADIENT is the identity everywhere, and the
graph passes drop it). Residuals stay connected to the arguments, so a backward built
from them can itself be differentiated.

A body of ``sg.scan``/``sg.checkpoint`` (or a batched body of ``vmap``) is traced once and
*replayed* in other traces (the reverse loop's body, residual forms), where the call's
arguments and residuals of the first trace mean nothing. So a call whose marker lands in
a graph trace also gets its backward *staged* (:class:`StagedRule`): traced once as a
sub-graph of the cotangent whose other inputs are nodes of the call's own trace. A replay
(:func:`replay_marker`) maps those nodes to its own values and binds a new marker whose
rule replays the sub-graph there (as JAX stages a custom_vjp's backward as a jaxpr).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shapegrad import tree
from shapegrad.autodiff import CustomRule, CustomVjpCall
from shapegrad.ir import Node, topological_order
from shapegrad.ops import prims
from shapegrad.ops.eager import STATE
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import Attrs, AVal, Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import TapeNode, Tensor


class _Active(threading.local):
    def __init__(self) -> None:
        self.fwd: set[int] = set()  # ids of custom_vjp functions running their own fwd


_ACTIVE = _Active()


class custom_vjp:  # a decorator, spelled like JAX's
    """Give a function a hand-written backward, honoured by every mode and backend.

    Example (a straight-through estimator):
        >>> @sg.custom_vjp
        ... def step(x):
        ...     return sg.where(x > 0, 1.0, 0.0).astype(x.dtype)
        >>> step.defvjp(lambda x: (step(x), None), lambda res, g: (g,))
        >>> sg.grad(lambda x: step(x).sum())(sg.tensor([-1.0, 2.0])).numpy()
        array([1., 1.], dtype=float32)

    ``fwd(*args)`` returns ``(output, residuals)`` (it may call the decorated function,
    which then runs undecorated); ``bwd(residuals, g)`` returns one cotangent per
    positional argument, shaped like it (a pytree like it, None for no gradient).
    Outputs are a Tensor or a pytree of float Tensors of one dtype.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.fwd: Callable[..., tuple[Any, Any]] | None = None
        self.bwd: Callable[[Any, Any], Sequence[Any]] | None = None

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", "function")

    def defvjp(
        self, fwd: Callable[..., tuple[Any, Any]], bwd: Callable[[Any, Any], Sequence[Any]]
    ) -> None:
        """Set the forward (``(output, residuals)``) and backward (``bwd(residuals, g)``)."""
        if not callable(fwd) or not callable(bwd):
            raise TypeError(f"custom_vjp {self._name}: defvjp(fwd, bwd) takes two functions")
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any) -> Any:
        if self.fwd is None or self.bwd is None:
            raise TypeError(
                f"custom_vjp {self._name}: no VJP defined; call {self._name}.defvjp(fwd, bwd) "
                "before calling it"
            )
        if id(self) in _ACTIVE.fwd:  # fwd calls the primal function itself
            return self.fn(*args)
        structures = [tree.flatten(a, f"argument {i}") for i, a in enumerate(args)]
        inputs = tuple(
            leaf if isinstance(leaf, Tensor) else prims.as_tensor(leaf, self._name)
            for leaves, _ in structures
            for leaf in leaves
        )
        call_args = [
            tree.unflatten(td, list(inputs[start : start + td.num_leaves]))
            for (_, td), start in zip(structures, _starts(structures), strict=True)
        ]
        _ACTIVE.fwd.add(id(self))
        try:
            result = self.fwd(*call_args)
        finally:
            _ACTIVE.fwd.discard(id(self))
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(
                f"custom_vjp {self._name}: fwd must return (output, residuals), "
                f"got {type(result).__name__}"
            )
        out, residuals = result
        out_leaves, out_td = self._check_outputs(out)
        packed = _pack(out_leaves)

        def rule(ct: Tensor, needs: Sequence[bool]) -> list[Tensor | None]:
            g = tree.unflatten(out_td, _unpack(ct, out_leaves))
            assert self.bwd is not None
            return self._cotangents(self.bwd(residuals, g), structures, inputs, call_args)

        marker = bind_marker(packed, CustomVjpCall(inputs=inputs, rule=rule, name=self._name))
        return tree.unflatten(out_td, _unpack(marker, out_leaves))

    def _check_outputs(self, out: Any) -> tuple[list[Tensor], tree.TreeDef]:
        leaves, td = tree.flatten(out, "output")
        dtypes = {leaf.dtype for leaf in leaves if isinstance(leaf, Tensor)}
        if not leaves or len(dtypes) != 1 or not all(isinstance(x, Tensor) for x in leaves):
            raise TypeError(
                f"custom_vjp {self._name}: fwd's output must be a Tensor or a pytree of "
                f"Tensors of one dtype, got {out!r:.80}"
            )
        if not leaves[0].dtype.is_float:
            raise TypeError(
                f"custom_vjp {self._name}: the output is {leaves[0].dtype}; only float "
                "outputs have cotangents"
            )
        return leaves, td

    def _cotangents(
        self,
        returned: Any,
        structures: list[tuple[list[Any], tree.TreeDef]],
        inputs: tuple[Tensor, ...],
        args: list[Any],
    ) -> list[Tensor | None]:
        """``bwd``'s result checked against the arguments, one entry per input leaf."""
        if not isinstance(returned, tuple | list) or len(returned) != len(structures):
            raise TypeError(
                f"custom_vjp {self._name}: bwd must return a tuple with one cotangent per "
                f"argument ({len(structures)}), got {type(returned).__name__}"
                + (f" of length {len(returned)}" if isinstance(returned, tuple | list) else "")
            )
        cts: list[Tensor | None] = []
        for i, (value, (_, td)) in enumerate(zip(returned, structures, strict=True)):
            if value is None:
                cts.extend([None] * td.num_leaves)
                continue
            leaves, got = tree.flatten(_fill_none(value, args[i]), f"cotangent {i}")
            if got.signature() != td.signature():
                raise TypeError(
                    f"custom_vjp {self._name}: bwd's cotangent {i} must have the structure "
                    f"of argument {i}"
                )
            cts.extend(leaves)
        result: list[Tensor | None] = []
        for k, (ct, x) in enumerate(zip(cts, inputs, strict=True)):
            if ct is None or not x.dtype.is_float:
                result.append(None)
                continue
            ct = ct if isinstance(ct, Tensor) else prims.coerce(ct, x)
            if ct.shape != x.shape:
                raise ShapeError(
                    f"custom_vjp {self._name}",
                    f"bwd returned a cotangent of shape {fmt(ct.shape)} for input leaf {k} of "
                    f"shape {fmt(x.shape)}; each cotangent is shaped like its input",
                )
            result.append(ct if ct.dtype == x.dtype else prims.cast(ct, x.dtype))
        return result


# --- the marker, and its staged form for traces that are replayed ------------------------


@dataclass(frozen=True)
class StagedRule:
    """A traced call's backward, staged so a replay of its trace can rebuild the call.

    ``inputs``: the call's arguments as nodes of the call's trace; ``captures``: the nodes
    the staged backward reads (residuals, arguments, closed-over values lifted into that
    trace); ``make_rule(capture_values)`` is the rule in a replaying trace. ``error``: the
    backward failed to stage (a bug in the user's ``bwd``), raised when differentiated.
    """

    inputs: tuple[Node, ...]
    captures: tuple[Node, ...]
    make_rule: Callable[[Sequence[Tensor]], CustomRule]
    error: Exception | None = None


Stager = Callable[[GraphOps, CustomVjpCall, AVal], StagedRule]
# Filled by ``_scan`` (the layer that traces sub-graphs), as ``control`` fills SCAN's VJP rule.
_STAGERS: list[Stager] = []
_STAGED: weakref.WeakKeyDictionary[CustomVjpCall, StagedRule] = weakref.WeakKeyDictionary()


def register_stager(stager: Stager) -> None:
    _STAGERS[:] = [stager]


def bind_marker(packed: Tensor, call: CustomVjpCall) -> Tensor:
    """The marker of ``call`` over ``packed``: a tape node eagerly, a staged rule in a graph."""
    marker = prims.bind(Prim.STOP_GRADIENT, [packed], custom_vjp=call)
    tracked = any(t._leaf or t._tape is not None for t in call.inputs)
    if not marker.is_traced and STATE.grad_enabled and tracked:  # the eager tape node
        marker._tape = TapeNode(Prim.STOP_GRADIENT, call.inputs, {"custom_vjp": call})
    elif isinstance(marker._ops, GraphOps) and _STAGERS:
        try:
            _STAGED[call] = _STAGERS[0](marker._ops, call, marker.aval)
        except Exception as error:  # raised when (if ever) the call is differentiated
            _STAGED[call] = StagedRule((), (), _failed(error), error)
    return marker


def _failed(error: Exception) -> Callable[[Sequence[Tensor]], CustomRule]:
    def make_rule(_: Sequence[Tensor]) -> CustomRule:
        def rule(ct: Tensor, needs: Sequence[bool]) -> list[Tensor | None]:
            raise error

        return rule

    return make_rule


def replay_marker(attrs: Attrs, packed: Tensor, value_of: Callable[[Node], Tensor]) -> Tensor:
    """A custom_vjp marker (``attrs`` of a STOP_GRADIENT node) replayed over ``packed`` in
    another trace; ``value_of(node)`` gives a node of the original trace's value there."""
    call: CustomVjpCall = attrs["custom_vjp"]
    staged = _STAGED.get(call)
    if staged is None:  # never staged (not from a graph trace): differentiating it errs
        return prims.bind(Prim.STOP_GRADIENT, [packed], **attrs)
    inputs = tuple(value_of(n) for n in staged.inputs)
    rule = staged.make_rule([value_of(n) for n in staged.captures])
    return bind_marker(packed, CustomVjpCall(inputs=inputs, rule=rule, name=call.name))


def replay_nodes(
    targets: Sequence[Node],
    env: dict[int, Tensor],
    sources: Any,
    unbound: str = "replay: input {} is not bound",
) -> list[Tensor]:
    """Values of ``targets`` (nodes of a recorded graph) re-run as primitives from the
    values already in ``env``, which receives every value computed; ``sources`` is the
    interpreter of nodes without operands (None: the default). A custom_vjp marker is
    rebuilt on its arguments' values here (:func:`replay_marker`), so it can be
    differentiated here. Shared by scan bodies (``_scan``) and batched bodies."""

    def value_of(node: Node) -> Tensor:
        return replay_nodes([node], env, sources, unbound)[0]

    for node in topological_order(targets):
        if node.id in env:
            continue
        if node.prim is Prim.INPUT:
            raise ValueError(unbound.format(node.attr.get("name")))
        ins = [env[i.id] for i in node.inputs]
        if node.prim is Prim.STOP_GRADIENT and "custom_vjp" in node.attr:
            env[node.id] = replay_marker(node.attr, ins[0], value_of)
            continue
        env[node.id] = prims.bind(node.prim, ins, ops=None if ins else sources, **node.attr)
    return [env[t.id] for t in targets]


def _fill_none(value: Any, like: Any) -> Any:
    """``value`` with each None inside a dict, list or tuple replaced by zeros shaped like
    the matching part of ``like`` (None is "no gradient" at any depth, as in JAX)."""
    if value is None:
        return tree.tree_map(lambda x: prims.zeros_like(x) if isinstance(x, Tensor) else x, like)
    if isinstance(value, dict) and isinstance(like, dict) and value.keys() == like.keys():
        return {k: _fill_none(v, like[k]) for k, v in value.items()}
    if (
        isinstance(value, list | tuple)
        and isinstance(like, list | tuple)
        and len(value) == len(like)
    ):
        return type(value)(_fill_none(v, w) for v, w in zip(value, like, strict=True))
    return value


def _starts(structures: list[tuple[list[Any], tree.TreeDef]]) -> list[int]:
    starts, offset = [], 0
    for _, td in structures:
        starts.append(offset)
        offset += td.num_leaves
    return starts


def _pack(leaves: list[Tensor]) -> Tensor:
    """One tensor for the marker: the output itself, or every output flattened and joined
    (the marker's cotangent then holds every output's, which ``bwd`` needs at once)."""
    if len(leaves) == 1:
        return leaves[0]
    return prims.concat([prims.reshape(x, (x.size,)) for x in leaves], 0)


def _unpack(packed: Tensor, like: list[Tensor]) -> list[Tensor]:
    if len(like) == 1:
        return [packed]
    parts, offset = [], 0
    for x in like:
        piece = prims.slice_(packed, [offset], [offset + x.size], [1])
        parts.append(prims.reshape(piece, x.shape))
        offset += x.size
    return parts
