"""General ``einsum`` built on the one/two-operand ``EINSUM`` primitive.

The primitive only accepts explicit letters, no ``...`` and no letter repeated
inside one operand. This module rewrites everything else NumPy accepts:

* implicit output (``"ij,jk"``): the letters used exactly once, sorted, after
  the broadcast (``...``) axes;
* ``...``: each operand's unnamed axes get fresh letters, right-aligned, and
  broadcast against each other like NumPy;
* size-1 axes broadcast against larger ones (as in NumPy): they are squeezed
  out of that operand, which is constant along them;
* a letter repeated inside one operand (diagonals, traces): the operand is
  multiplied by an identity mask built from IOTA + EQ and one of the two axes
  is summed away;
* three or more operands: contracted pairwise, left to right, keeping only
  the letters a later operand or the output still needs.
"""

from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass

from shapegrad._fused import eager_kernel
from shapegrad.dtypes import int32
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

_ELLIPSIS = "..."


@dataclass
class _Operand:
    letters: list[str]  # one letter per axis of ``x``
    x: Tensor


def _split_spec(spec: str, n: int) -> tuple[list[str], str | None]:
    spec = spec.replace(" ", "")
    if spec.count("->") > 1:
        raise ShapeError("einsum", f"spec {spec!r} has more than one '->'")
    lhs, out = spec.split("->") if "->" in spec else (spec, None)
    terms = lhs.split(",")
    if n == 0:
        raise ShapeError("einsum", "needs at least one operand")
    if len(terms) != n:
        raise ShapeError("einsum", f"spec {spec!r} names {len(terms)} operands, got {n}")
    for term in [*terms, *([out] if out is not None else [])]:
        rest = term.replace(_ELLIPSIS, "", 1)
        if any(c not in string.ascii_letters for c in rest):
            raise ShapeError(
                "einsum",
                f"invalid subscripts {term!r} in {spec!r}: use letters and at most one '...'",
            )
    return terms, out


def _expand_ellipses(
    terms: list[str], out: str | None, shapes: list[tuple[int, ...]]
) -> tuple[list[list[str]], list[str]]:
    """Replace ``...`` by fresh letters; compute the (implicit or explicit) output letters."""
    used = set("".join(terms) + (out or ""))
    fresh = [c for c in string.ascii_letters if c not in used]
    named = [len(t.replace(_ELLIPSIS, "")) for t in terms]
    extra = []
    for k, (term, shape, n_named) in enumerate(zip(terms, shapes, named, strict=True)):
        if _ELLIPSIS in term:
            if len(shape) < n_named:
                raise ShapeError(
                    "einsum",
                    f"operand {k} has shape {fmt(shape)} but {term!r} names {n_named} axes",
                )
            extra.append(len(shape) - n_named)
        else:
            if len(shape) != n_named:
                raise ShapeError(
                    "einsum",
                    f"operand {k} has shape {fmt(shape)} (rank {len(shape)}) but {term!r} "
                    f"names {n_named} axes",
                )
            extra.append(0)
    rank = max(extra)
    if rank > len(fresh):
        raise ShapeError("einsum", f"'...' covers {rank} axes; not enough free letters")
    ell = fresh[:rank]
    expanded = []
    for term, n_extra in zip(terms, extra, strict=True):
        head, _, tail = term.partition(_ELLIPSIS)
        expanded.append([*head, *(ell[rank - n_extra :] if n_extra else []), *tail])
    if out is None:
        counts = Counter(c for t in terms for c in t.replace(_ELLIPSIS, ""))
        return expanded, ell + sorted(c for c, k in counts.items() if k == 1)
    if rank and _ELLIPSIS not in out:
        raise ShapeError(
            "einsum", f"output {out!r} must contain '...' for the {rank} broadcast axes"
        )
    head, _, tail = out.partition(_ELLIPSIS)
    out_letters = [*head, *(ell if _ELLIPSIS in out else []), *tail]
    inputs = {c for t in expanded for c in t}
    if len(set(out_letters)) != len(out_letters) or not set(out_letters) <= inputs:
        raise ShapeError("einsum", f"output {out!r} must name distinct letters of the inputs")
    return expanded, out_letters


