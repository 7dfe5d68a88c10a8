"""Recognise einsums that are (batched) matrix products over existing buffers.

A two-operand einsum whose letters split into batch (both operands and the
output), m (first operand and output), n (second operand and output) and k
(both operands, summed) is ``C[b] = A[b] @ B[b]``. If both operands are plain
strided views of buffers (permutes and broadcasts are fine: they only change
strides) with each letter group contiguous, the product maps onto one
``Contract`` statement, which renderers send to BLAS (C) or cuBLAS (CUDA).

Where the target takes strided batches (``Target.strided_batches``), the batch letters
may form two groups with strides of their own, and ``c`` may be written with rows
wider than ``n`` (:func:`_two_level`): attention's ``bhqd`` head views of a ``[b, t, 3,
h, d]`` buffer (strides ``t*3*h*d`` and ``d``) are then read where they lie, and a
product whose output letters put a batch letter between its rows and columns (heads
merged back, ``bhqk,bhkd->bqhd``) writes that layout directly: no operand copies.
OpenBLAS's one-call batch does not help: on the AMD EPYC (AVX-512) box, one thread, 128
products of 64x64x32 took 0.35 ms as 128 ``cblas_sgemm`` calls on copied heads, 0.35 ms
on the strided head views and 0.34 ms as one OpenBLAS 0.3.34 ``cblas_sgemm_batch_strided``
call (which takes one stride per operand, so no head views). The C renderer runs small
float32 batches as one call of shapegrad's own ``sg_sgemm_batch`` instead, which reads
both levels of the batch in place (``backends/c/batch_gemm.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from shapegrad.compiler import loops as L
from shapegrad.dtypes import DType
from shapegrad.ir import Node
from shapegrad.ops.einsum_roles import EinsumRoles

if TYPE_CHECKING:
    from shapegrad.compiler.expand import ExprBuilder


@dataclass(frozen=True)
class View:
    buffer: str
    offset: int
    strides: dict[str, int]


@dataclass(frozen=True)
class ContractMatch:
    """A matched product; ``statement`` builds the loop-IR Contract for a destination."""

    a: View
    b: View
    m: int
    n: int
    k: int
    batch: int
    trans_a: bool
    trans_b: bool
    lda: int
    ldb: int
    stride_a: int
    stride_b: int
    sum_batch: int = 1
    sum_stride_a: int = 0
    sum_stride_b: int = 0
    stride_c: int = 0  # 0: m * n (products packed back to back)
    inner: int = 1  # a two-level batch: ``batch = outer * inner`` (``L.Contract``)
    inner_strides: tuple[int, int, int] = (0, 0, 0)  # a, b, c
    ldc: int = 0  # 0: n

    def statement(self, dst: str, dtype: DType) -> L.Contract:
        ia, ib, ic = self.inner_strides
        return L.Contract(
            self.a.buffer,
            self.b.buffer,
            dst,
            self.m,
            self.n,
            self.k,
            self.trans_a,
            self.trans_b,
            self.lda,
            self.ldb,
            self.a.offset,
            self.b.offset,
            self.batch,
            self.stride_a,
            self.stride_b,
            self.stride_c or self.m * self.n,
            dtype,
            self.sum_batch,
            self.sum_stride_a,
            self.sum_stride_b,
            inner=self.inner,
            inner_stride_a=ia,
            inner_stride_b=ib,
            inner_stride_c=ic,
            ldc=self.ldc,
        )


def _view(operand: Node, term: str, ex: ExprBuilder) -> View | None:
    """Strides of ``operand`` per letter when it is a strided view of a buffer."""
    letter_vars = {c: L.Var(f"_{c}", size) for c, size in zip(term, operand.shape, strict=True)}
    value = ex.value(operand, tuple(L.var(letter_vars[c]) for c in term))
    if not isinstance(value, L.Load) or value.dtype != operand.aval.dtype:
        return None
    if any(not isinstance(a, L.Var) for a in value.index.atoms()):
        return None
    strides = {c: value.index.coef(v) for c, v in letter_vars.items()}
    return View(value.buffer, value.index.const, strides)


def _group(view: View, letters: str, sizes: dict[str, int]) -> tuple[int, int] | None:
    """(size, stride) of a group of letters addressed as one row-major axis, or None."""
    live = [c for c in letters if sizes[c] > 1]
    if not live:
        return 1, 0
    strides = [view.strides.get(c, 0) for c in live]
    if 0 in strides:
        return (_size(sizes, letters), 0) if set(strides) == {0} else None
    for outer, inner in itertools.pairwise(live):
        if view.strides[outer] != view.strides[inner] * sizes[inner]:
            return None
    size = 1
    for c in live:
        size *= sizes[c]
    return size, view.strides[live[-1]]


def _matrix(rows: tuple[int, int], cols: tuple[int, int]) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols operand, or None."""
    (r, r_stride), (c, c_stride) = rows, cols
    if c == 1 or c_stride == 1:
        ld = r_stride if r > 1 else max(c, 1)
        if ld >= max(c, 1):
            return False, ld
    if r == 1 or r_stride == 1:
        ld = c_stride if c > 1 else max(r, 1)
        if ld >= max(r, 1):
            return True, ld
    return None


