"""Graph-to-graph optimization passes and the pipeline that runs them to a fixed point.

Each pass is a small named function ``Graph -> Graph`` that preserves the
graph's inputs (the calling convention) and semantics. They share one
rebuild loop (:func:`~shapegrad.compiler.rewrite.rewrite_graph`): nodes are
visited operands-first, re-created through a fresh hash-consing table (so
structurally equal nodes merge) and offered to the pass's rule, which may
return a replacement. Product rewrites live in ``compiler/products.py``.

``PIPELINE`` is the ordered, visible list; :func:`optimize` runs it until no
pass changes the graph and records :class:`PassStat` for every application.

Float rewrites assume finite values, like ``-ffast-math`` for these cases
only: ``x - x -> 0`` (NaN/Inf would give NaN). ``x * 0`` is *not* rewritten.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shapegrad.compiler.products import merge_product_batches
from shapegrad.compiler.rewrite import Builder, rewrite_graph
from shapegrad.ir import Graph, Node, NodeTable
from shapegrad.ops import reference
from shapegrad.ops.protocol import (
    COLLECTIVES,
    ELEMENTWISE,
    SOURCES,
    UNARY,
    Prim,
)
from shapegrad.shapes import size_of

# ---------------------------------------------------------------------------
# Helpers that read constants
# ---------------------------------------------------------------------------


def splat_value(node: Node) -> float | None:
    """The single value of a constant whose elements are all equal (through broadcasts)."""
    while node.prim is Prim.BROADCAST:
        node = node.inputs[0]
    if node.prim is not Prim.CONSTANT:
        return None
    array = node.attr["value"].array
    if array.size == 0:
        return None
    first = array.reshape(-1)[0]
    if not np.all(array == first):
        return None
    return float(first)


def _is_splat(node: Node, value: float) -> bool:
    found = splat_value(node)
    return found is not None and found == value


# ---------------------------------------------------------------------------
# Constant folding
# ---------------------------------------------------------------------------

FOLD_LIMIT = 1 << 12  # never materialize a folded constant larger than this (elements)


def _fold_rule(node: Node, b: Builder) -> Node | None:
    if node.prim in SOURCES or node.prim is Prim.BROADCAST or not node.inputs:
        return None
    if node.prim in COLLECTIVES:  # runs at step time, with every process of its communicator
        return None
    if any(i.prim is not Prim.CONSTANT for i in node.inputs):
        return None
    largest_input = max(size_of(i.shape) for i in node.inputs)
    if size_of(node.shape) > max(FOLD_LIMIT, largest_input):
        return None
    args = [i.attr["value"].array for i in node.inputs]
    with np.errstate(all="ignore"):
        value = reference.evaluate(node.prim, args, node.attr, node.aval.dtype)
    return b.constant(value, node.aval)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate nodes whose operands are all constants (except huge or broadcast results).

    Example: ``add(constant 2, constant 3)`` becomes ``constant 5``.
    """
    return rewrite_graph(graph, _fold_rule)


# ---------------------------------------------------------------------------
# Algebraic simplification
# ---------------------------------------------------------------------------


def _simplify_arith(node: Node, b: Builder) -> Node | None:
    x, y = node.inputs[0], node.inputs[-1]
    p = node.prim
    if p is Prim.MUL and _is_splat(y, 1.0):
        return x
    if p is Prim.MUL and _is_splat(x, 1.0):
        return y
    if p is Prim.DIV and _is_splat(y, 1.0):
        return x
    if p in (Prim.ADD, Prim.SUB) and _is_splat(y, 0.0):
        return x
    if p is Prim.ADD and _is_splat(x, 0.0):
        return y
    if p is Prim.SUB and _is_splat(x, 0.0):
        return b.make(Prim.NEG, [y])
    if p is Prim.SUB and x is y and not node.aval.dtype.is_float:
        return b.full(0, node.aval)  # not for floats: NaN - NaN and inf - inf are NaN
    if p is Prim.MUL and _is_splat(y, -1.0):
        return b.make(Prim.NEG, [x])
    if p is Prim.ADD and y.prim is Prim.NEG:  # x + (-y) -> x - y
        return b.make(Prim.SUB, [x, y.inputs[0]])
    if p is Prim.SUB and y.prim is Prim.NEG:  # x - (-y) -> x + y
        return b.make(Prim.ADD, [x, y.inputs[0]])
    return None


def _scaled_by_splat(node: Node) -> tuple[Node, float] | None:
    """``(a, c)`` when ``node`` is ``mul(a, splat c)`` or ``mul(splat c, a)``."""
    if node.prim is not Prim.MUL:
        return None
    x, y = node.inputs
    for operand, other in ((x, y), (y, x)):
        c = splat_value(other)
        if c is not None:
            return operand, c
    return None


