"""Collapse perfectly nested loops whose accesses line up (a loop stage, ``collapse_loops``).

``for i in [0, A): for j in [0, B): body`` becomes ``for k in [0, A*B): body'`` when every
index expression of ``body`` either leaves ``i`` and ``j`` out or holds them as ``c*(B*i +
j)`` only (``coef(i) == B * coef(j)``, neither inside a floordiv/mod); ``body'`` has ``B*i
+ j`` replaced by ``k``. ``k`` enumerates the ``(i, j)`` pairs in the same order, so every
element sees the same operations in the same order. Applied bottom-up, so a whole
contiguous nest (``n, c, h, w`` of an elementwise kernel over NCHW) becomes one loop.

Why: a 28x28 image's inner loop is 28 wide, so the C compiler gives every row a 16-lane
vector part, an 8-lane part and a scalar tail (and a reduction a per-row lane sum); one
loop of 784 runs whole vectors. The same rule merges adjacent variables of a
:class:`~shapegrad.compiler.loops.Reduce` (``mean`` over ``H, W``).

Refused: loops of different kinds, segments (``start``/``stop`` set), an outer body
holding anything besides the inner loop (per-row scratch, a row's accumulator store), a
body with statements other than loops, stores, reductions, locals and index loads
(products, batch-fused parts, sorts, collectives: they have their own loop structure), a
range test (``InRange``) on ``i`` or ``j`` (a pad or a strided slice: those split by
index sets instead), and any index that does not line up (a transpose, a stride, a
broadcast along one of the two). Inside a batch-fused product's nests the outer loop
(fixed to the batch index by the renderer) stays; what it holds collapses. Float sums long enough to be summed in blocks
(``Tuning.blocked_sum_min``) keep their variables: their blocks follow the variables.
"""

from __future__ import annotations

from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.target import Target

_ALLOWED = (L.Loop, L.Store, L.Reduce, L.Local, L.IndexLoad)


def collapse_loops(program: L.Program, target: Target) -> L.Program:
    """Collapse every lined-up pair of nested loops (and of reduction variables) in
    ``program``'s kernels, in place; returns ``program``."""
    limit = target.tuning.blocked_sum_min
    for kernel in program.kernels:
        if not _subtracts_itself(kernel.body):
            kernel.body = tuple(_stmt(s, limit) for s in kernel.body)
    return program


def _subtracts_itself(body: tuple[L.Stmt, ...]) -> bool:
    """Whether ``body`` computes ``e - e`` (e.g. a mean over an axis of size 1, which is
    the value itself). Such kernels stay as they are: gcc's ``-fno-signed-zeros
    -fassociative-math`` folds ``x - x`` to 0 when it sees both loads are one (DESIGN debt
    3), and the collapsed loop's single index let it see that, so a NaN or inf turned into
    0 (the numerics fuzzer, seed 5008: ``layer_norm`` over a size-1 axis)."""
    return any(
        isinstance(e, L.Binary) and e.op == "sub" and e.a == e.b
        for root in L.all_expressions(body)
        for e in L.walk_expr(root)
    )


def _stmt(s: L.Stmt, limit: int) -> L.Stmt:
    if isinstance(s, L.Loop):
        loop = replace(s, body=tuple(_stmt(x, limit) for x in s.body))
        while (merged := collapse_pair(loop)) is not None:
            loop = merged
        return loop
    if isinstance(s, L.Reduce):
        return collapse_reduce(s, limit)
    if isinstance(s, L.BatchFused):  # each nest's outer loop is fixed to the batch index
        producer = tuple(_inside(nest, limit) for nest in s.producer)
        consumer = tuple(_inside(nest, limit) for nest in s.consumer)
        return replace(s, producer=producer, consumer=consumer)
    return s


def _inside(nest: L.Loop, limit: int) -> L.Loop:
    """``nest`` with what is inside its outer loop collapsed (the loop itself kept)."""
    return replace(nest, body=tuple(_stmt(x, limit) for x in nest.body))


