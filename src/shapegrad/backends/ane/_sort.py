"""ARGSORT in MIL by ranking: every element's sorted position is the number of elements of
its row that go before it, and position ``t`` holds the element whose rank is ``t``.

MIL's own ``argsort``/``topk`` promise no order among ties, and the positions must be
exactly the stable ones every other backend gives. Ranking compares all pairs of a row
(``n*n`` comparisons per row, elementwise ops and sums the engine runs), so rows longer
than :data:`ANE_MAX_SORTED` are refused with a clear error instead.

Element ``j`` goes before element ``i`` when it is strictly before in the order (NaN the
largest value), or equal (two NaNs are equal) and ``j < i``. Comparisons are 0/1 int32
values: ``and`` is a product, ``or`` a maximum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from shapegrad.dtypes import bool_
from shapegrad.ir import Node

from ._errors import AneLoweringError
from ._mil import Var

if TYPE_CHECKING:
    from .lowering import _Lowerer

# All pairs of a row are compared at once: a row of 2048 is 4M comparisons per row.
ANE_MAX_SORTED = 2048


def lower_argsort(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """ARGSORT as ranks (sums of pairwise comparisons), then positions (a one-hot sum)."""
    mb = lo.mb
    (x,) = args
    axis, k, descending = node.attr["axis"], node.attr["k"], node.attr["descending"]
    shape = [int(d) for d in node.inputs[0].shape]
    n = shape[axis]
    if n > ANE_MAX_SORTED:
        raise AneLoweringError(
            "argsort",
            f"a row of {n} elements along dimension {axis} of {shape} (ranking compares all "
            f"pairs of a row; rows of at most {ANE_MAX_SORTED} are lowered)",
        )
    if node.inputs[0].aval.dtype == bool_:
        x = mb.cast(x=x, dtype="int32")
    order = [d for d in range(len(shape)) if d != axis] + [axis]
    if order != list(range(len(shape))):
        x = mb.transpose(x=x, perm=np.array(order, np.int32))
    lead = [shape[d] for d in order[:-1]]
    rows = math.prod(lead)
    flat = mb.reshape(x=x, shape=np.array([rows, n], np.int32))
    xi = mb.reshape(x=flat, shape=np.array([rows, n, 1], np.int32))  # element i on axis 1
    xj = mb.reshape(x=flat, shape=np.array([rows, 1, n], np.int32))  # element j on axis 2

    def flag(v: Var) -> Var:
        return mb.cast(x=v, dtype="int32")

    strict = flag(mb.less(x=xi, y=xj) if descending else mb.less(x=xj, y=xi))
    same = flag(mb.equal(x=xj, y=xi))
    if node.inputs[0].aval.dtype.is_float:
        nan_i, nan_j = flag(mb.not_equal(x=xi, y=xi)), flag(mb.not_equal(x=xj, y=xj))
        # NaN is the largest: ascending, a number goes before a NaN; descending, after one
        first, second = (nan_j, nan_i) if descending else (nan_i, nan_j)
        strict = mb.maximum(x=strict, y=mb.mul(x=first, y=mb.sub(x=np.int32(1), y=second)))
        same = mb.maximum(x=same, y=mb.mul(x=nan_i, y=nan_j))
    earlier = mb.const(val=np.tril(np.ones((n, n), np.int32), -1).reshape(1, n, n))
    before = mb.maximum(x=strict, y=mb.mul(x=same, y=earlier))
    rank = mb.reduce_sum(x=before, axes=np.array([2], np.int32), keep_dims=True)  # [rows, n, 1]
    slots = mb.const(val=np.arange(k, dtype=np.int32).reshape(1, 1, k))
    onehot = flag(mb.equal(x=rank, y=slots))  # [rows, n, k]: element i is at position t
    where = mb.const(val=np.arange(n, dtype=np.int32).reshape(1, n, 1))
    positions = mb.reduce_sum(
        x=mb.mul(x=onehot, y=where), axes=np.array([1], np.int32), keep_dims=False
    )
    result = mb.reshape(x=positions, shape=np.array([*lead, k], np.int32))
    lo.mark(node.prim, "decomposed")
    if order == list(range(len(shape))):
        return result
    back = np.argsort(np.array(order)).astype(np.int32)
    return mb.transpose(x=result, perm=back)