Packer = Callable[[Node, str, str], View]


def _roles(out: str, ta: str, tb: str) -> tuple[int, bool] | None:
    """(batch prefix length, swapped) making the rest of ``out`` ``m* n*`` (or ``n* m*``).

    Letters of the batch prefix may be missing from one operand (broadcast, stride 0);
    letters present in both operands and the output must be in the prefix.
    """
    for p in range(len(out) + 1):
        rest = out[p:]
        if any(c in ta and c in tb for c in rest):
            continue
        kinds = "".join("m" if c in ta else "n" for c in rest)
        if kinds == "".join(sorted(kinds)):
            return p, False
        if kinds == "".join(sorted(kinds, reverse=True)):
            return p, True
    return None


def _fits(view: View, batch: str, rows: str, cols: str, sizes: dict[str, int]) -> bool:
    groups = [_group(view, g, sizes) for g in (batch, rows, cols)]
    if any(g is None for g in groups):
        return False
    _, r, c = groups
    assert r is not None and c is not None
    return _matrix(r, c) is not None


def match_contraction(
    root: Node, ex: ExprBuilder, min_macs: int, pack: Packer, strided_batches: bool = False
) -> ContractMatch | None:
    """A :class:`ContractMatch` for einsum ``root`` or None (then generated loops are used).

    Args:
        root: a two-operand EINSUM node.
        ex: expression builder of the current kernel (resolves views to buffers).
        min_macs: smallest product (batch*m*n*k) worth a library call.
        pack: ``pack(operand, term, order)`` writes ``operand`` (axes named by ``term``)
            into a fresh buffer with axes in ``order`` and returns its view; used when an
            operand is not a strided view that BLAS can read directly.
    """
    letters = EinsumRoles.of(root.attr["spec"])
    ta, tb, out = letters.a, letters.b, letters.out
    a_node, b_node = root.inputs
    sizes = letters.sizes(a_node.shape, b_node.shape)
    if not letters.plain_product:
        return None  # a letter summed inside one operand: not a plain product
    roles = _roles(out, ta, tb)
    if roles is None:
        if strided_batches and _size(sizes, out) * _size(sizes, letters.contracted) >= min_macs:
            return _two_level(root, letters, ex, sizes)
        return None
    p, swapped = roles
    first, second, t1, t2 = (b_node, a_node, tb, ta) if swapped else (a_node, b_node, ta, tb)
    batch_l = out[:p]
    m_l = "".join(c for c in out[p:] if c in t1)
    n_l = "".join(c for c in out[p:] if c in t2)
    k_l = (letters.swapped() if swapped else letters).contracted
    m, n, k = (_size(sizes, g) for g in (m_l, n_l, k_l))
    batch = _size(sizes, batch_l)
    if batch * m * n * k < min_macs:
        return None
    va, vb = _view(first, t1, ex), _view(second, t2, ex)
    split = _sum_split(va, vb, batch_l, m_l, n_l, k_l, sizes)
    if split is not None:
        s_l, k_rest = split
        sa, sb = _group(va, s_l, sizes), _group(vb, s_l, sizes)  # type: ignore[arg-type]
        match = _build(va, vb, batch_l, m_l, n_l, k_rest, sizes)  # type: ignore[arg-type]
        if match is not None and sa is not None and sb is not None:
            return replace(match, sum_batch=sa[0], sum_stride_a=sa[1], sum_stride_b=sb[1])
    fits_a = va is not None and _fits(va, batch_l, m_l, k_l, sizes)
    fits_b = vb is not None and _fits(vb, batch_l, k_l, n_l, sizes)
    if strided_batches and not (fits_a and fits_b):
        found = _two_level(root, letters, ex, sizes)
        if found is not None:
            return found
    if va is None or not fits_a:
        va = pack(first, t1, "".join(c for c in batch_l if c in t1) + m_l + k_l)
    if vb is None or not fits_b:
        vb = pack(second, t2, "".join(c for c in batch_l if c in t2) + k_l + n_l)
    return _build(va, vb, batch_l, m_l, n_l, k_l, sizes)