def _fold_negation(node: Node, b: Builder) -> Node | None:
    """-(a * c) -> a * (-c) and (-a) * c -> a * (-c) for a splat constant c (exact in IEEE)."""
    if node.prim is Prim.NEG:
        scaled = _scaled_by_splat(node.inputs[0])
        if scaled is not None:
            a, c = scaled
            return b.make(Prim.MUL, [a, b.full(-c, a.aval)])
    scaled = _scaled_by_splat(node)
    if scaled is not None and scaled[0].prim is Prim.NEG:
        a, c = scaled[0].inputs[0], scaled[1]
        return b.make(Prim.MUL, [a, b.full(-c, a.aval)])
    return None


def _simplify_layout(node: Node, b: Builder) -> Node | None:
    x = node.inputs[0]
    p = node.prim
    if p is Prim.RESHAPE:
        if node.shape == x.shape:
            return x
        if x.prim is Prim.RESHAPE:
            return b.make(Prim.RESHAPE, [x.inputs[0]], shape=node.shape)
    if p is Prim.PERMUTE:
        perm: tuple[int, ...] = node.attr["perm"]
        if perm == tuple(range(len(perm))):
            return x
        if x.prim is Prim.PERMUTE:
            inner: tuple[int, ...] = x.attr["perm"]
            return b.make(Prim.PERMUTE, [x.inputs[0]], perm=tuple(inner[q] for q in perm))
    if p is Prim.BROADCAST:
        dims: tuple[int, ...] = node.attr["dims"]
        if node.shape == x.shape and dims == tuple(range(len(dims))):
            return x
        if x.prim is Prim.BROADCAST:
            inner_dims: tuple[int, ...] = x.attr["dims"]
            composed = tuple(dims[d] for d in inner_dims)
            return b.make(Prim.BROADCAST, [x.inputs[0]], shape=node.shape, dims=composed)
    return None


def _simplify_sum_of_broadcast(node: Node, b: Builder) -> Node | None:
    """reduce_sum over axes a broadcast created -> operand * count (then broadcast the rest)."""
    src = node.inputs[0]
    if src.prim is not Prim.BROADCAST:
        return None
    x = src.inputs[0]
    axes: tuple[int, ...] = node.attr["axes"]
    dims: tuple[int, ...] = src.attr["dims"]
    # Every reduced axis must be new, or come from a size-1 axis of x.
    from_x = {d: i for i, d in enumerate(dims)}
    if any(a in from_x and x.shape[from_x[a]] != 1 for a in axes):
        return None
    count = size_of([src.shape[a] for a in axes])
    dropped = [from_x[a] for a in axes if a in from_x]
    kept = [i for i in range(len(x.shape)) if i not in dropped]
    core = x
    if dropped:
        core = b.make(Prim.RESHAPE, [x], shape=tuple(x.shape[i] for i in kept))
    if count != 1:
        if not node.aval.dtype.is_float and node.aval.dtype.name != "int32":
            return None
        core = b.make(Prim.MUL, [core, b.full(count, core.aval)])
    remaining = [a for a in range(len(src.shape)) if a not in axes]
    new_dims = tuple(remaining.index(dims[i]) for i in kept)
    if core.shape == node.shape and new_dims == tuple(range(len(new_dims))):
        return core
    return b.make(Prim.BROADCAST, [core], shape=node.shape, dims=new_dims)


def _sink_broadcast(node: Node, b: Builder) -> Node | None:
    """Elementwise ops on broadcasts of equal layout run on the small operands instead."""
    if node.prim not in ELEMENTWISE or node.prim is Prim.STOP_GRADIENT:
        return None
    if any(i.prim is not Prim.BROADCAST for i in node.inputs):
        return None
    first = node.inputs[0]
    key = (first.attr["dims"], first.inputs[0].shape)
    if any((i.attr["dims"], i.inputs[0].shape) != key for i in node.inputs):
        return None
    small = b.make(node.prim, [i.inputs[0] for i in node.inputs], **node.attr)
    return b.make(Prim.BROADCAST, [small], shape=node.shape, dims=first.attr["dims"])


