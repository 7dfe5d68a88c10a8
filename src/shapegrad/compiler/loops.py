"""The loop IR: a backend-neutral program of kernels, each a loop nest over an index space.

Lowering (``compiler/lower.py``) produces it, renderers (C today, CUDA later)
consume it unchanged. Nothing here knows about C: there are no pointers,
pragmas or types spelled in a target language.

* **Index expressions** (:class:`Affine`) are integer sums ``c0 + c1*v1 + ...``
  over *atoms*: loop variables, and ``floordiv``/``mod`` of an affine (only
  reshapes of non-contiguous views need those; ``simplify`` removes them
  whenever a variable's range makes them redundant).
* **Scalar expressions** (:class:`Expr` subclasses) compute one element:
  loads, constants, unary/binary ops, selects, casts, counters for iota and
  random numbers.
* **Statements**: :class:`Loop` (``parallel`` or ``reduction``), :class:`Store`
  (optionally accumulating into memory), :class:`Declare`/:class:`Accumulate`
  (a scalar accumulator initialised to the neutral element),
  :class:`IndexLoad` (a data-dependent index, used by gather/scatter),
  :class:`CheckBounds` (fail with an error code instead of reading out of
  range) and :class:`Contract` (a matrix-multiply library call).

Every node prints itself; ``Program.format()`` is what ``SHAPEGRAD_DEBUG``
writes to ``<name>.loops.txt``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from shapegrad.dtypes import DType, bool_, int32

# ---------------------------------------------------------------------------
# Integer index expressions
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A loop variable ranging over ``[0, extent)``."""

    name: str
    extent: int

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DivMod:
    """``inner // divisor`` (``is_mod=False``) or ``inner % divisor`` (``is_mod=True``)."""

    inner: Affine
    divisor: int
    is_mod: bool

    def __str__(self) -> str:
        return f"(({self.inner}) {'%' if self.is_mod else '/'} {self.divisor})"


Atom = Var | DivMod