def _sum_split(
    va: View | None,
    vb: View | None,
    batch_l: str,
    m_l: str,
    n_l: str,
    k_l: str,
    sizes: dict[str, int],
) -> tuple[str, str] | None:
    """``(summed-batch letters, remaining k letters)`` when the operands do not fit as they
    are but do after moving a leading part of ``k`` into a loop of accumulating products."""
    if va is None or vb is None:
        return None
    if _fits(va, batch_l, m_l, k_l, sizes) and _fits(vb, batch_l, k_l, n_l, sizes):
        return None
    for s in range(1, len(k_l)):
        s_l, rest = k_l[:s], k_l[s:]
        if _group(va, s_l, sizes) is None or _group(vb, s_l, sizes) is None:
            continue
        if _fits(va, batch_l, m_l, rest, sizes) and _fits(vb, batch_l, rest, n_l, sizes):
            return s_l, rest
    return None


def _build(
    va: View, vb: View, batch_l: str, m_l: str, n_l: str, k_l: str, sizes: dict[str, int]
) -> ContractMatch | None:
    m, n, k = (_size(sizes, g) for g in (m_l, n_l, k_l))
    ba, ma, ka = _group(va, batch_l, sizes), _group(va, m_l, sizes), _group(va, k_l, sizes)
    bb, kb, nb = _group(vb, batch_l, sizes), _group(vb, k_l, sizes), _group(vb, n_l, sizes)
    if ba is None or ma is None or ka is None or bb is None or kb is None or nb is None:
        return None  # e.g. a batch group mixing broadcast and real axes
    mat_a, mat_b = _matrix(ma, ka), _matrix(kb, nb)
    if mat_a is None or mat_b is None:
        return None
    batch = _size(sizes, batch_l)
    return ContractMatch(
        va, vb, m, n, k, batch, mat_a[0], mat_b[0], mat_a[1], mat_b[1], ba[1], bb[1]
    )


def _two_level(
    root: Node, letters: EinsumRoles, ex: ExprBuilder, sizes: dict[str, int]
) -> ContractMatch | None:
    """The product over views as they are, its batch in up to two strided groups.

    Batch letters are those of both operands and the output; the other output letters
    must read ``m* n*`` (or ``n* m*``: the operands swap) in output order, wherever the
    batch letters sit between them. ``c`` is the output in row-major order, so its rows
    are ``ldc`` apart. The batch letters (output order, size-1 ones dropped) are cut
    into an outer and an inner group, each a single strided axis in ``a``, ``b`` and
    ``c``; a single group is preferred. None when no cut works (the caller packs).
    """
    ta, tb, out = letters.a, letters.b, letters.out
    batch_l = [c for c in out if c in ta and c in tb]
    rest = [c for c in out if c not in batch_l]
    kinds = "".join("m" if c in ta else "n" for c in rest)
    if kinds == "".join(sorted(kinds)):
        swapped = False
    elif kinds == "".join(sorted(kinds, reverse=True)):
        swapped = True
    else:
        return None
    a_node, b_node = root.inputs
    first, second, t1 = (b_node, a_node, tb) if swapped else (a_node, b_node, ta)
    m_l = "".join(c for c in rest if c in t1)
    n_l = "".join(c for c in rest if c not in t1)
    k_l = (letters.swapped() if swapped else letters).contracted
    va = _view(first, t1, ex)
    vb = _view(second, ta if swapped else tb, ex)
    if va is None or vb is None:
        return None
    c_strides, step = {}, 1
    for c in reversed(out):
        c_strides[c] = step
        step *= sizes[c]
    vc = View("", 0, c_strides)
    mat_a = _matrix_of(va, m_l, k_l, sizes)
    mat_b = _matrix_of(vb, k_l, n_l, sizes)
    mat_c = _matrix_of(vc, m_l, n_l, sizes)
    if mat_a is None or mat_b is None or mat_c is None or mat_c[0]:
        return None
    live = "".join(c for c in batch_l if sizes[c] > 1)
    for cut in range(len(live), -1, -1):
        outer, inner = live[:cut], live[cut:]
        groups = [(_group(v, outer, sizes), _group(v, inner, sizes)) for v in (va, vb, vc)]
        if any(g is None or h is None for g, h in groups):
            continue
        (oa, ia), (ob, ib), (oc, ic) = groups
        assert oa and ia and ob and ib and oc and ic
        m, n, k = (_size(sizes, g) for g in (m_l, n_l, k_l))
        return ContractMatch(
            va, vb, m, n, k, _size(sizes, live), mat_a[0], mat_b[0], mat_a[1], mat_b[1],
            oa[1], ob[1], stride_c=oc[1], inner=_size(sizes, inner),
            inner_strides=(ia[1], ib[1], ic[1]), ldc=mat_c[1],
        )  # fmt: skip
    return None


def _matrix_of(view: View, rows: str, cols: str, sizes: dict[str, int]) -> tuple[bool, int] | None:
    r, c = _group(view, rows, sizes), _group(view, cols, sizes)
    return None if r is None or c is None else _matrix(r, c)


def _size(sizes: dict[str, int], letters: str) -> int:
    n = 1
    for c in letters:
        n *= sizes[c]
    return n
