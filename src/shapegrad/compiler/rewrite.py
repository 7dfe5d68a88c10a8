"""The rebuild loop every graph pass shares, and the node builder its rules use.

:func:`rewrite_graph` visits nodes operands-first, re-creates them through a fresh
hash-consing table (so structurally equal nodes merge) and offers each to a rule, which
may return a replacement built with :class:`Builder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shapegrad.ir import Graph, Node, NodeTable
from shapegrad.ops.protocol import AVal, ConstValue, Prim, infer_aval


class Builder:
    """Makes nodes for rewrite rules in the table of the graph being rebuilt."""

    def __init__(self, table: NodeTable) -> None:
        self.table = table

    def make(self, prim: Prim, inputs: Sequence[Node], **attrs: object) -> Node:
        """A node with its aval inferred (a bad rewrite fails here, not at run time)."""
        aval = infer_aval(prim, [i.aval for i in inputs], attrs)
        return self.table.make(prim, inputs, attrs, aval)

    def constant(self, array: np.ndarray, like: AVal) -> Node:
        """A CONSTANT node holding ``array`` with ``like``'s dtype."""
        value = ConstValue(array, like.dtype)
        return self.table.make(Prim.CONSTANT, [], {"value": value}, AVal(value.shape, like.dtype))

    def full(self, value: float, aval: AVal) -> Node:
        """``value`` as a scalar constant broadcast to ``aval`` (cheap to store and fold)."""
        scalar = self.constant(np.asarray(value), AVal((), aval.dtype))
        if not aval.shape:
            return scalar
        return self.make(Prim.BROADCAST, [scalar], shape=aval.shape, dims=())


Rule = Callable[[Node, Builder], Node | None]


def rewrite_graph(graph: Graph, rule: Rule | None = None, max_rule_steps: int = 8) -> Graph:
    """Rebuild ``graph`` operands-first through a fresh table, applying ``rule`` to each node.

    Args:
        graph: the input graph (not modified; nodes are immutable).
        rule: returns a replacement for a node (already in the new table) or None.
        max_rule_steps: how often the rule may re-fire on its own result per node.
    Returns:
        A graph with the same inputs; equal nodes are merged (CSE) and only
        reachable nodes are kept (DCE).
    """
    table = NodeTable()
    builder = Builder(table)
    mapping: dict[int, Node] = {n.id: n for n in graph.inputs}
    for node in graph.nodes():
        if node.id in mapping:
            continue
        if node.prim is Prim.INPUT:  # an input not listed in graph.inputs: keep it as is
            mapping[node.id] = node
            continue
        new_inputs = [mapping[i.id] for i in node.inputs]
        if all(a is b for a, b in zip(new_inputs, node.inputs, strict=True)):
            current = table.table.setdefault(node.key, node)
        else:
            current = table.make(node.prim, new_inputs, node.attr, node.aval)
        for _ in range(max_rule_steps if rule is not None else 0):
            assert rule is not None
            replacement = rule(current, builder)
            if replacement is None or replacement is current:
                break
            _check_same_aval(current, replacement)
            current = replacement
        mapping[node.id] = current
    return Graph(
        list(graph.inputs), [mapping[o.id] for o in graph.outputs], table, list(graph.aliases)
    )


def _check_same_aval(old: Node, new: Node) -> None:
    if old.aval != new.aval:
        raise AssertionError(
            f"rewrite changed {old.prim.value}'s type from {old.aval} to {new.aval}"
        )
