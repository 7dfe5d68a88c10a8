"""The graph interpreter: every primitive call records a typed, hash-consed IR node.

This is the second implementation of the ``Ops`` protocol (the first is
``ops/eager.py``). ``sg.compile`` creates one :class:`GraphOps` per trace,
adds named ``INPUT`` nodes for the arguments and calls the user's function
with graph tensors. Eager tensors and NumPy arrays the function captures are
lifted to ``CONSTANT`` nodes. ``producer``/``identity`` let the shared
autodiff (``autodiff.backward``) build backward graphs from the same VJP
rules as the eager tape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shapegrad.dtypes import DTypeError
from shapegrad.ir import Graph, Node, NodeTable
from shapegrad.ops.protocol import (
    SCALAR_OPERANDS,
    SOURCES,
    Attrs,
    AVal,
    ConstValue,
    Prim,
    infer_aval,
    scalar_dtype,
)
from shapegrad.tensor import Tensor


class GraphOps:
    """Records primitives as IR nodes in one :class:`NodeTable` (one instance per trace).

    Example:
        >>> ops = GraphOps()
        >>> x = ops.add_input("x", AVal((3,), sg.float32))
        >>> y = (x * 2.0).sum()
        >>> print(ops.to_graph([y]))   # doctest: +SKIP
    """

    priority = 1  # beats the eager interpreter: captured eager tensors become constants
    name = "graph"

    def __init__(self) -> None:
        self.table = NodeTable()
        self.inputs: list[Node] = []
        # Weakly typed values (``add_input(weak=True)``: Python scalar arguments, and their
        # broadcasts): like eager's ``x * 2``, they take the other operand's dtype.
        self.weak: set[int] = set()

    # --- the Ops protocol ------------------------------------------------------------

    def apply(self, prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor:
        nodes = [self.lift(t) for t in inputs]
        scalars = attrs.get("scalars")
        if scalars is not None:
            nodes, attrs = self._scalar_operands(nodes, attrs, scalars)
        weak_result = False
        if self.weak:
            nodes, weak_result = self._weak_operands(prim, nodes)
        aval = infer_aval(prim, [n.aval for n in nodes], attrs)
        node = self.table.make(prim, nodes, attrs, aval)
        if weak_result:
            self.weak.add(node.id)
        return self.wrap(node)

    def _weak_operands(self, prim: Prim, nodes: list[Node]) -> tuple[list[Node], bool]:
        """Cast weak operands of an elementwise op to the dtype of the others, with eager's
        rule for scalars (``prims.weak_scalar``): a float never meets a non-float tensor.
        Returns the operands and whether the result is weak too (all operands were)."""
        flags = [n.id in self.weak for n in nodes]
        if not any(flags):
            return nodes, False
        if prim in (Prim.BROADCAST, Prim.RESHAPE):
            return nodes, True
        if prim not in SCALAR_OPERANDS:
            return nodes, False
        first = 1 if prim is Prim.WHERE else 0  # a condition keeps its own (bool) type
        values = list(zip(nodes[first:], flags[first:], strict=True))
        strong = {n.aval.dtype for n, weak in values if not weak}
        if len(strong) > 1:
            return nodes, False  # the usual error: strong operands disagree
        if strong:
            (target,) = strong
        else:  # all weak: Python's promotion (an int meeting a float becomes a float)
            floats = [n.aval.dtype for n, _ in values if n.aval.dtype.is_float]
            target = floats[0] if floats else values[0][0].aval.dtype
        cast = []
        for n, weak in values:
            if weak and n.aval.dtype != target:
                if n.aval.dtype.is_float and not target.is_float:
                    raise DTypeError(
                        f"cannot combine a float value with a {target} tensor; cast with .astype()"
                    )
                attrs = {"dtype": target}
                n = self.table.make(Prim.CAST, [n], attrs, AVal(n.aval.shape, target))
            cast.append(n)
        return nodes[:first] + cast, not strong

    def _scalar_operands(
        self, nodes: list[Node], attrs: Attrs, scalars: Sequence[Any]
    ) -> tuple[list[Node], Attrs]:
        """Spell scalar operands as the IR's scalar constants: a 0-d CONSTANT broadcast to
        the operands' shape, the form every graph pass and loop stage folds into a loop
        constant (and the one ``x + 1.0`` had before scalars became op parameters)."""
        if not nodes:
            raise ValueError(f"an op with scalar operands {scalars!r} needs a tensor operand")
        shape = nodes[0].aval.shape
        pending = iter(nodes)
        full: list[Node] = []
        for s in scalars:
            if s is None:
                full.append(next(pending))
                continue
            dtype = scalar_dtype(s)
            node = self.table.make(
                Prim.CONSTANT, [], {"value": ConstValue(s, dtype)}, AVal((), dtype)
            )
            if shape:
                node = self.table.make(
                    Prim.BROADCAST, [node], {"shape": shape, "dims": ()}, AVal(shape, dtype)
                )
            full.append(node)
        return full, {k: v for k, v in attrs.items() if k != "scalars"}

    # --- building ------------------------------------------------------------------

    def add_input(self, name: str, aval: AVal, weak: bool = False) -> Tensor:
        """A new named graph input (never hash-consed: two inputs are two values); ``weak``
        for a Python scalar argument (it takes the dtype of the tensor it meets)."""
        node = self.table.make(Prim.INPUT, [], {"name": name}, aval)
        self.inputs.append(node)
        if weak:
            self.weak.add(node.id)
        return self.wrap(node)

    def wrap(self, node: Node) -> Tensor:
        return Tensor(self, node, node.aval)

    def lift(self, t: Tensor) -> Node:
        """The node of ``t`` in this trace; eager tensors become CONSTANT nodes."""
        if t._ops is self:
            node: Node = t._payload
            return node
        if isinstance(t._payload, np.ndarray):
            return self._constant(t._payload, t.aval)
        raise ValueError(
            "a tensor from another trace was used inside this sg.compile trace; pass it in "
            "as an argument instead of capturing it"
        )

    def _constant(self, array: np.ndarray[Any, Any], aval: AVal) -> Node:
        """A CONSTANT node; arrays of one repeated value stay a scalar plus a BROADCAST.

        Eager scalars meeting a traced tensor get broadcast eagerly before they are
        lifted, so without this ``x + 1.0`` would embed a full-size array in the graph.
        """
        flat = array.reshape(-1)
        if flat.size > 1 and bool(np.all(flat == flat[0])):
            scalar = ConstValue(flat[0], aval.dtype)
            node = self.table.make(Prim.CONSTANT, [], {"value": scalar}, AVal((), aval.dtype))
            attrs = {"shape": aval.shape, "dims": ()}
            return self.table.make(Prim.BROADCAST, [node], attrs, aval)
        value = ConstValue(array, aval.dtype)
        return self.table.make(Prim.CONSTANT, [], {"value": value}, aval)

    def lift_value(self, value: Any) -> Node:
        """A Tensor or NumPy array as a node of this trace (arrays become constants)."""
        if isinstance(value, Tensor):
            return self.lift(value)
        array = np.asarray(value)
        from shapegrad.dtypes import dtype_of_array

        return self._constant(array, AVal(tuple(array.shape), dtype_of_array(array)))

    def to_graph(self, outputs: Sequence[Tensor]) -> Graph:
        """The graph of this trace with ``outputs`` (graph tensors or eager constants)."""
        return Graph(list(self.inputs), [self.lift(t) for t in outputs], self.table)

    # --- hooks used by the shared autodiff -----------------------------------------

    def producer(self, t: Tensor) -> tuple[Prim, Sequence[Tensor], Attrs] | None:
        node = self.lift(t)
        if node.prim in SOURCES:
            return None
        return node.prim, [self.wrap(i) for i in node.inputs], node.attr

    def identity(self, t: Tensor) -> Any:
        # Hash-consing makes the node the value: equal nodes are one tensor for autodiff.
        return self.lift(t).id
