"""The NumPy reference backend: executes an optimized graph node by node.

It is the oracle other backends are tested against and the fallback when no
compiler is available. Every node runs through ``ops.reference.evaluate``,
the same NumPy semantics the eager interpreter uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shapegrad.backends.base import Array, CompileOptions, Executable, register_backend
from shapegrad.backends.options import NoOptions
from shapegrad.ir import Graph, Node
from shapegrad.ops import reference
from shapegrad.ops.protocol import Prim


class NumpyExecutable(Executable):
    """Runs ``graph`` with NumPy; intermediate arrays are freed after their last use.

    It keeps no state between calls: ``bind`` returns None (``NumpyBackend.binds_state``).
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._order: list[Node] = [n for n in graph.nodes() if n.prim is not Prim.INPUT]
        self._last_use = _last_uses(self._order, graph.outputs)

    def __call__(self, inputs: Sequence[Array]) -> list[Array]:
        values: dict[int, Array] = {n.id: a for n, a in zip(self.graph.inputs, inputs, strict=True)}
        keep = {o.id for o in self.graph.outputs} | set(values)
        with np.errstate(all="ignore"):
            for step, node in enumerate(self._order):
                args = [values[i.id] for i in node.inputs]
                values[node.id] = reference.evaluate(node.prim, args, node.attr, node.aval.dtype)
                for dead in self._last_use.get(step, ()):
                    if dead not in keep:
                        del values[dead]
        # Outputs are always new, writable arrays (callers may keep or mutate them).
        return [np.array(values[o.id], copy=True) for o in self.graph.outputs]


def _last_uses(order: list[Node], outputs: Sequence[Node]) -> dict[int, list[int]]:
    """step -> ids of values whose last reader is that step."""
    last: dict[int, int] = {}
    for step, node in enumerate(order):
        for operand in node.inputs:
            last[operand.id] = step
    by_step: dict[int, list[int]] = {}
    for node_id, step in last.items():
        by_step.setdefault(step, []).append(node_id)
    return by_step


class NumpyBackend:
    """Backend ``"numpy"``: always available."""

    name = "numpy"
    binds_state = False

    def compile(self, graph: Graph, options: CompileOptions) -> NumpyExecutable:
        return NumpyExecutable(graph)

    def is_available(self) -> tuple[bool, str]:
        return True, ""


register_backend("numpy", NumpyBackend, options=NoOptions)
