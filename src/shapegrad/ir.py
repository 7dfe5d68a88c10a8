"""The typed graph IR: immutable, hash-consed nodes and a Graph of named inputs/outputs.

Produced by the graph interpreter (``ops/graph.py``), rewritten by the
compiler passes, consumed by the lowering and the backends. A node is
``name = prim(inputs) {attrs} : dtype[shape]``; structurally equal nodes are
the same object (hash-consing happens in ``NodeTable``), which makes CSE
free and node identity cheap.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shapegrad.ops.protocol import Attrs, AVal, Prim

_ids = itertools.count()


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_freeze(v) for v in value)
    return value


class Node:
    """One IR value. Compare by identity; build through ``NodeTable.make``."""

    __slots__ = ("__weakref__", "attrs", "aval", "id", "inputs", "key", "prim")

    def __init__(
        self, prim: Prim, inputs: tuple[Node, ...], attrs: tuple[tuple[str, Any], ...], aval: AVal
    ) -> None:
        self.id = next(_ids)
        self.prim = prim
        self.inputs = inputs
        self.attrs = attrs  # sorted (key, value) pairs, hashable
        self.aval = aval
        self.key = (prim, tuple(i.id for i in inputs), attrs)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def __repr__(self) -> str:
        return f"%{self.id}"

    def format(self, names: dict[Node, str]) -> str:
        """``%3 = add(%1, %2) : float32[4, 8]`` using ``names`` for operands."""
        args = ", ".join(names.get(i, repr(i)) for i in self.inputs)
        shown = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        extra = f" {{{shown}}}" if shown else ""
        return f"{names.get(self, repr(self))} = {self.prim.value}({args}){extra} : {self.aval}"


def freeze_attrs(attrs: Attrs) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))


@dataclass
class NodeTable:
    """Hash-consing table: ``make`` returns the existing node for an equal (prim, inputs, attrs)."""

    table: dict[Any, Node] = field(default_factory=dict)

    def make(self, prim: Prim, inputs: Sequence[Node], attrs: Attrs, aval: AVal) -> Node:
        frozen = freeze_attrs(attrs)
        key = (prim, tuple(i.id for i in inputs), frozen)
        if prim is not Prim.INPUT:
            found = self.table.get(key)
            if found is not None:
                return found
        node = Node(prim, tuple(inputs), frozen, aval)
        if prim is not Prim.INPUT:
            self.table[key] = node
        return node


def topological_order(outputs: Iterable[Node]) -> list[Node]:
    """All nodes reachable from ``outputs``, operands first (iterative, stable)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in outputs:
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node.id in seen:
                continue
            seen.add(node.id)
            stack.append((node, True))
            for operand in reversed(node.inputs):
                if operand.id not in seen:
                    stack.append((operand, False))
    return order


@dataclass
class Graph:
    """A compiled function's dataflow: named inputs (in call order) and outputs.

    ``inputs`` are ``INPUT`` nodes whose ``name`` attr is the user-facing path
    (``"params[0]"``, ``"x"``, ``"lr"``); ``outputs`` may repeat nodes or
    name inputs directly. ``aliases`` lists ``(output_index, input_index)``
    pairs where the output is the updated value of that input.
    """

    inputs: list[Node]
    outputs: list[Node]
    table: NodeTable = field(default_factory=NodeTable)
    # (output k, input i): output k is the new value of input i, so a backend may
    # write it into input i's buffer in place (optimizer state). Optional to honour.
    aliases: list[tuple[int, int]] = field(default_factory=list)

    def nodes(self) -> list[Node]:
        """Every node the outputs depend on, in topological order."""
        return topological_order(self.outputs)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())

    def __len__(self) -> int:
        return len(self.nodes())

    def names(self) -> dict[Node, str]:
        names: dict[Node, str] = {}
        for k, node in enumerate(self.inputs):
            names[node] = f"%{node.attr.get('name', f'in{k}')}"
        for k, node in enumerate(n for n in self.nodes() if n not in names):
            names[node] = f"%{k}"
        return names

    def format(self) -> str:
        """Readable text: one line per node, then the outputs."""
        names = self.names()
        lines = [f"input {names[n]} : {n.aval}" for n in self.inputs]
        lines += [n.format(names) for n in self.nodes() if n.prim is not Prim.INPUT]
        lines.append("return " + ", ".join(names[o] for o in self.outputs))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
