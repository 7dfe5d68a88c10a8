"""Loop fusion: back-to-back elementwise kernels over the same index space become one loop.

Fusion (``compiler/fusion.py``) decides which values get a buffer; a value that several
kernels read (GELU's ``tanh``, kept for the backward pass; an optimizer's new moment,
read by the parameter update) gets its own kernel, and every kernel that reads it
streams it back from memory. When such kernels run one after the other over the same
index space, :func:`fuse_elementwise_kernels` merges them into one loop nest whose body
holds all their stores in order: each element is stored and, in the same iteration,
read back by the next statement (the C compiler keeps it in a register), so the data
crosses memory once instead of once per kernel. AdamW's moment and parameter updates
become one pass per parameter (:func:`hoist_to_producers` first moves each parameter
update up to its moments), GELU's forward and backward one pass each.

Merging is exact (same statements, same order per element) when every buffer written by
the merged kernels is only ever accessed at one index expression: then iteration ``p``
of the merged loop touches exactly the elements that iteration ``p`` of each original
loop touched, and no other iteration touches them. Loads of buffers nobody in the
group writes may use any index (broadcast biases, gathers of earlier results).

A merged loop may then store temps that no other kernel touches (the intermediate
products of GELU's backward, materialized only because several kernels read them):
:func:`forward_private_temps` replaces their loads by the stored expression and drops
the store and the buffer, so they never reach memory.
"""

from __future__ import annotations

import math
from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.target import Tuning

# The group size and the size of a forwarded expression are ``Tuning.fuse_max_group`` and
# ``Tuning.fuse_max_forwarded_nodes`` (``compiler/target.py``).
_DEFAULT = Tuning()


def _nest(kernel: L.Kernel) -> tuple[list[L.Var], tuple[L.Store, ...]] | None:
    """(loop variables outermost first, stores) of a plain parallel nest of plain stores."""
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], L.Loop):
        return None
    vars_: list[L.Var] = []
    body: tuple[L.Stmt, ...] = kernel.body
    while len(body) == 1 and isinstance(body[0], L.Loop):
        loop = body[0]
        if loop.kind != "parallel":
            return None
        vars_.append(loop.var)
        body = loop.body
    if not body or not all(isinstance(s, L.Store) and s.accumulate is None for s in body):
        return None
    return vars_, tuple(s for s in body if isinstance(s, L.Store))


def substitute(a: L.Affine, mapping: dict[L.Var, L.Affine]) -> L.Affine:
    """``a`` with each variable in ``mapping`` replaced by its affine value."""
    out = L.const(a.const)
    for atom, coef in a.terms:
        if isinstance(atom, L.Var):
            out = out + mapping.get(atom, L.var(atom)) * coef
        else:
            inner = substitute(atom.inner, mapping)
            part = L.mod(inner, atom.divisor) if atom.is_mod else L.floordiv(inner, atom.divisor)
            out = out + part * coef
    return out


def rebind(body: tuple[L.Stmt, ...], mapping: dict[L.Var, L.Affine]) -> tuple[L.Stmt, ...]:
    """``body`` with loop variables replaced (indices, iota values, ranges, random
    counters, store indices); the row-fusion stage uses it too."""

    def expr(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Load | L.IndexValue | L.InRange):
            return replace(e, index=substitute(e.index, mapping))
        if isinstance(e, L.Random):
            return replace(e, counter=substitute(e.counter, mapping))
        return e

    def stmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.Store):
            return replace(s, index=substitute(s.index, mapping))
        return s

    return L.map_body(body, expr, stmt)


def _rebind(stores: tuple[L.Store, ...], mapping: dict[L.Var, L.Affine]) -> tuple[L.Store, ...]:
    """``stores`` with their loop variables replaced."""
    out = []
    for s in rebind(stores, mapping):
        assert isinstance(s, L.Store)
        out.append(s)
    return tuple(out)


def _align(
    space: list[L.Var], other: list[L.Var], stores: tuple[L.Store, ...]
) -> tuple[L.Store, ...] | None:
    """``stores`` (a nest over ``other``) rewritten over the variables ``space``, or None."""
    extents = [v.extent for v in space]
    if [v.extent for v in other] == extents:
        return _rebind(stores, {o: L.var(v) for o, v in zip(other, space, strict=True)})
    if len(other) == 1 and other[0].extent == math.prod(extents):
        flat = L.flatten(tuple(L.var(v) for v in space), tuple(extents))
        return _rebind(stores, {other[0]: flat})
    return None



def _single_index(stores: tuple[L.Store, ...]) -> bool:
    """Every written buffer is stored and loaded at one index expression only."""
    written = {s.buffer for s in stores}
    index: dict[str, L.Affine] = {}
    accesses = [(s.buffer, s.index) for s in stores]
    accesses += [(ld.buffer, ld.index) for ld in L.loads_in(stores)]
    for buffer, ix in accesses:
        if buffer in written and index.setdefault(buffer, ix) != ix:
            return False
    return True


