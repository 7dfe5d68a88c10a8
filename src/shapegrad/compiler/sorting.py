"""Lowering ``ARGSORT``: one :class:`~shapegrad.compiler.loops.SortRow` per row, in a
parallel loop nest over the rows.

The operand is materialized (``fusion.py``: a sort reads every element of a row many
times). A tensor of shape ``(pre, n, post)`` around the sorted axis has ``pre * post``
rows, row ``(a, b)`` starting at ``a*n*post + b`` with stride ``post``; the loops over
``a`` and ``b`` are ordinary parallel loops, so the C renderer splits them across its
team and CUDA runs one row per thread, as for any other row kernel. Each row owns its
own slice of a scratch temp, so rows never share memory.

The method is chosen here, from sizes alone: a bounded insertion of the ``k`` best
(``"select"``, ``n*k`` comparisons at worst, about ``n`` for random data) when
``k`` is at most :data:`SELECT_MAX_K` and below ``n`` (sampling's top-k of a vocabulary),
else a merge sort (``"merge"``, ``n log n``).
"""

from __future__ import annotations

import math
from typing import Protocol

from shapegrad.compiler import loops as L
from shapegrad.compiler.expand import ExprBuilder
from shapegrad.dtypes import DType, int32
from shapegrad.ir import Node


class KernelBuilder(Protocol):
    """What this module needs of ``lower.KernelBuilder`` (which imports this module)."""

    names: dict[int, str]

    def temp(self, dtype: DType, size: int, hint: str) -> str: ...
    def fresh(self, extent: int, prefix: str = "i") -> L.Var: ...
    def expr_builder(self) -> ExprBuilder: ...
    def add(self, root: Node, body: tuple[L.Stmt, ...], work: int, ex: ExprBuilder) -> None: ...


# Up to this many kept elements, keeping them sorted by insertion while scanning the row
# beats sorting the whole row: its worst case (every element enters: n*k moves) is about a
# merge sort's n*log2(n) for k = 16, and random data moves far fewer. Measured (C, one
# thread, 64 rows of 32000 float32, a 2-core machine under load; benchmark in the commit
# message): top-16 by selection 1.2 ms against 320-440 ms for the merge sort (NumPy's
# stable argsort: 330-430 ms); on ascending rows (the worst case) 37 ms against 50 ms.
SELECT_MAX_K = 16


def sort_method(n: int, k: int) -> str:
    """``"select"`` for a short top-k of a longer row, else ``"merge"``."""
    return "select" if 0 < k < n and k <= SELECT_MAX_K else "merge"


def emit_argsort(builder: KernelBuilder, node: Node, dst: str) -> None:
    """The kernel of one ``ARGSORT`` node (see the module docstring)."""
    (x,) = node.inputs
    axis: int = node.attr["axis"]
    k: int = node.attr["k"]
    n = x.shape[axis]
    pre, post = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1 :])
    method = sort_method(n, k)
    per_row = k if method == "select" else 2 * n
    scratch = builder.temp(int32, max(1, pre * post * per_row), "sortwork")
    ex = builder.expr_builder()
    outer = [builder.fresh(d, "r") for d in (pre, post)]
    a, b = (L.var(v) if v.extent > 1 else L.const(0) for v in outer)
    row = a * post + b  # the row's number
    stmt = L.SortRow(
        src=builder.names[x.id],
        src_index=a * (n * post) + b,
        src_stride=post,
        n=n,
        dst=dst,
        dst_index=a * (k * post) + b,
        dst_stride=post,
        k=k,
        scratch=scratch,
        scratch_index=row * per_row,
        dtype=x.aval.dtype,
        descending=bool(node.attr["descending"]),
        method=method,
    )
    body: tuple[L.Stmt, ...] = (stmt,)
    for v in reversed(outer):
        if v.extent > 1:
            body = (L.Loop(v, "parallel", body),)
    if pre * post == 0 or k == 0:
        body = ()  # nothing to sort or nothing kept: an empty result
    builder.add(node, body, sort_work(n, k, pre * post), ex)


def sort_work(n: int, k: int, rows: int) -> int:
    """Scalar operations of sorting ``rows`` rows (the schedule's size estimate)."""
    return rows * row_work(n, sort_method(n, k))


def row_work(n: int, method: str) -> int:
    """Scalar operations of one row: a load and a compare per element and pass."""
    if method == "select":
        return 2 * n
    return 2 * max(1, n) * max(1, math.ceil(math.log2(max(n, 2))))