def _letter_sizes(operands: list[_Operand]) -> dict[str, int]:
    """The broadcast size of every letter; 1 broadcasts against n, anything else must agree."""
    sizes: dict[str, int] = {}
    for op in operands:
        seen: dict[str, int] = {}
        for letter, size in zip(op.letters, op.x.shape, strict=True):
            if seen.setdefault(letter, size) != size:
                raise ShapeError(
                    "einsum",
                    f"repeated index {letter!r} has sizes {seen[letter]} and {size} in one "
                    f"operand of shape {fmt(op.x.shape)}",
                )
            known = sizes.get(letter, 1)
            if size != 1 and known not in (1, size):
                shown = " and ".join(fmt(o.x.shape) for o in operands)
                raise ShapeError(
                    "einsum",
                    f"index {letter!r} is {known} in one operand and {size} in another ({shown})",
                )
            sizes[letter] = size if size != 1 else sizes.get(letter, 1)
    return sizes


def _take_diagonals(op: _Operand) -> _Operand:
    """Remove repeated letters: x * eye-mask over the two axes, then sum one of them."""
    x, letters = op.x, list(op.letters)
    while len(set(letters)) != len(letters):
        first = next(c for c in letters if letters.count(c) > 1)
        a = letters.index(first)
        b = letters.index(first, a + 1)
        same = p.binary(
            Prim.EQ, p.iota(x.shape, a, int32, like=x), p.iota(x.shape, b, int32, like=x)
        )
        x = p.reduce_sum(x * p.cast(same, x.dtype), [b])
        del letters[b]
    return _Operand(letters, x)


def _squeeze_broadcast(op: _Operand, sizes: dict[str, int]) -> _Operand:
    """Drop size-1 axes whose letter is larger elsewhere: the operand is constant along them."""
    keep = [i for i, c in enumerate(op.letters) if not (op.x.shape[i] == 1 and sizes[c] != 1)]
    if len(keep) == len(op.letters):
        return op
    x = p.reshape(op.x, [op.x.shape[i] for i in keep])
    return _Operand([op.letters[i] for i in keep], x)


def _contract(a: _Operand, b: _Operand | None, keep: list[str]) -> _Operand:
    lhs = "".join(a.letters) + ("," + "".join(b.letters) if b is not None else "")
    spec = f"{lhs}->{''.join(keep)}"
    if b is None and a.letters == keep:
        return a
    args = [a.x] if b is None else [a.x, b.x]
    return _Operand(keep, p.einsum(spec, *args))


@eager_kernel("einsum")
def einsum(spec: str, *operands: Tensor) -> Tensor:
    """Einstein summation with NumPy's rules (``np.einsum(spec, *operands)``).

    Supports implicit output (``"ij,jk"``), ``...`` broadcasting, size-1
    broadcasting, repeated letters within one operand (``"ii->i"`` diagonal,
    ``"ii"`` trace) and any number of operands (contracted left to right).

    Args:
        spec: subscripts such as ``"bij,bjk->bik"``.
        operands: tensors of one dtype.
    Returns:
        The contraction, shaped by the output letters.
    Example:
        >>> sg.einsum("ii", sg.tensor([[1.0, 2.0], [3.0, 4.0]])).item()
        5.0
    """
    xs = [x if isinstance(x, Tensor) else tensor(x) for x in operands]
    terms, out = _split_spec(spec, len(xs))
    expanded, out_letters = _expand_ellipses(terms, out, [x.shape for x in xs])
    ops = [_Operand(letters, x) for letters, x in zip(expanded, xs, strict=True)]
    sizes = _letter_sizes(ops)
    ops = [_squeeze_broadcast(_take_diagonals(op), sizes) for op in ops]
    if len(ops) == 1:
        return _contract(ops[0], None, out_letters).x
    acc = ops[0]
    for k in range(1, len(ops)):
        if k == len(ops) - 1:
            keep = out_letters
        else:
            later = set(out_letters).union(*(o.letters for o in ops[k + 1 :]))
            keep = [c for c in dict.fromkeys(acc.letters + ops[k].letters) if c in later]
        acc = _contract(acc, ops[k], keep)
    return acc.x
