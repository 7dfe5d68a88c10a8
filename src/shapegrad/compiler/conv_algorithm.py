"""The convolution algorithm of ``sg.conv2d(algorithm="auto")``, chosen per Target.

Tracing cannot know the backend, so ``_conv.py`` traces an "auto" convolution as im2col
and marks its product (``EINSUM`` with ``conv="auto"``). This graph rewrite, the first
loop stage (``choose_conv_algorithm`` in ``pipeline.LOOP_PIPELINE``), replaces a marked
product by Winograd F(2x2, 3x3) (``_winograd.py``, instantiated as a graph template) when
the Target's rule asks for it: a 3x3, stride-1, float convolution with at least
``Target.winograd_min_channels`` input and output channels. The stage's dump is the
graph after the choice. Explicit ``algorithm="im2col"`` / ``"winograd"`` are never
touched. Gradient products were built by autodiff before any Target was known and stay
im2col; ``algorithm="winograd"`` gives all three products in Winograd form.

No C target turns the rule on. Re-measured with OpenBLAS's AVX-512 kernels, which make
im2col's products ~1.7x faster than the AVX2 ones (``benchmarks/winograd_threshold.py
--channels 16x32,64x64,128x128``, ``SHAPEGRAD_NUM_THREADS=1``, batch 64, 28x28; AMD EPYC
Zen 5 with AVX-512, 2 cores shared with other jobs at load average 13-16): im2col time /
Winograd time 0.37 at 16x32 channels, 0.84 at 64x64, 1.03 at 128x128. The CNN b64 of
``benchmarks/train_step.py`` (16 and 32 channels) stays im2col.
"""

from __future__ import annotations

from shapegrad._conv import CONV_SPEC
from shapegrad._winograd import winograd_graph
from shapegrad.compiler.passes import optimize
from shapegrad.compiler.rewrite import Builder, rewrite_graph
from shapegrad.compiler.target import Target
from shapegrad.ir import Graph, Node
from shapegrad.ops.protocol import Prim


def _auto_conv(node: Node) -> tuple[Node, Node, tuple[int, int]] | None:
    """``(x, w, padding)`` of a marked 3x3 stride-1 im2col product, or None.

    The product reads ``concat_k reshape(slice_k(pad(x)))`` and ``reshape(w)``
    (``_conv._patches``); anything else (a pass rewrote it) is left as it is.
    """
    if node.prim is not Prim.EINSUM or node.attr.get("conv") != "auto":
        return None
    if node.attr["spec"] != CONV_SPEC or len(node.inputs) != 2:
        return None
    cols, w_flat = node.inputs
    if cols.prim is not Prim.CONCAT or w_flat.prim is not Prim.RESHAPE:
        return None
    w = w_flat.inputs[0]
    first = cols.inputs[0]
    if first.prim is not Prim.RESHAPE or first.inputs[0].prim is not Prim.SLICE:
        return None
    piece = first.inputs[0]
    source = piece.inputs[0]
    pads = (0, 0)
    if source.prim is Prim.PAD:
        low, high = source.attr["low"], source.attr["high"]
        if low != high or low[:2] != (0, 0) or source.attr["value"] != 0.0:
            return None
        pads = (low[2], low[3])
        source = source.inputs[0]
    x = source
    if len(x.shape) != 4 or len(w.shape) != 4 or w.shape[2:] != (3, 3):
        return None
    if piece.attr["steps"] != (1, 1, 1, 1) or not x.aval.dtype.is_float:
        return None
    n, c, h, wd = x.shape
    expected = (n, w.shape[0], h + 2 * pads[0] - 2, wd + 2 * pads[1] - 2)
    if w.shape[1] != c or node.shape != expected:
        return None
    return x, w, pads


def _instantiate(template: Graph, args: list[Node], b: Builder) -> Node:
    """``template``'s output rebuilt in ``b``'s table on ``args`` (its inputs, in order)."""
    env = {i.id: a for i, a in zip(template.inputs, args, strict=True)}
    for node in template.nodes():
        if node.id not in env:
            env[node.id] = b.make(node.prim, [env[i.id] for i in node.inputs], **node.attr)
    return env[template.outputs[0].id]


def choose_conv_algorithm(graph: Graph, target: Target) -> Graph:
    """``graph`` with each marked convolution in the algorithm ``target`` picks."""
    wide = target.winograd_min_channels
    if wide is None:
        return graph

    def rule(node: Node, b: Builder) -> Node | None:
        found = _auto_conv(node)
        if found is None:
            return None
        x, w, pads = found
        if min(w.shape[0], w.shape[1]) < wide:
            return None
        return _instantiate(winograd_graph(x.aval, w.aval, pads), [x, w], b)

    if not any(_auto_conv(n) is not None for n in graph.nodes()):
        return graph  # nothing to choose: the graph itself, not a rebuilt copy
    # the graph passes again: Winograd's 16 products merge, its transforms fold
    chosen, _ = optimize(rewrite_graph(graph, rule))
    return chosen


__all__ = ["choose_conv_algorithm"]