def collapse_pair(outer: L.Loop) -> L.Loop | None:
    """``outer`` and the loop that is its whole body as one loop, or None when refused."""
    if len(outer.body) != 1 or not isinstance(outer.body[0], L.Loop):
        return None
    inner = outer.body[0]
    if outer.kind != inner.kind or not (_whole(outer) and _whole(inner)):
        return None
    i, j = outer.var, inner.var
    if not all(isinstance(s, _ALLOWED) for s in L.walk(inner.body)):
        return None
    if not all(_lines_up(a, i, j) for a in L.indices_in(inner.body)):
        return None
    if any(_tests_range(s, (i, j)) for s in L.walk(inner.body)):
        return None
    k = L.Var(f"{i.name}_{j.name}", i.extent * j.extent)
    body = _substitute_body(inner.body, i, j, k)
    return L.Loop(k, outer.kind, body)


def collapse_reduce(r: L.Reduce, limit: int) -> L.Reduce:
    """``r`` with each lined-up pair of adjacent variables merged into one."""
    n = 1
    for v in r.vars:
        n *= v.extent
    if r.op == "add" and r.value.dtype.is_float and n >= limit:
        return r  # summed in blocks along its variables (cstyle.sum_blocks): keep them
    merged = True
    while merged:
        merged = False
        for t in range(len(r.vars) - 1):
            i, j = r.vars[t], r.vars[t + 1]
            indices = [a for e in L.walk_expr(r.value) if (a := L.expr_index(e)) is not None]
            ranged = any(
                isinstance(e, L.InRange) and _mentions(e.index, (i, j))
                for e in L.walk_expr(r.value)
            )
            if ranged or not all(_lines_up(a, i, j) for a in indices):
                continue
            k = L.Var(f"{i.name}_{j.name}", i.extent * j.extent)
            value = L.map_expr(r.value, _substituter(i, j, k))
            r = replace(r, vars=(*r.vars[:t], k, *r.vars[t + 2 :]), value=value)
            merged = True
            break
    return r


# --- the rule ------------------------------------------------------------------------------


def _whole(loop: L.Loop) -> bool:
    return loop.start == 0 and loop.end == loop.var.extent


def _lines_up(a: L.Affine, i: L.Var, j: L.Var) -> bool:
    """``i`` and ``j`` occur in ``a`` only as ``c * (extent(j) * i + j)``."""
    for atom in a.atoms():
        if isinstance(atom, L.DivMod) and _mentions(atom.inner, (i, j)):
            return False
    return a.coef(i) == j.extent * a.coef(j)


def _mentions(a: L.Affine, vs: tuple[L.Var, ...]) -> bool:
    return any(L.mentions(a, v) for v in vs)


def _tests_range(s: L.Stmt, vs: tuple[L.Var, ...]) -> bool:
    return any(
        isinstance(e, L.InRange) and _mentions(e.index, vs)
        for root in L.expressions(s)
        for e in L.walk_expr(root)
    )


# --- the substitution ----------------------------------------------------------------------


def _substitute(a: L.Affine, i: L.Var, j: L.Var, k: L.Var) -> L.Affine:
    """``a`` (lined up) with ``extent(j)*i + j`` replaced by ``k``."""
    c = a.coef(j)
    if c == 0:
        return a
    return a + L.var(i) * (-j.extent * c) + L.var(j) * (-c) + L.var(k) * c


def _substitute_expr(e: L.Expr, i: L.Var, j: L.Var, k: L.Var) -> L.Expr:
    if isinstance(e, L.Load | L.IndexValue | L.InRange):
        return replace(e, index=_substitute(e.index, i, j, k))
    if isinstance(e, L.Random):
        return replace(e, counter=_substitute(e.counter, i, j, k))
    return e


def _substituter(i: L.Var, j: L.Var, k: L.Var) -> L.ExprFn:
    return lambda e: _substitute_expr(e, i, j, k)


def _substitute_body(body: tuple[L.Stmt, ...], i: L.Var, j: L.Var, k: L.Var) -> tuple[L.Stmt, ...]:
    def stmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.Store | L.IndexLoad):
            return replace(s, index=_substitute(s.index, i, j, k))
        return s

    return L.map_body(body, _substituter(i, j, k), stmt)
