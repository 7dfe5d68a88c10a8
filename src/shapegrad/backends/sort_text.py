"""The C text of a :class:`~shapegrad.compiler.loops.SortRow` (C and CUDA alike), used by
``cstyle.CStyleRenderer``'s statement rule.

A merge sort: runs of :data:`SORT_RUN` insertion-sorted in place, then merged bottom-up
between the row's two scratch halves; or a selection: the ``k`` best positions kept
sorted by insertion while the row is scanned once. Positions are int32; values are read
through them from the row (which stays in cache: one row at a time per thread).
"""

from __future__ import annotations

from typing import Protocol

from shapegrad.compiler import loops as L
from shapegrad.dtypes import DType


class Renderer(Protocol):
    """What the text needs of ``cstyle.CStyleRenderer`` (which imports this module)."""

    def type_name(self, dtype: DType) -> str: ...
    def is_bf16_buffer(self, name: str) -> bool: ...
    def affine(self, a: L.Affine) -> str: ...
    def emit(self, depth: int, text: str) -> None: ...


# Runs of this many elements are insertion-sorted before the bottom-up merges (short runs
# of a merge sort cost more in loop overhead than in comparisons).
SORT_RUN = 16


class SortRowText:
    """C text of one :class:`~shapegrad.compiler.loops.SortRow` (C and CUDA alike): a
    block with its own locals, so rows run concurrently in the enclosing parallel loops.

    Values are compared in their computed type (float16/bfloat16 as float); ``before(x,
    y)`` is the strict order that puts NaN last ascending and first descending, so equal
    values are never reordered (the merge takes the left run's element on a tie)."""

    def __init__(self, renderer: Renderer, s: L.SortRow) -> None:
        self.r = renderer
        self.s = s
        half = s.dtype.name in ("float16", "bfloat16")
        self.t = "float" if half else renderer.type_name(s.dtype)

    def load(self, position: str) -> str:
        """The row's element at ``position`` (an int expression)."""
        s = self.s
        text = f"{s.src}[sg_base + {s.src_stride} * (int64_t)({position})]"
        if self.r.is_bf16_buffer(s.src):
            return f"sg_bf2f({text})"
        return f"(float)({text})" if s.dtype.name == "float16" else text

    def before(self, x: str, y: str) -> str:
        """``x`` strictly before ``y`` in the sorted order."""
        if not self.s.dtype.is_float:
            return f"({x} {'>' if self.s.descending else '<'} {y})"
        if self.s.descending:
            return f"({x} > {y} || ({x} != {x} && {y} == {y}))"
        return f"({x} < {y} || ({y} != {y} && {x} == {x}))"

    def emit(self, depth: int) -> None:
        s, e = self.s, self.r.emit
        order = "descending" if s.descending else "ascending"
        e(depth, f"{{ /* argsort ({s.method}, {order}): {s.k} of {s.n} positions */")
        d = depth + 1
        e(d, f"const int64_t sg_base = {self.r.affine(s.src_index)};")
        e(d, f"int32_t *sg_a = {s.scratch} + ({self.r.affine(s.scratch_index)});")
        if s.method == "select":
            self._select(d)
        else:
            self._merge(d)
        dst = f"{s.dst}[{self.r.affine(s.dst_index)} + {s.dst_stride} * sg_t]"
        e(d, f"for (int64_t sg_t = 0; sg_t < {s.k}; ++sg_t) {dst} = sg_a[sg_t];")
        e(depth, "}")

    def _insert(self, d: int, lo: str) -> None:
        """Shift ``sg_a[sg_p-1] ...`` right while ``sg_v`` goes before it (down to ``lo``)."""
        e, t = self.r.emit, self.t
        e(d, f"while (sg_p > {lo}) {{")
        e(d + 1, f"const {t} sg_u = {self.load('sg_a[sg_p - 1]')};")
        e(d + 1, f"if (!{self.before('sg_v', 'sg_u')}) break;")
        e(d + 1, "sg_a[sg_p] = sg_a[sg_p - 1];")
        e(d + 1, "--sg_p;")
        e(d, "}")

    def _select(self, d: int) -> None:
        s, e, t = self.s, self.r.emit, self.t
        e(d, "int64_t sg_c = 0;")
        e(d, f"for (int64_t sg_j = 0; sg_j < {s.n}; ++sg_j) {{")
        e(d + 1, f"const {t} sg_v = {self.load('sg_j')};")
        e(d + 1, f"if (sg_c == {s.k}) {{")
        e(d + 2, f"const {t} sg_u = {self.load(f'sg_a[{s.k - 1}]')};")
        e(d + 2, f"if (!{self.before('sg_v', 'sg_u')}) continue;")
        e(d + 1, "}")
        e(d + 1, f"int64_t sg_p = sg_c < {s.k} ? sg_c++ : {s.k - 1};")
        self._insert(d + 1, "0")
        e(d + 1, "sg_a[sg_p] = (int32_t)sg_j;")
        e(d, "}")

    def _merge(self, d: int) -> None:
        e, t, n = self.r.emit, self.t, self.s.n
        e(d, f"int32_t *sg_b = sg_a + {n};")
        e(d, f"for (int64_t sg_i = 0; sg_i < {n}; ++sg_i) sg_a[sg_i] = (int32_t)sg_i;")
        e(d, f"for (int64_t sg_lo = 0; sg_lo < {n}; sg_lo += {SORT_RUN}) {{")
        e(d + 1, f"const int64_t sg_hi = sg_lo + {SORT_RUN} < {n} ? sg_lo + {SORT_RUN} : {n};")
        e(d + 1, "for (int64_t sg_i = sg_lo + 1; sg_i < sg_hi; ++sg_i) {")
        e(d + 2, "const int32_t sg_at = sg_a[sg_i];")
        e(d + 2, f"const {t} sg_v = {self.load('sg_at')};")
        e(d + 2, "int64_t sg_p = sg_i;")
        self._insert(d + 2, "sg_lo")
        e(d + 2, "sg_a[sg_p] = sg_at;")
        e(d + 1, "}")
        e(d, "}")
        e(d, f"for (int64_t sg_w = {SORT_RUN}; sg_w < {n}; sg_w *= 2) {{")
        e(d + 1, f"for (int64_t sg_lo = 0; sg_lo < {n}; sg_lo += 2 * sg_w) {{")
        e(d + 2, f"const int64_t sg_mid = sg_lo + sg_w < {n} ? sg_lo + sg_w : {n};")
        e(d + 2, f"const int64_t sg_hi = sg_lo + 2 * sg_w < {n} ? sg_lo + 2 * sg_w : {n};")
        e(d + 2, "int64_t sg_i = sg_lo, sg_j = sg_mid, sg_o = sg_lo;")
        e(d + 2, "while (sg_i < sg_mid && sg_j < sg_hi) {")
        e(d + 3, f"const {t} sg_x = {self.load('sg_a[sg_j]')};")
        e(d + 3, f"const {t} sg_y = {self.load('sg_a[sg_i]')};")
        e(d + 3, f"sg_b[sg_o++] = {self.before('sg_x', 'sg_y')} ? sg_a[sg_j++] : sg_a[sg_i++];")
        e(d + 2, "}")
        e(d + 2, "while (sg_i < sg_mid) sg_b[sg_o++] = sg_a[sg_i++];")
        e(d + 2, "while (sg_j < sg_hi) sg_b[sg_o++] = sg_a[sg_j++];")
        e(d + 1, "}")
        e(d + 1, "int32_t *sg_swap = sg_a; sg_a = sg_b; sg_b = sg_swap;")
        e(d, "}")
