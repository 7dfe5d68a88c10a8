"""Matching a value's shape against an annotation, and instantiating a callee's named dims.

``compare`` answers "is this value certainly not of that annotated shape?" (for
returns and annotated assignments, where the annotation's names are rigid).
``Binder`` matches argument shapes against a callee's parameter annotations,
binding the callee's names to the caller's dims, like solving type variables.
"""

from __future__ import annotations

from . import sizes
from .algebra import Mismatch, differ
from .spec import Expr, Item, Sym, TShape, Var, show, show_item


def _split(dims: tuple[Item, ...]) -> tuple[tuple[Item, ...], Var | None, tuple[Item, ...]]:
    for i, d in enumerate(dims):
        if isinstance(d, Var):
            return dims[:i], d, dims[i + 1 :]
    return dims, None, ()


def _pairs(got: tuple[Item, ...], want: tuple[Item, ...]) -> list[tuple[int, Item, Item]] | str:
    """Aligned (position, got, want) dims that must agree, or a rank complaint."""
    g_pre, g_var, g_suf = _split(got)
    w_pre, w_var, w_suf = _split(want)
    if g_var is None and w_var is None:
        if len(got) != len(want):
            return f"rank {len(got)} != {len(want)}"
        return [(i, a, b) for i, (a, b) in enumerate(zip(got, want, strict=True))]
    if w_var is None and g_var is not None and len(g_pre) + len(g_suf) > len(want):
        return f"rank at least {len(g_pre) + len(g_suf)} != {len(want)}"
    if g_var is None and w_var is not None and len(got) < len(w_pre) + len(w_suf):
        return f"rank {len(got)} < {len(w_pre) + len(w_suf)}"
    pairs = [
        (i, a, b)
        for i, (a, b) in enumerate(
            zip(g_pre if g_var else got, w_pre if w_var else want, strict=False)
        )
    ]
    g_tail = g_suf if g_var else got
    w_tail = w_suf if w_var else want
    n = min(len(g_tail), len(w_tail))
    pairs += [(-k, g_tail[-k], w_tail[-k]) for k in range(1, n + 1)]
    return pairs


def compare(got: TShape, want: TShape) -> str | None:
    """Why ``got`` certainly does not fit ``want`` (e.g. ``"dimension 1: 784 != 10"``), or None."""
    pairs = _pairs(got.dims, want.dims)
    if isinstance(pairs, str):
        return pairs
    for pos, a, b in pairs:
        if differ(a, b):
            return f"dimension {pos}: {show_item(a)} != {show_item(b)}"
    if got.dtype and want.dtype and got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    return None


class Binder:
    """Binds a callee's named dims (its rigid names) to the caller's dims, argument by argument.

    Example: matching ``[32, 784]`` against ``[b, 784]`` binds ``b`` to 32; a later
    ``[64]`` against ``[b]`` raises :class:`Mismatch`.
    """

    def __init__(self, callee: str, fresh: str | None = None) -> None:
        self.callee = callee
        # Scope of the fresh dims a return annotation names but no argument binds (an
        # opaque size per call site: equal to itself, never known to differ); None: unknown.
        self.fresh = fresh
        # Keyed by name: within one signature a name is one dim, written there or via an alias.
        self.dims: dict[str, tuple[Item, str]] = {}
        self.runs: dict[str, tuple[tuple[Item, ...], str]] = {}

    def match(self, label: str, got: TShape, want: TShape, parameter: str | None = None) -> None:
        """Match one argument; raises :class:`Mismatch` naming the argument and the dim.

        ``parameter`` is the callee's name for it when the argument is called otherwise
        (``loss: argument ys for parameter x ...``: swapped arguments read plainly).
        """
        pairs = _pairs(got.dims, want.dims)
        shown = label if parameter in (None, label) else f"{label} for parameter {parameter}"
        head = f"{self.callee}: argument {shown} has shape {show(got.dims)}, expected {show(want.dims)}"
        if isinstance(pairs, str):
            raise Mismatch(f"{head} ({pairs})")
        for pos, a, b in pairs:
            if isinstance(b, Sym):
                self._bind(b, a, label)
                continue
            if isinstance(b, Expr):  # `3*c`: compared once its names are bound
                b = sizes.substitute(b, self._bound)
            if differ(a, b):
                raise Mismatch(f"{head} (dimension {pos}: {show_item(a)} != {show_item(b)})")
        if got.dtype and want.dtype and got.dtype != want.dtype:
            raise Mismatch(f"{self.callee}: argument {label} is {got.dtype}, expected {want.dtype}")
        self._bind_run(label, got, want)

    def _bound(self, name: Sym) -> Item:
        seen = self.dims.get(name.name)
        return seen[0] if seen is not None else None

    def _bound_or_fresh(self, name: Sym) -> Item:
        seen = self.dims.get(name.name)
        if seen is not None:
            return seen[0]
        return Sym(name.name, self.fresh) if self.fresh is not None else None

    def _bind(self, name: Sym, dim: Item, label: str) -> None:
        self.bind_size(name.name, dim, label)

    def bind_size(self, name: str, dim: Item, label: str) -> None:
        """Bind dim ``name`` to ``dim`` (from argument ``label``); a different earlier size raises."""
        if dim is None or isinstance(dim, Var):
            return
        seen = self.dims.get(name)
        if seen is None:
            self.dims[name] = (dim, label)
        elif differ(seen[0], dim):
            raise Mismatch(
                f"{self.callee}: dimension {name!r} is {show_item(seen[0])} in "
                f"{seen[1]} but {show_item(dim)} in {label}"
            )

    def _bind_run(self, label: str, got: TShape, want: TShape) -> None:
        w_pre, w_var, w_suf = _split(want.dims)
        if w_var is None or w_var.name is None or not got.fixed:
            return
        run = got.dims[len(w_pre) : len(got.dims) - len(w_suf)]
        seen = self.runs.get(w_var.name)
        if seen is None:
            self.runs[w_var.name] = (run, label)
            return
        if len(seen[0]) != len(run) or any(differ(a, b) for a, b in zip(seen[0], run, strict=True)):
            raise Mismatch(
                f"{self.callee}: dims *{w_var.name} are {show(seen[0])} in {seen[1]} "
                f"but {show(run)} in {label}"
            )

    def substitute(self, shape: TShape) -> TShape:
        """The callee's annotated shape in the caller's terms; unbound names become fresh dims."""
        out: list[Item] = []
        for d in shape.dims:
            if isinstance(d, Sym):
                out.append(self._bound_or_fresh(d))
            elif isinstance(d, Expr):
                out.append(sizes.substitute(d, self._bound_or_fresh))
            elif isinstance(d, Var):
                run = self.runs.get(d.name) if d.name else None
                out.extend(run[0] if run else (Var(None, ""),))
            else:
                out.append(d)
        if sum(isinstance(d, Var) for d in out) > 1:
            return TShape((Var(None, ""),), shape.dtype)  # two runs: only the dtype is known
        return TShape(tuple(out), shape.dtype)
