"""Fusion ("virtualization"): which graph values get a buffer, and which are recomputed inline.

``plan_fusion`` is one named pass from a Graph to a :class:`FusionPlan`:

* **Materialized** nodes are written to memory by their own kernel. Inputs,
  outputs, reductions, contractions, gathers, scatters, sorts and collectives (and
  the operands of sorts and collectives) always are;
  non-scalar constants become read-only buffers.
* Every other node (elementwise math, layout views, iota, random) is
  **inlined**: its consumers recompute it from its operands at the index they
  need. Inlining is refused when recomputation would cost more than a load:
  several consumers of a non-trivial expression, an expensive value read
  through an expanding broadcast, a non-trivial einsum operand (a contraction
  reads each operand element many times), or an expression grown too large.
* **Epilogues**: a reduction/contraction whose single consumer chain is
  elementwise at the same index (``relu(x @ w + b)``) is computed inside the
  kernel of that consumer: the accumulator feeds the epilogue directly, and
  the raw reduction never touches memory.
* **Viewed operands**: where the target's products take two-level batches
  (``Target.strided_batches``), an einsum operand that is a layout view (slices,
  reshapes, permutes) of an elementwise value other kernels also read materializes that
  value, not the view: attention's ``q``, ``k`` and ``v`` are head views of one
  ``x @ w_qkv + b`` buffer that the products read in place (``contract.py``), instead
  of three copies that each recompute the bias add.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shapegrad.compiler.passes import splat_value
from shapegrad.compiler.target import C_TARGET, Target
from shapegrad.ir import Graph, Node
from shapegrad.ops.protocol import COLLECTIVES, ELEMENTWISE, Prim
from shapegrad.shapes import size_of

ROOTS = frozenset(
    {
        Prim.REDUCE_SUM,
        Prim.REDUCE_MAX,
        Prim.EINSUM,
        Prim.GATHER,
        Prim.SCATTER_ADD,
        Prim.ARGSORT,
        *COLLECTIVES,
    }
)
_EXPENSIVE = frozenset(
    {Prim.EXP, Prim.LOG, Prim.SIN, Prim.COS, Prim.TANH, Prim.ERF, Prim.POW, Prim.SQRT}
)
_ZERO_COST = frozenset(
    {
        Prim.RESHAPE,
        Prim.PERMUTE,
        Prim.BROADCAST,
        Prim.SLICE,
        Prim.STOP_GRADIENT,
        Prim.IOTA,
        Prim.CONSTANT,
        Prim.INPUT,
    }
)


@dataclass
class FusionPlan:
    """The result of :func:`plan_fusion`.

    Attributes:
        materialized: ids of nodes that own a buffer.
        epilogue_of: id of a reduction/contraction -> the node whose kernel computes it.
        fused_roots: id of an epilogue node -> the reduction/contraction it absorbs.
        cost: inline cost of each node (ops recomputed per element when inlined).
    """

    materialized: set[int] = field(default_factory=set)
    epilogue_of: dict[int, Node] = field(default_factory=dict)
    fused_roots: dict[int, Node] = field(default_factory=dict)
    cost: dict[int, int] = field(default_factory=dict)


def _own_cost(node: Node) -> int:
    if node.prim in _ZERO_COST:
        return 0
    if node.prim in _EXPENSIVE:
        return 8
    return 1


def contiguous_view(node: Node, materialized: set[int]) -> tuple[Node, int] | None:
    """``(base, offset)`` when ``node`` is a row-major contiguous run of the materialized
    ``base``'s elements starting at ``offset`` (reshapes, leading-axis slices): a layer loop
    then reads it in place instead of through a copy."""
    offset = 0
    while node.id not in materialized:
        if node.prim in (Prim.RESHAPE, Prim.STOP_GRADIENT):
            node = node.inputs[0]
            continue
        if node.prim is Prim.SLICE:
            src = node.inputs[0]
            starts, stops, steps = node.attr["starts"], node.attr["stops"], node.attr["steps"]
            full = all(
                (lo, hi) == (0, n)
                for lo, hi, n in zip(starts[1:], stops[1:], src.shape[1:], strict=True)
            )
            if not src.shape or steps[0] != 1 or not full:
                return None
            offset += starts[0] * size_of(src.shape[1:])
            node = src
            continue
        return None
    return node, offset


def consumers_of(graph: Graph) -> dict[int, list[Node]]:
    """Node id -> distinct nodes that read it."""
    users: dict[int, list[Node]] = {}
    for node in graph.nodes():
        for operand in set(node.inputs):
            users.setdefault(operand.id, []).append(node)
    return users


def plan_fusion(graph: Graph, target: Target = C_TARGET) -> FusionPlan:
    """Decide materialization and epilogue fusion for every node of ``graph``.

    Args:
        graph: an optimized graph.
        target: the cost limits (``shared_cost_limit``, ``max_inline_cost``) and whether
            eligible reductions are computed inside their elementwise consumer
            (``fuse_epilogues``).
    Returns:
        a :class:`FusionPlan`.
    Example:
        >>> plan = plan_fusion(graph); sorted(plan.materialized)
    """
    plan = FusionPlan()
    users = consumers_of(graph)
    outputs = {o.id for o in graph.outputs}
    order = graph.nodes()
    for node in order:
        plan.cost[node.id] = _own_cost(node) + sum(
            plan.cost[i.id] for i in set(node.inputs) if i.id not in plan.materialized
        )
        if _must_materialize(node, users.get(node.id, []), outputs, plan.cost[node.id], target):
            plan.materialized.add(node.id)
            plan.cost[node.id] = 0
        if target.strided_batches and node.prim is Prim.EINSUM:
            _materialize_viewed(node, plan, users)
        _materialize_operands(node, plan)
    if target.fuse_epilogues:
        _fuse_epilogues(order, users, outputs, plan)
    return plan


def _must_materialize(
    node: Node, users: list[Node], outputs: set[int], cost: int, target: Target
) -> bool:
    if (
        node.prim is Prim.INPUT
        or node.id in outputs
        or node.prim in ROOTS
        or node.prim is Prim.SCAN
    ):
        return True
    if node.prim is Prim.CONSTANT:
        return int(node.attr["value"].array.size) > 1
    if cost > target.max_inline_cost:
        return True
    return len(users) > 1 and cost > target.shared_cost_limit


def _materialize_operands(node: Node, plan: FusionPlan) -> None:
    """Operands whose recomputation inside ``node`` would be multiplied get a buffer."""
    if node.prim is Prim.EINSUM:
        for operand in node.inputs:
            if plan.cost.get(operand.id, 0) > 0:
                plan.materialized.add(operand.id)
                plan.cost[operand.id] = 0
    elif node.prim in COLLECTIVES or node.prim is Prim.ARGSORT:
        # the exchange reads a whole buffer; a sort reads each element of a row many times
        plan.materialized.add(node.inputs[0].id)
        plan.cost[node.inputs[0].id] = 0
    elif node.prim is Prim.SCAN:  # a layer loop reads buffers through per-layer slices
        n_carry = node.attr["body"].n_carry
        for k, operand in enumerate(node.inputs):
            if k < n_carry and splat_value(operand) is not None:
                continue  # an initial carry of one value is stored, not read
            if contiguous_view(operand, plan.materialized) is None:
                plan.materialized.add(operand.id)
                plan.cost[operand.id] = 0
    elif node.prim in (Prim.GATHER, Prim.SCATTER_ADD):
        plan.materialized.add(node.inputs[1].id)  # indices are read as data, bounds-checked
        plan.cost[node.inputs[1].id] = 0
    elif node.prim is Prim.BROADCAST:
        (operand,) = node.inputs
        expands = _size(node) > _size(operand)
        if expands and plan.cost.get(operand.id, 0) > 1:
            plan.materialized.add(operand.id)
            plan.cost[operand.id] = 0
            plan.cost[node.id] = 0


_VIEWS = frozenset({Prim.RESHAPE, Prim.PERMUTE, Prim.SLICE, Prim.STOP_GRADIENT})


def _materialize_viewed(node: Node, plan: FusionPlan, users: dict[int, list[Node]]) -> None:
    """An einsum operand viewing a shared elementwise value: the value gets the buffer
    and the view costs nothing (module docstring, "Viewed operands")."""
    for operand in node.inputs:
        chain, base = [], operand
        while base.prim in _VIEWS and base.id not in plan.materialized:
            if base.prim is Prim.SLICE and any(s != 1 for s in base.attr["steps"]):
                break
            chain.append(base)
            base = base.inputs[0]
        if not chain or base.prim in _VIEWS:
            continue
        if base.id not in plan.materialized:
            if base.prim not in ELEMENTWISE or len(users.get(base.id, [])) < 2:
                continue
            plan.materialized.add(base.id)
        for n in (base, *chain):  # a view of a buffer costs nothing (read in place)
            plan.cost[n.id] = 0


def _size(node: Node) -> int:
    n = 1
    for d in node.shape:
        n *= d
    return n


def _fuse_epilogues(
    order: list[Node], users: dict[int, list[Node]], outputs: set[int], plan: FusionPlan
) -> None:
    for node in order:
        if node.id not in plan.materialized or node.prim not in ELEMENTWISE:
            continue
        roots = _roots_reached(node, plan, users)
        if len(roots) != 1:
            continue
        root = roots[0]
        if (
            root.prim not in (Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.EINSUM)
            or root.id in outputs
            or root.id in plan.epilogue_of
            or len(users.get(root.id, [])) != 1
            or root.aval != node.aval
        ):
            continue
        plan.epilogue_of[root.id] = node
        plan.fused_roots[node.id] = root
        plan.materialized.discard(root.id)


def _roots_reached(node: Node, plan: FusionPlan, users: dict[int, list[Node]]) -> list[Node]:
    """Materialized roots read by ``node``'s inline tree through elementwise ops only.

    Returns an empty list if the tree reaches any materialized non-input value through a
    layout op (the index would differ) or reaches more than one root.
    """
    found: dict[int, Node] = {}
    through_layout: set[int] = set()
    stack = [(i, True) for i in node.inputs]
    while stack:
        n, direct = stack.pop()
        if n.id in plan.materialized:
            if n.prim in ROOTS:
                found[n.id] = n
                if not direct:
                    through_layout.add(n.id)
            continue
        # A shared inline value is also expanded in other kernels, which would need the root.
        keeps_index = direct and n.prim in ELEMENTWISE and len(users.get(n.id, [])) == 1
        stack.extend((i, keeps_index) for i in n.inputs)
    if through_layout:
        return []
    return list(found.values())
