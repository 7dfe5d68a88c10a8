"""Shape rules of the ops, on static shapes (pure Python: no mypy types here).

Every rule returns the result :class:`TShape` (None when it is not statically
known) or raises :class:`Mismatch` with a message for people. A mismatch is
reported only when it is certain: two literal sizes that differ, or two rigid
names that differ (see :func:`shapegrad.mypy_plugin.spec.restrict`). An
unknown dim (None) or an anonymous variadic never causes an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import sizes
from .spec import Dim, Item, TShape, Var, show, show_item

ANON = Var(None, "")


class Mismatch(Exception):
    """A shape bug that will certainly fail at run time; ``str()`` is the message."""


# Two bare names compared; not a name that ends or starts an expression (``c * h * w != f``
# blames no single name).
_TWO_NAMES = re.compile(
    r"(?<![\w.])(?<![*+/-] )([A-Za-z_]\w*) (?:!=|vs) ([A-Za-z_]\w*)(?![\w.(\[])(?! [*+/-])"
)


def with_hint(message: str) -> str:
    """``message`` plus a suggestion when it blames two different dim names.

    Distinct names of one signature are distinct dims (like type variables); when
    the code means one size, the fix is usually to give both places one name.
    """
    found = _TWO_NAMES.findall(message)
    if not found or found[-1][0] == found[-1][1]:
        return message
    a, b = found[-1]
    return f"{message}; if {a} and {b} are the same size, give them one name"


@dataclass(frozen=True)
class Operand:
    """A shape with the source text of the expression it belongs to (for messages)."""

    label: str
    shape: TShape
    scalar: str | None = None  # "int"/"float"/"bool" for a Python number (shape [])

    def describe(self) -> str:
        return f"{self.label} {show(self.shape.dims)}" if self.label else show(self.shape.dims)


def differ(a: Item, b: Item) -> bool:
    """True when dims ``a`` and ``b`` are certainly different sizes (see :func:`sizes.differ`)."""
    if a is None or b is None or isinstance(a, Var) or isinstance(b, Var):
        return False
    return sizes.differ(a, b)


def join_dtype(*dtypes: str | None) -> str | None:
    """The common dtype kind when all agree, else None (unknown)."""
    first = dtypes[0] if dtypes else None
    return first if all(d == first for d in dtypes) else None


def _split(dims: tuple[Item, ...]) -> tuple[tuple[Item, ...], Var | None, tuple[Item, ...]]:
    """``(prefix, variadic, suffix)``; the variadic is None for a known rank."""
    for i, d in enumerate(dims):
        if isinstance(d, Var):
            return dims[:i], d, dims[i + 1 :]
    return dims, None, ()


# --- broadcasting -------------------------------------------------------------------------------


def _broadcast_dim(sizes: list[Item]) -> tuple[Item, tuple[Item, Item] | None]:
    """The broadcast of one column of dims and the first certain conflict (or None)."""
    known = [s for s in sizes if s != 1]
    if not known:
        return 1, None
    for s in known:
        for t in known:
            if differ(s, t):
                return None, (s, t)
    definite = [s for s in known if s is not None]
    return (definite[0] if definite else None), None


def broadcast(op: str, operands: list[Operand], dtype: str | None = None) -> TShape | None:
    """NumPy broadcasting of all operands (a scalar operand is shape ``[]``).

    Example: ``[b, 784]`` and ``[784]`` give ``[b, 784]``; ``[b, 784]`` and ``[10]`` raise.
    """
    if not operands:
        return None
    parts = [_split(o.shape.dims) for o in operands]
    tails = [p[2] if p[1] is not None else p[0] for p in parts]
    has_var = any(p[1] is not None for p in parts)
    depth = (
        min(len(t) for t, p in zip(tails, parts, strict=True) if p[1] is not None)
        if has_var
        else max(len(t) for t in tails)
    )
    out: list[Item] = []
    for k in range(1, depth + 1):
        column = [t[-k] for t in tails if k <= len(t)]
        size, conflict = _broadcast_dim(column)
        if conflict is not None:
            shown = " and ".join(o.describe() for o in operands)
            raise Mismatch(
                f"{op}: cannot broadcast {shown}: dimension {-k} is "
                f"{show_item(conflict[0])} vs {show_item(conflict[1])}"
            )
        out.append(size)
    out.reverse()
    if has_var:
        rests = {o.shape.dims[: len(o.shape.dims) - depth] for o in operands}
        rests.discard(())
        lead: list[Item] = [*rests.pop()] if len(rests) == 1 else [ANON]
        out = lead + out
    return TShape(tuple(out), dtype)


# --- contraction ---------------------------------------------------------------------------------


def matmul(a: Operand, b: Operand) -> TShape | None:
    """NumPy ``a @ b``: vectors, matrices and broadcast batch dims.

    Example: ``[b, 784] @ [784, 10]`` gives ``[b, 10]``.
    """
    da, db = a.shape.dims, b.shape.dims
    dtype = join_dtype(a.shape.dtype, b.shape.dtype)
    for o in (a, b):
        if o.shape.fixed and not o.shape.dims:
            raise Mismatch(f"matmul: operands must be at least 1-d, got {o.describe()} (a scalar)")
    _, var_a, tail_a = _split(da)
    _, var_b, tail_b = _split(db)
    k_a: Item = da[-1] if da and not isinstance(da[-1], Var) else None
    if var_b is None:
        k_b: Item = db[0] if len(db) == 1 else db[-2]
    else:
        k_b = tail_b[-2] if len(tail_b) >= 2 else None
    if differ(k_a, k_b):
        raise Mismatch(
            f"matmul: inner dimensions disagree: {a.label or 'left'} is {show(da)}, "
            f"{b.label or 'right'} is {show(db)} ({show_item(k_a)} != {show_item(k_b)})"
        )
    a_is_vec = var_a is None and len(da) == 1
    b_is_vec = var_b is None and len(db) == 1
    if (var_a is not None and len(tail_a) < 2) or (var_b is not None and len(tail_b) < 2):
        return None  # rank could be 1 or more: the result's layout is not known
    batch_a = () if a_is_vec else da[:-2]
    batch_b = () if b_is_vec else db[:-2]
    batch = broadcast(
        "matmul", [Operand(a.label, TShape(batch_a)), Operand(b.label, TShape(batch_b))]
    )
    if batch is None:
        return None
    rows: tuple[Item, ...] = () if a_is_vec else (da[-2],)
    cols: tuple[Item, ...] = () if b_is_vec else (db[-1],)
    return TShape(batch.dims + rows + cols, dtype)


def _parse_einsum(spec: str, n: int) -> tuple[list[str], str] | None:
    spec = spec.replace(" ", "")
    if "." in spec:
        return None  # ellipses: left to run time
    lhs, arrow, rhs = spec.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != n or not all(s.isalpha() or s == "" for s in [*inputs, rhs]):
        raise Mismatch(f"einsum: spec {spec!r} names {len(inputs)} operands, got {n}")
    if not arrow:
        letters = "".join(inputs)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return inputs, rhs


def einsum(spec: str, operands: list[Operand]) -> TShape | None:
    """``einsum`` with a literal spec: letters must bind consistent sizes.

    Example: ``einsum("bi,oi->bo", [b, 784], [10, 784])`` gives ``[b, 10]``.
    """
    parsed = _parse_einsum(spec, len(operands))
    if parsed is None:
        return None
    inputs, output = parsed
    sizes: dict[str, tuple[Item, Operand]] = {}
    for letters, o in zip(inputs, operands, strict=True):
        if not o.shape.fixed:
            continue
        if len(letters) != len(o.shape.dims):
            raise Mismatch(
                f"einsum: operand {o.describe()} has rank {len(o.shape.dims)} but spec "
                f"{letters!r} names {len(letters)} dims"
            )
        for letter, dim in zip(letters, o.shape.dims, strict=True):
            seen = sizes.get(letter)
            if seen is None or seen[0] is None or seen[0] == 1:
                sizes[letter] = (dim, o)  # size 1 broadcasts in einsum, as in NumPy
            elif dim != 1 and differ(seen[0], dim):
                raise Mismatch(
                    f"einsum: dimension {letter!r} disagrees in {spec.replace(' ', '')!r}: "
                    f"{seen[1].describe()} vs {o.describe()} "
                    f"({show_item(seen[0])} != {show_item(dim)})"
                )
    for c in output:
        if c not in "".join(inputs):
            raise Mismatch(f"einsum: output letter {c!r} of {spec!r} is not in any operand")
    dims: list[Item] = [sizes[c][0] if c in sizes else None for c in output]
    return TShape(tuple(dims), join_dtype(*(o.shape.dtype for o in operands)))


# --- axes, reductions, layout ----------------------------------------------------------------------


def resolve_axis(op: str, x: Operand, axis: int) -> int | None:
    """Position of ``axis`` in ``x.shape.dims``; None when unknown; raises when out of range."""
    prefix, var, suffix = _split(x.shape.dims)
    if var is None:
        rank = len(prefix)
        if not -rank <= axis < rank:
            raise Mismatch(f"{op}: axis {axis} is out of range for {x.describe()} (rank {rank})")
        return axis % rank
    if 0 <= axis < len(prefix):
        return axis
    if axis < 0 and -axis <= len(suffix):
        return len(x.shape.dims) + axis
    return None


def reduce(
    op: str, x: Operand, axes: list[int] | None, keepdims: bool, dtype: str | None
) -> TShape | None:
    """``sum``/``mean``/``max``/... over literal ``axes`` (None: all axes)."""
    if axes is None:
        if not keepdims:
            return TShape((), dtype)
        return TShape(tuple(1 for _ in x.shape.dims), dtype) if x.shape.fixed else None
    positions: set[int] = set()
    for a in axes:
        pos = resolve_axis(op, x, a)
        if pos is None:
            return None
        positions.add(pos)
    dims = [
        1 if i in positions else d
        for i, d in enumerate(x.shape.dims)
        if keepdims or i not in positions
    ]
    return TShape(tuple(dims), dtype)


def transpose(op: str, x: Operand, perm: list[int] | None) -> TShape | None:
    """``x.T`` (perm None reverses) / ``transpose(x, axes)`` / ``x.permute(*axes)``."""
    if not x.shape.fixed:
        return None
    dims = x.shape.dims
    if perm is None:
        return x.shape.with_dims(dims[::-1])
    if len(perm) != len(dims):
        raise Mismatch(f"{op}: {len(perm)} axes given for {x.describe()} (rank {len(dims)})")
    positions = [resolve_axis(op, x, a) for a in perm]
    if len(set(positions)) != len(positions):
        raise Mismatch(f"{op}: repeated axis in {tuple(perm)} for {x.describe()}")
    return x.shape.with_dims([dims[p] for p in positions if p is not None])


def swapaxes(x: Operand, axis1: int, axis2: int) -> TShape | None:
    """``x.swapaxes(a, b)``: two dims exchanged. Works under a variadic segment when both
    axes fall in the known prefix or suffix (``[*batch, t, d].swapaxes(-1, -2)``)."""
    first = resolve_axis("swapaxes", x, axis1)
    second = resolve_axis("swapaxes", x, axis2)
    if first is None or second is None:
        return None
    dims = list(x.shape.dims)
    dims[first], dims[second] = dims[second], dims[first]
    return x.shape.with_dims(dims)


def reshape(x: Operand, target: list[Dim]) -> TShape | None:
    """Reshape to sizes (literal or symbolic); one ``-1`` is solved when the element count allows.

    Example: ``[b, t, c]`` to ``[b * t, c]`` is fine; to ``[b, c]`` raises (``b * t * c`` elements
    cannot become ``b * c``, whatever ``t`` is).
    """
    if sum(1 for d in target if d == -1) > 1:
        raise Mismatch(f"reshape: at most one -1 allowed, got {show(target)}")
    have = sizes.product(x.shape.dims) if x.shape.fixed else None
    want = sizes.product(d for d in target if d != -1)
    if -1 not in target:
        if have is not None and want is not None and differ(have, want):
            raise Mismatch(
                f"reshape: cannot reshape {x.describe()} ({show_item(have)} elements) into "
                f"{show(target)} ({show_item(want)} elements)"
            )
        return TShape(tuple(target), x.shape.dtype)
    solved: Item = None
    if isinstance(have, int) and isinstance(want, int):
        if want == 0 or have % want:
            raise Mismatch(
                f"reshape: cannot reshape {x.describe()} ({have} elements) into {show(target)}"
            )
        solved = have // want
    elif have is not None and want not in (None, 0):
        solved = sizes.floordiv(have, want)
    return TShape(tuple(solved if d == -1 else d for d in target), x.shape.dtype)


def concat(op: str, xs: list[Operand], axis: int, new_axis: bool) -> TShape | None:
    """``concat`` (join along ``axis``) or ``stack`` (``new_axis``: insert a dim of len(xs))."""
    if not xs or not all(o.shape.fixed for o in xs):
        return None
    rank = len(xs[0].shape.dims)
    shown = ", ".join(o.describe() for o in xs)
    if any(len(o.shape.dims) != rank for o in xs):
        raise Mismatch(f"{op}: all inputs need the same rank, got {shown}")
    pos = resolve_axis(op, Operand("", TShape((None,) * (rank + new_axis))), axis)
    assert pos is not None
    out: list[Item] = []
    for i in range(rank):
        column = [o.shape.dims[i] for o in xs]
        if i == pos and not new_axis:
            total: Item = 0
            for d in column:
                total = sizes.add(total, d)
            out.append(total)
            continue
        for d in column[1:]:
            if differ(column[0], d):
                raise Mismatch(f"{op}: inputs disagree at dimension {i}: {shown}")
        known = [d for d in column if d is not None]
        out.append(known[0] if known else None)
    if new_axis:
        out.insert(pos, len(xs))
    return TShape(tuple(out), join_dtype(*(o.shape.dtype for o in xs)))