def _merge(a: L.Kernel, b: L.Kernel) -> L.Kernel | None:
    nest_a, nest_b = _nest(a), _nest(b)
    if nest_a is None or nest_b is None:
        return None
    (vars_a, stores_a), (vars_b, stores_b) = nest_a, nest_b
    if len(vars_a) >= len(vars_b):  # keep the multi-axis nest: its indices need no div/mod
        space, moved = vars_a, _align(vars_a, vars_b, stores_b)
        stores = None if moved is None else stores_a + moved
    else:
        space, moved = vars_b, _align(vars_b, vars_a, stores_a)
        stores = None if moved is None else moved + stores_b
    if stores is None or not _single_index(stores):
        return None
    body: tuple[L.Stmt, ...] = stores
    for v in reversed(space):
        body = (L.Loop(v, "parallel", body),)
    inlined = a.inlined + [n for n in b.inlined if n not in a.inlined]
    return L.Kernel(a.name, body, a.work + b.work, f"{a.root} + {b.root}", inlined)


def fuse_elementwise_kernels(program: L.Program, tuning: Tuning = _DEFAULT) -> L.Program:
    """Merge runs of adjacent elementwise kernels over one index space (module docstring).

    Example:
        >>> fuse_elementwise_kernels(program)   # k27, k28, k29 (GELU) -> one loop nest
    """
    hoist_to_producers(program)
    fused: list[L.Kernel] = []
    group = 0
    for kernel in program.kernels:
        merged = _merge(fused[-1], kernel) if fused and 0 < group < tuning.fuse_max_group else None
        if merged is not None:
            fused[-1] = merged
            group += 1
        else:
            fused.append(kernel)
            group = 1 if _nest(kernel) is not None else 0
    program.kernels = fused
    forward_private_temps(program, tuning)
    return program


def hoist_to_producers(program: L.Program) -> L.Program:
    """A kernel updating state (parameters, optimizer moments) in place moves up to just
    after the last kernel it depends on, when that kernel is one it can merge with:
    AdamW's parameter update (traced after every moment update) joins its own moment
    update, one pass per parameter instead of two.

    Exact: nothing between the two positions writes what the kernel reads or touches
    what it writes, so it computes the same values earlier. Kernels with index checks
    are never crossed (a failing check skips the rest of the step, which must not then
    include an update that ran early)."""
    kernels = program.kernels
    access = [(L.reads(k.body), L.writes(k.body)) for k in kernels]
    j = 0
    while j < len(kernels):
        kernel = kernels[j]
        reads, writes = access[j]
        if _nest(kernel) is None or any(program.buffers[w].kind != "state" for w in writes):
            j += 1  # only state updates move: moving other work changed what the row and
            continue  # loop fusion stages merged, and cost a layer loop's body 2.5 ms
        i = j - 1
        while i >= 0:
            r, w = access[i]
            checks = any(isinstance(s, L.CheckBounds) for s in L.walk(kernels[i].body))
            if checks or reads & w or writes & (r | w):
                break
            i -= 1
        if 0 <= i < j - 1 and _merge(kernels[i], kernel) is not None:
            kernels.insert(i + 1, kernels.pop(j))
            access.insert(i + 1, access.pop(j))
        j += 1
    return program


def forward_private_temps(program: L.Program, tuning: Tuning = _DEFAULT) -> L.Program:
    """Temps stored and read inside one merged loop only become inline expressions."""
    users: dict[str, int] = {}
    for kernel in program.kernels:
        for name in L.reads(kernel.body) | L.writes(kernel.body):
            users[name] = users.get(name, 0) + 1
    outputs = set(program.outputs)
    for n, kernel in enumerate(program.kernels):
        nest = _nest(kernel)
        if nest is None or len(nest[1]) < 2:
            continue
        vars_, stores = nest
        private = {
            s.buffer
            for s in stores
            if users.get(s.buffer) == 1
            and s.buffer not in outputs
            and program.buffers[s.buffer].kind == "temp"
        }
        kept = _forward(stores, private, tuning.fuse_max_forwarded_nodes)
        if len(kept) == len(stores):
            continue
        body: tuple[L.Stmt, ...] = kept
        for v in reversed(vars_):
            body = (L.Loop(v, "parallel", body),)
        program.kernels[n] = replace(kernel, body=body)
        for name in {s.buffer for s in stores} - {s.buffer for s in kept}:
            del program.buffers[name]
    return program


def _forward(stores: tuple[L.Store, ...], private: set[str], max_nodes: int) -> tuple[L.Store, ...]:
    """``stores`` with private temps substituted into later stores (within a size bound)."""
    values: dict[str, L.Expr] = {}

    def inline(e: L.Expr) -> L.Expr:
        return values[e.buffer] if isinstance(e, L.Load) and e.buffer in values else e

    kept: list[L.Store] = []
    for n, s in enumerate(stores):
        value = L.map_expr(s.value, inline)
        # a value reading a buffer that a later statement overwrites (an optimizer moment
        # updated in place) would read the new contents where it is substituted: kept
        later = {x.buffer for x in stores[n + 1 :]}
        reads = {e.buffer for e in L.walk_expr(value) if isinstance(e, L.Load)}
        if (
            s.buffer in private
            and not reads & later
            and sum(1 for _ in L.walk_expr(value)) <= max_nodes
        ):
            values[s.buffer] = value  # every access uses s.index (checked when merging)
            continue
        kept.append(replace(s, value=value))
    if not kept:  # nothing left to compute: keep the last store (never happens for temps
        return stores  # nobody reads, which dead-code elimination already removed)
    return tuple(kept)
