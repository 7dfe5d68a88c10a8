"""``speculate_selects``: selects whose arms are safe to compute whatever their condition.

A ``select(c, a, b)`` prints as C's ``c ? a : b``, which evaluates ``a`` only where ``c``
holds. To vectorize such a loop gcc must if-convert it: load under a mask, or prove the
loads safe. It gives up on a loop-invariant load under the condition (gcc 12: "no
vectype for .MASK_LOAD"), and the loop then stays scalar: the softmax backward under a
causal mask (``where(mask, (dP / rowsum + acc) * p, 0)``; ``rowsum`` is invariant in the
inner loop) was one scalar loop per row of every head.

When every value in both arms can be computed for every iteration of the enclosing loops
(each load's index lies in its buffer over the whole ranges of the loop variables, and no
arm converts a float to an integer or divides integers, which C leaves undefined or
traps on), the select is marked ``speculate``: the renderer computes both arms and then
picks one, which gcc turns into a vector blend. Values are unchanged: the arm not picked
is computed and dropped. Only float32/float64 selects are marked (the renderer declares
the arms in the select's own type).
"""

from __future__ import annotations

from dataclasses import replace

from shapegrad.compiler import loops as L

_COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or"})


def speculate_selects(program: L.Program) -> L.Program:
    """Mark the selects of ``program`` whose arms are safe to compute (module docstring)."""
    sizes = {name: spec.size for name, spec in program.buffers.items()}
    for kernel in program.kernels:
        statements = list(L.walk(kernel.body))
        if any(isinstance(s, L.BatchFused | L.LayerLoop) for s in statements):
            continue  # slice-relative scratch addressing; bodies are programs of their own
        known = dict(sizes)
        known.update({s.name: s.size for s in statements if isinstance(s, L.Local)})
        data_vars = {s.var for s in statements if isinstance(s, L.IndexLoad)}

        def mark(e: L.Expr, known: dict[str, int] = known, data: set[L.Var] = data_vars) -> L.Expr:
            if not isinstance(e, L.Select) or e.speculate:
                return e
            if e.dtype.name not in ("float32", "float64"):
                return e
            if _safe(e.a, known, data) and _safe(e.b, known, data):
                return replace(e, speculate=True)
            return e

        kernel.body = L.map_body(kernel.body, mark)
    return program


def _safe(e: L.Expr, sizes: dict[str, int], data_vars: set[L.Var]) -> bool:
    """Whether ``e`` can be computed for every value of the loop variables."""
    if isinstance(e, L.Const | L.Ref | L.IndexValue | L.InRange | L.Random):
        return True
    if isinstance(e, L.Load):
        size = sizes.get(e.buffer)
        if size is None or any(_uses(atom, data_vars) for atom in e.index.atoms()):
            return False
        lo, hi = e.index.bounds()
        return lo >= 0 and hi < size
    if isinstance(e, L.Unary):
        return _safe(e.x, sizes, data_vars)
    if isinstance(e, L.Cast):
        if not e.dtype.is_float and e.x.dtype.is_float:
            return False  # float -> int of an out-of-range value is undefined in C
        return _safe(e.x, sizes, data_vars)
    if isinstance(e, L.Binary):
        if not e.dtype.is_float and e.op not in _COMPARISONS:
            return False  # integer division by zero traps, overflow is undefined
        return _safe(e.a, sizes, data_vars) and _safe(e.b, sizes, data_vars)
    if isinstance(e, L.Select):
        return all(_safe(x, sizes, data_vars) for x in (e.cond, e.a, e.b))
    return False


def _uses(atom: L.Var | L.DivMod, data_vars: set[L.Var]) -> bool:
    """Whether an index atom depends on a variable read from data (``IndexLoad``)."""
    if isinstance(atom, L.Var):
        return atom in data_vars
    return any(_uses(a, data_vars) for a in atom.inner.atoms())