@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * atom)``; terms are kept sorted and free of zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(atom: Atom, coef: int = 1) -> Affine:
        return Affine(((atom, coef),), 0) if coef else Affine()

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        coefs: dict[Atom, int] = dict(self.terms)
        for atom, coef in other.terms:
            coefs[atom] = coefs.get(atom, 0) + coef
        return _make(coefs, self.const + other.const)

    def __mul__(self, k: int) -> Affine:
        if k == 0:
            return Affine()
        return Affine(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def bounds(self) -> tuple[int, int]:
        """Inclusive ``(min, max)`` over all loop-variable values."""
        lo = hi = self.const
        for atom, coef in self.terms:
            a_lo, a_hi = _atom_bounds(atom)
            lo += min(coef * a_lo, coef * a_hi)
            hi += max(coef * a_lo, coef * a_hi)
        return lo, hi

    def coef(self, var: Var) -> int:
        """Coefficient of ``var`` as a direct term (0 when absent or only inside div/mod)."""
        return dict(self.terms).get(var, 0)

    def atoms(self) -> Iterator[Atom]:
        return (a for a, _ in self.terms)

    def __str__(self) -> str:
        parts = [str(a) if c == 1 else f"{c}*{a}" for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def _key(atom: Atom) -> str:
    return str(atom)


def _make(coefs: dict[Atom, int], const: int) -> Affine:
    terms = tuple(sorted(((a, c) for a, c in coefs.items() if c), key=lambda t: _key(t[0])))
    return Affine(terms, const)


def _atom_bounds(atom: Atom) -> tuple[int, int]:
    if isinstance(atom, Var):
        return 0, max(atom.extent - 1, 0)
    lo, hi = atom.inner.bounds()
    if atom.is_mod:
        return (0, atom.divisor - 1) if lo < 0 or hi >= atom.divisor else (lo, hi)
    return lo // atom.divisor, hi // atom.divisor


def var(v: Var) -> Affine:
    """The affine expression ``v``."""
    return Affine.of(v)


def const(c: int) -> Affine:
    """The constant affine expression ``c``."""
    return Affine((), c)


def floordiv(a: Affine, d: int) -> Affine:
    """``a // d`` simplified: terms divisible by ``d`` come out when the rest stays in ``[0, d)``."""
    if d == 1:
        return a
    whole, rest = _split(a, d)
    lo, hi = rest.bounds()
    if lo >= 0 and hi < d:
        return whole
    return whole + Affine.of(DivMod(rest, d, False))


def mod(a: Affine, d: int) -> Affine:
    """``a % d`` simplified the same way as :func:`floordiv`."""
    if d == 1:
        return Affine()
    _, rest = _split(a, d)
    lo, hi = rest.bounds()
    if lo >= 0 and hi < d:
        return rest
    return Affine.of(DivMod(rest, d, True))


def _split(a: Affine, d: int) -> tuple[Affine, Affine]:
    """``a = d*whole + rest`` with every coefficient of ``whole`` integral."""
    whole: dict[Atom, int] = {}
    rest: dict[Atom, int] = {}
    for atom, coef in a.terms:
        if coef % d == 0:
            whole[atom] = coef // d
        else:
            rest[atom] = coef
    c_whole = a.const // d
    return _make(whole, c_whole), _make(rest, a.const - c_whole * d)


def flatten(index: tuple[Affine, ...], shape: tuple[int, ...]) -> Affine:
    """Row-major flat offset of a multi-index."""
    flat = Affine()
    stride = 1
    for ix, size in zip(reversed(index), reversed(shape), strict=True):
        flat = flat + ix * stride
        stride *= size
    return flat


def unflatten(flat: Affine, shape: tuple[int, ...]) -> tuple[Affine, ...]:
    """Row-major multi-index of a flat offset (div/mod simplified away where possible)."""
    if 0 in shape:  # an empty tensor: no element is ever addressed
        return tuple(const(0) for _ in shape)
    out: list[Affine] = []
    stride = 1
    strides = []
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    for size, st in zip(shape, reversed(strides), strict=True):
        out.append(mod(floordiv(flat, st), size) if size > 1 else const(0))
    return tuple(out)


# ---------------------------------------------------------------------------
# Scalar expressions
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """Base of scalar expressions; ``dtype`` is the element type of the value."""

    dtype: DType


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Load(Expr):
    buffer: str
    index: Affine

    def __str__(self) -> str:
        return f"{self.buffer}[{self.index}]"


@dataclass(frozen=True)
class Ref(Expr):
    """A scalar local (accumulator) by name."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # neg exp log sin cos sqrt tanh abs
    x: Expr

    def __str__(self) -> str:
        return f"{self.op}({self.x})"


@dataclass(frozen=True)
class Binary(Expr):
    op: str  # add sub mul div pow max min lt le eq ne and
    a: Expr
    b: Expr

    def __str__(self) -> str:
        return f"{self.op}({self.a}, {self.b})"


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    def __str__(self) -> str:
        return f"select({self.cond}, {self.a}, {self.b})"


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr

    def __str__(self) -> str:
        return f"{self.dtype.name}({self.x})"


@dataclass(frozen=True)
class IndexValue(Expr):
    """The integer value of an index expression (iota)."""

    index: Affine

    def __str__(self) -> str:
        return f"index({self.index})"


@dataclass(frozen=True)
class InRange(Expr):
    """``lo <= index < hi`` (pads and concatenation)."""

    index: Affine
    lo: int
    hi: int

    def __str__(self) -> str:
        return f"({self.lo} <= {self.index} < {self.hi})"


@dataclass(frozen=True)
class Random(Expr):
    """Counter-based uniform [0, 1): murmur3 finaliser of ``counter + seed * golden``."""

    counter: Affine
    seed: int

    def __str__(self) -> str:
        return f"random({self.counter}, seed={self.seed})"


def bool_const(value: bool) -> Const:
    return Const(bool_, value)


def int_const(value: int) -> Const:
    return Const(int32, value)


def walk_expr(e: Expr) -> Iterator[Expr]:
    """``e`` and every sub-expression, pre-order."""
    yield e
    for child in _children(e):
        yield from walk_expr(child)


def _children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


# ---------------------------------------------------------------------------
# Statements, kernels, programs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stmt:
    """Base of statements."""


@dataclass(frozen=True)
class Loop(Stmt):
    """``for var in [0, var.extent)``; ``kind`` is ``"parallel"`` (iterations independent)
    or ``"reduction"`` (iterations accumulate into the same location, run in order)."""

    var: Var
    kind: str
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[index] = value``, or ``buffer[index] op= value`` when ``accumulate`` is set."""

    buffer: str
    index: Affine
    value: Expr
    accumulate: str | None = None  # "add" | "max"


@dataclass(frozen=True)
class Local(Stmt):
    """A scratch array ``name[size]`` private to one iteration of the enclosing loops
    (a stack array in C, registers/shared memory on a GPU); Load/Store address it by name."""

    name: str
    dtype: DType
    size: int


@dataclass(frozen=True)
class Declare(Stmt):
    """A scalar local initialised to ``init`` (the neutral element for an accumulator)."""

    name: str
    init: Expr


@dataclass(frozen=True)
class Accumulate(Stmt):
    """``name = op(name, value)``; ``op`` is ``"add"`` or ``"max"``."""

    name: str
    op: str
    value: Expr


@dataclass(frozen=True)
class IndexLoad(Stmt):
    """``var = buffer[index]``, wrapped once by ``+extent`` when negative (NumPy indexing).

    Bounds were verified by an earlier :class:`CheckBounds` over the whole buffer.
    """

    var: Var
    buffer: str
    index: Affine


@dataclass(frozen=True)
class CheckBounds(Stmt):
    """Fail the program with ``code`` if any of ``buffer[0:size]`` is outside ``[-n, n)``."""

    buffer: str
    size: int
    n: int
    code: int


@dataclass(frozen=True)
class Contract(Stmt):
    """``c[b] = sum_s op(a[b, s]) @ op(b[b, s])`` for each batch ``b`` (row-major matrices).

    ``a`` is ``m x k`` (``k x m`` when ``trans_a``), ``b`` is ``k x n`` (``n x k`` when
    ``trans_b``), ``c`` is ``m x n``; strides are in elements. ``s`` ranges over
    ``sum_batch`` (summed letters that cannot join ``k``, e.g. the batch axis of a
    convolution's weight gradient).
    """

    a: str
    b: str
    c: str
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    lda: int
    ldb: int
    offset_a: int
    offset_b: int
    batch: int
    stride_a: int
    stride_b: int
    stride_c: int
    dtype: DType
    sum_batch: int = 1
    sum_stride_a: int = 0
    sum_stride_b: int = 0
    # ``c = alpha * product + beta * c`` (beta 1: accumulate into c, e.g. an SGD update)
    alpha: float = 1.0
    beta: float = 0.0


@dataclass(frozen=True)
class BatchFused(Stmt):
    """A batched ``contract`` whose operand slices are produced one batch index at a time.

    For each index ``bi`` of the contract's batch (or summed) axis, every loop nest of
    ``producer`` runs with its outer variable fixed to ``bi`` and writes that operand
    slice (``slice`` elements) into the calling thread's part of ``scratch`` (at
    ``slice * tid``; ``tid`` is the variable ``sg_tid`` in store indices, below
    ``slots``), and then the product for ``bi`` reads it there. The operand (e.g. a
    convolution's im2col patches) is never materialized whole: each slice stays in cache.
    ``operand`` names the contract operand fed this way ("a" or "b"), or is "c": then
    the product for ``bi`` is written to the scratch slice and the nests of ``consumer``
    (outer variable fixed to ``bi``) read it there (e.g. a convolution's col2im).
    """

    producer: tuple[Loop, ...]
    contract: Contract
    operand: str
    scratch: str
    slice: int
    slots: int
    consumer: tuple[Loop, ...] = ()


@dataclass
class Kernel:
    """One loop nest. ``work`` estimates scalar operations (renderers gate threading on it);
    ``inlined`` names the graph nodes computed inside it rather than read from memory."""

    name: str
    body: tuple[Stmt, ...]
    work: int
    root: str
    inlined: list[str] = field(default_factory=list)

    def format(self) -> str:
        head = f"kernel {self.name}  # root {self.root}, work {self.work}"
        if self.inlined:
            head += f", inlined: {', '.join(self.inlined)}"
        return "\n".join([head, *_format_stmts(self.body, 1)])


@dataclass(frozen=True)
class BufferSpec:
    """A named buffer: ``kind`` is input / output / state / const / temp.

    ``slot`` is the position in the I/O table for input/output/state/const buffers;
    ``offset`` is the byte offset in the arena for temps.
    """

    name: str
    dtype: DType
    size: int
    kind: str
    slot: int = -1
    offset: int = -1


@dataclass
class Program:
    """A compiled function: buffers plus kernels run in order."""

    name: str
    buffers: dict[str, BufferSpec]
    kernels: list[Kernel]
    arena_bytes: int = 0

    def format(self) -> str:
        lines = [f"program {self.name}  # arena {self.arena_bytes} bytes"]
        for b in self.buffers.values():
            where = f"slot {b.slot}" if b.kind != "temp" else f"arena+{b.offset}"
            lines.append(f"  buffer {b.name}: {b.dtype.name}[{b.size}] {b.kind} ({where})")
        for k in self.kernels:
            lines.append(k.format())
        return "\n".join(lines)


def _format_stmts(body: tuple[Stmt, ...], depth: int) -> list[str]:
    pad = "  " * depth
    out: list[str] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(f"{pad}for {s.var.name} in 0..{s.var.extent} ({s.kind}):")
            out.extend(_format_stmts(s.body, depth + 1))
        elif isinstance(s, Store):
            op = f"{s.accumulate}=" if s.accumulate else "="
            out.append(f"{pad}{s.buffer}[{s.index}] {op} {s.value}")
        elif isinstance(s, Declare):
            out.append(f"{pad}{s.name} = {s.init}")
        elif isinstance(s, Local):
            out.append(f"{pad}local {s.name}: {s.dtype.name}[{s.size}]")
        elif isinstance(s, Accumulate):
            out.append(f"{pad}{s.name} {s.op}= {s.value}")
        elif isinstance(s, IndexLoad):
            out.append(f"{pad}{s.var.name} = wrap({s.buffer}[{s.index}], {s.var.extent})")
        elif isinstance(s, CheckBounds):
            out.append(f"{pad}check {s.buffer}[0:{s.size}] in [-{s.n}, {s.n}) else error {s.code}")
        elif isinstance(s, BatchFused):
            c = s.contract
            out.append(f"{pad}per batch index bi (scratch {s.scratch}, {s.slots} slots):")
            out.extend(_format_stmts(s.producer, depth + 1))
            out.extend(_format_stmts((c,), depth + 1))
            out.extend(_format_stmts(s.consumer, depth + 1))
        elif isinstance(s, Contract):
            out.append(
                f"{pad}{s.c} = contract({s.a}{'^T' if s.trans_a else ''}, {s.b}{'^T' if s.trans_b else ''})"
                f" m={s.m} n={s.n} k={s.k} batch={s.batch} sum={s.sum_batch}"
                + (f" alpha={s.alpha} beta={s.beta}" if (s.alpha, s.beta) != (1.0, 0.0) else "")
            )
    return out


def loads_in(body: tuple[Stmt, ...]) -> Iterator[Load]:
    """Every Load in a statement list (including inside loops)."""
    for s in body:
        exprs: list[Expr] = []
        if isinstance(s, Loop):
            yield from loads_in(s.body)
        elif isinstance(s, BatchFused):
            yield from loads_in(s.producer)
            yield from loads_in(s.consumer)
        elif isinstance(s, Store):
            exprs = [s.value]
        elif isinstance(s, Declare):
            exprs = [s.init]
        elif isinstance(s, Accumulate):
            exprs = [s.value]
        for e in exprs:
            yield from (x for x in walk_expr(e) if isinstance(x, Load))