def _simplify_rule(node: Node, b: Builder) -> Node | None:
    p = node.prim
    if p is Prim.STOP_GRADIENT:  # autodiff has run; it is the identity from here on
        return node.inputs[0]
    if p is Prim.NEG and node.inputs[0].prim is Prim.NEG:
        return node.inputs[0].inputs[0]
    if (p is Prim.NEG or p is Prim.MUL) and node.aval.dtype.is_float:
        found = _fold_negation(node, b)
        if found is not None:
            return found
    if p is Prim.CAST and node.inputs[0].aval == node.aval:
        return node.inputs[0]
    if p is Prim.WHERE and node.inputs[1] is node.inputs[2]:
        return node.inputs[1]
    if p in (Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV):
        found = _simplify_arith(node, b)
        if found is not None:
            return found
    if p in (Prim.RESHAPE, Prim.PERMUTE, Prim.BROADCAST):
        return _simplify_layout(node, b)
    if p is Prim.REDUCE_SUM:
        return _simplify_sum_of_broadcast(node, b)
    if p in UNARY or p in ELEMENTWISE:
        return _sink_broadcast(node, b)
    return None


def simplify_algebra(graph: Graph) -> Graph:
    """Local identities: x*1, x+0, x-0, 0-x, x-x, x/1, --x, -(x*c), reshape/permute chains,
    broadcast-of-broadcast, sum of a broadcast, elementwise-of-broadcasts, where(c, x, x),
    no-op casts, and ``stop_gradient`` removal (autodiff is done before passes run).
    """
    return rewrite_graph(graph, _simplify_rule)


# ---------------------------------------------------------------------------
# CSE and DCE
# ---------------------------------------------------------------------------


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge structurally equal nodes (same prim, operands and attrs).

    Tracing already hash-conses, but graphs built elsewhere (or rewritten
    without a shared table) may contain duplicates; this canonical rebuild
    merges them operands-first, so equal subtrees collapse completely.
    """
    return rewrite_graph(graph)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop every node the outputs do not depend on (inputs are kept: the calling convention).

    The trace records forward values the backward pass never reads, zeros that
    simplification made unnecessary, and so on; they stay in the node table
    until this pass builds a table holding only live nodes.
    """
    live = graph.nodes()
    table = NodeTable()
    for node in live:
        if node.prim is not Prim.INPUT:
            table.table[node.key] = node
    return Graph(list(graph.inputs), list(graph.outputs), table, list(graph.aliases))


# ---------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------

Pass = Callable[[Graph], Graph]

PIPELINE: list[tuple[str, Pass]] = [
    ("fold_constants", fold_constants),
    ("simplify_algebra", simplify_algebra),
    ("merge_product_batches", merge_product_batches),
    ("eliminate_common_subexpressions", eliminate_common_subexpressions),
    ("eliminate_dead_code", eliminate_dead_code),
]


@dataclass(frozen=True)
class PassStat:
    """One application of a pass: its round of the fixed-point loop, node counts, time."""

    name: str
    round: int
    nodes_before: int
    nodes_after: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"round {self.round} {self.name:<32} {self.nodes_before:>6} -> "
            f"{self.nodes_after:<6} ({self.seconds * 1e3:.1f} ms)"
        )


def count_nodes(graph: Graph) -> int:
    """Live non-input nodes (what an executable will compute)."""
    return sum(1 for n in graph.nodes() if n.prim is not Prim.INPUT)


def fingerprint(graph: Graph) -> tuple[object, ...]:
    """Identity of the graph's live structure (nodes are immutable, so ids suffice)."""
    return tuple(n.id for n in graph.nodes()) + (None,) + tuple(o.id for o in graph.outputs)


PassHook = Callable[[int, str, Graph], None]


def optimize(
    graph: Graph,
    pipeline: Sequence[tuple[str, Pass]] | None = None,
    max_rounds: int = 20,
    on_pass: PassHook | None = None,
) -> tuple[Graph, list[PassStat]]:
    """Run ``pipeline`` (default ``PIPELINE``) in order, repeatedly, until nothing changes.

    Args:
        graph: the traced graph.
        pipeline: ``(name, pass)`` pairs; applied in list order each round.
        max_rounds: safety bound on the fixed-point loop.
        on_pass: called as ``on_pass(round, name, graph_after)`` (used by debug dumps).
    Returns:
        ``(optimized graph, statistics of every pass application)``.
    Example:
        >>> optimized, stats = optimize(graph)
        >>> print("\\n".join(map(str, stats)))   # doctest: +SKIP
    """
    passes = list(PIPELINE if pipeline is None else pipeline)
    stats: list[PassStat] = []
    for round_ in range(1, max_rounds + 1):
        start_print = fingerprint(graph)
        for name, run in passes:
            before = count_nodes(graph)
            t0 = time.perf_counter()
            graph = run(graph)
            elapsed = time.perf_counter() - t0
            stats.append(PassStat(name, round_, before, count_nodes(graph), elapsed))
            if on_pass is not None:
                on_pass(round_, name, graph)
        if fingerprint(graph) == start_print:
            break
    return graph, stats
