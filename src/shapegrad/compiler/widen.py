"""Library products for element types the library lacks, by widening around the call.

A product of bfloat16 (or float16) operands on a target whose library has no product of
that type (``Target.contract_dtypes``: OpenBLAS on the C target multiplies float32 and
float64 only) would otherwise become a generated loop nest, an order of magnitude slower
than the library. Its semantics are "multiply and accumulate in the accumulator type,
round once" (``Target.accumulators``, as eager computes it), so the product is the same
value as ``cast(einsum(cast(a, f32), cast(b, f32)), bf16)``: this graph rewrite, the loop
stage ``widen_library_products``, writes it that way when the product is large enough to
go to the library (``Target.contract_min_macs``); the operand casts cost one pass over
each operand against the product's ``m * n * k`` multiply-adds.
"""

from __future__ import annotations

from shapegrad.compiler.rewrite import Builder, rewrite_graph
from shapegrad.compiler.target import Target
from shapegrad.dtypes import as_dtype
from shapegrad.ir import Graph, Node
from shapegrad.ops.einsum_plan import einsum_macs
from shapegrad.ops.protocol import Prim


def _widened(node: Node, target: Target) -> str | None:
    """The accumulator type to run ``node``'s product in through the library, or None."""
    if node.prim is not Prim.EINSUM or len(node.inputs) != 2:
        return None
    name = node.aval.dtype.name
    wide = target.accumulator(name)
    if name in target.contract_dtypes or wide == name or wide not in target.contract_dtypes:
        return None
    a, b = node.inputs
    if einsum_macs(node.attr["spec"], a.shape, b.shape) < target.contract_min_macs:
        return None  # a loop nest anyway: it accumulates in the wide type already
    return wide


def widen_library_products(graph: Graph, target: Target) -> Graph:
    """``graph`` with each product that the library cannot take in its own type (but can in
    its accumulator type) computed in the accumulator type and rounded once."""
    if not any(_widened(n, target) is not None for n in graph.nodes()):
        return graph  # nothing to widen: the graph itself, not a rebuilt copy

    def rule(node: Node, b: Builder) -> Node | None:
        wide = _widened(node, target)
        if wide is None:
            return None
        dtype = as_dtype(wide)
        operands = [b.make(Prim.CAST, [x], dtype=dtype) for x in node.inputs]
        product = b.make(Prim.EINSUM, operands, **node.attr)
        return b.make(Prim.CAST, [product], dtype=node.aval.dtype)

    return rewrite_graph(graph, rule)


__all__ = ["widen_library_products"]
