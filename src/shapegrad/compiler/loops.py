"""The loop IR: a backend-neutral program of kernels, each a loop nest over an index space.

Lowering (``compiler/lower.py``) produces it, the loop stages of
``compiler/pipeline.py`` transform it, renderers (``backends/cstyle.py`` and its
C and CUDA subclasses) consume it. Nothing here knows about a target language:
there are no pointers, pragmas, type spellings or thread ids.

* **Index expressions** (:class:`Affine`, in ``compiler/index.py``) are integer
  sums over loop variables and ``floordiv``/``mod`` atoms.
* **Scalar expressions** (:class:`Expr` subclasses) compute one element:
  loads, constants, unary/binary ops, selects, casts, counters for iota and
  random numbers.
* **Statements**: :class:`Loop` (``parallel``: iterations independent; or
  ``reduction``: iterations update the same locations), :class:`Store`
  (optionally accumulating; ``commutative`` accumulations may run in any order,
  e.g. as atomics), :class:`Reduce` (a scalar reduction a renderer may run as a
  tree), :class:`Local` (per-iteration scratch), :class:`IndexLoad` (a
  data-dependent index), :class:`CheckBounds` (the error-flag contract, below)
  and :class:`Contract` (a matrix-multiply library call), :class:`BatchFused`
  (a product whose operand is produced one batch slice at a time),
  :class:`Collective` (an exchange with the other processes of a communicator:
  MPI from C, host-staged or NCCL on a GPU), :class:`SortRow` (the stable sorted
  positions of one row: a loop over rows around it is a row-parallel sort).

**Error-flag contract.** A :class:`CheckBounds` that fails records its ``code``
as the program's error (the first failure wins) and the rest of the program is
skipped: no later kernel runs. A renderer may implement "skipped" by returning
at once (C) or by every later kernel testing a device-side flag (a GPU). The host
reads the code after the call and raises the error that ``Program.errors``
describes. In a K-step run, steps before the failing one are complete and later
ones do not run (see ``backends/base.py`` for what the caller sees).

**Visitor.** :func:`walk` (every statement), :func:`expressions` and
:func:`walk_expr`, :func:`map_expr`/:func:`map_body` (rebuild with a function
applied bottom-up), :func:`rename_buffers`, :func:`reads`/:func:`writes`: every
compiler stage and renderer traverses the IR through these.

Every node prints itself; ``Program.format()`` is what ``SHAPEGRAD_DEBUG``
writes after each loop stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from shapegrad.compiler.index import (
    Affine,
    Atom,
    DivMod,
    Var,
    const,
    divmods_of,
    flatten,
    floordiv,
    mentions,
    mod,
    resolve,
    substitute,
    unflatten,
    var,
)
from shapegrad.dtypes import DType, bool_, int32

__all__ = [
    "Affine",
    "Atom",
    "DivMod",
    "Var",
    "const",
    "divmods_of",
    "flatten",
    "floordiv",
    "mentions",
    "mod",
    "resolve",
    "substitute",
    "unflatten",
    "var",
]

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
    """``cond ? a : b``. ``speculate``: both arms may be computed whatever ``cond`` (set by
    ``compiler/speculate.py``), so a renderer may compute both and blend (vectorizes)."""

    cond: Expr
    a: Expr
    b: Expr
    speculate: bool = False

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


# ---------------------------------------------------------------------------
# Statements, kernels, programs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stmt:
    """Base of statements."""


@dataclass(frozen=True)
class Loop(Stmt):
    """``for var in [start, stop)`` (default ``[0, var.extent)``; a segment of an index-set
    split runs part of the range, see ``compiler/segments.py``); ``kind`` is
    ``"parallel"`` (iterations independent) or ``"reduction"`` (iterations update the same
    locations through accumulating stores: in order, unless every such store is
    ``commutative``)."""

    var: Var
    kind: str
    body: tuple[Stmt, ...]
    start: int = 0
    stop: int | None = None

    @property
    def end(self) -> int:
        """One past the last value of ``var``."""
        return self.var.extent if self.stop is None else self.stop

    @property
    def trips(self) -> int:
        """Iterations run."""
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Block(Stmt):
    """One copy of a loop body with its variable fixed (``note`` says to what): the
    iterations of an unrolled loop or of a div-split one (``compiler/segments.py``)."""

    note: str
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[index] = value``, or ``buffer[index] op= value`` when ``accumulate`` is set.

    ``commutative``: the accumulation may be applied in any order, and concurrently by
    iterations of enclosing loops if each update is atomic (scatter-add, row-form
    reductions). Float results may then differ in rounding, never otherwise.
    """

    buffer: str
    index: Affine
    value: Expr
    accumulate: str | None = None  # "add" | "max"
    commutative: bool = False


@dataclass(frozen=True)
class Reduce(Stmt):
    """``name = init; for vars (nested, row-major): name = op(name, value)``.

    A reduction to one scalar per point of the enclosing loops; ``op`` ("add" or "max")
    is associative and commutative, so a renderer may split ``vars`` and combine partial
    results as a tree (a GPU block reduction) or in blocks (pairwise float sums). The
    scalar is read afterwards as ``Ref(name)``.
    """

    name: str
    op: str
    init: Expr
    vars: tuple[Var, ...]
    value: Expr


@dataclass(frozen=True)
class Local(Stmt):
    """A scratch array ``name[size]`` private to one iteration of the enclosing loops
    (a stack array in C, registers/shared memory on a GPU); Load/Store address it by name."""

    name: str
    dtype: DType
    size: int


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
    """If any of ``buffer[0:size]`` is outside ``[-n, n)``: record error ``code`` and skip the
    rest of the program (the module docstring's error-flag contract)."""

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

    A two-level batch (``inner > 1``) runs ``batch = outer * inner`` products: product
    ``bi`` is ``(bo, bh) = divmod(bi, inner)`` and starts ``bo * stride_x + bh *
    inner_stride_x`` into each operand (attention's heads of a ``[b, t, h, d]`` buffer:
    ``b`` and ``h`` have strides no single stride describes, so the head views are read
    in place instead of copied). ``ldc`` is the distance between rows of ``c`` (0: ``n``;
    larger when ``c`` is written into a wider layout, e.g. heads merged into ``[b, t, h*d]``).
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
    # a run-time factor of alpha: ``alpha * alpha_buffer[alpha_index]`` (e.g. the trainer's lr)
    alpha_buffer: str | None = None
    alpha_index: int = 0
    inner: int = 1
    inner_stride_a: int = 0
    inner_stride_b: int = 0
    inner_stride_c: int = 0
    ldc: int = 0

    @property
    def row_c(self) -> int:
        """Elements between rows of ``c`` (``ldc``, or ``n`` when packed)."""
        return self.ldc or self.n

    @property
    def plain_batch(self) -> bool:
        """One batch stride per operand and ``c`` packed (what a strided-batched library
        call takes): no inner batch and ``ldc`` at most ``n``."""
        return self.inner == 1 and self.row_c == self.n

    def batch_offset(self, operand: str, index: str) -> str:
        """C expression: where product ``index`` starts in ``operand`` ("a", "b", "c"),
        relative to the operand's own offset."""
        outer = {"a": self.stride_a, "b": self.stride_b, "c": self.stride_c}[operand]
        if self.inner == 1:
            return f"{index} * {outer}"
        inner = {"a": self.inner_stride_a, "b": self.inner_stride_b, "c": self.inner_stride_c}
        return f"({index} / {self.inner}) * {outer} + ({index} % {self.inner}) * {inner[operand]}"


@dataclass(frozen=True)
class BatchFused(Stmt):
    """A batched ``contract`` whose operand slices are produced one batch index at a time.

    For each index ``bi`` of the contract's batch (or summed) axis, every loop nest of
    ``producer`` runs with its outer variable fixed to ``bi`` and writes that operand
    slice (``slice`` elements) into ``scratch``, and then the product for ``bi`` reads it
    there. The operand (e.g. a convolution's im2col patches) is never materialized whole.
    ``operand`` names the contract operand fed this way ("a" or "b"), or is "c": then the
    product for ``bi`` is written to the scratch slice and the nests of ``consumer``
    (outer variable fixed to ``bi``) read it there (e.g. a convolution's col2im).

    ``scratch`` holds ``slots`` slices: a renderer running batch indices concurrently
    gives each worker its own slice. Inside ``producer``/``consumer`` the scratch is
    addressed relative to the current slice (indices in ``[0, slice)``); the renderer
    adds the worker's slice offset.
    """

    producer: tuple[Loop, ...]
    contract: Contract
    operand: str
    scratch: str
    slice: int
    slots: int
    consumer: tuple[Loop, ...] = ()


@dataclass(frozen=True)
class Collective(Stmt):
    """An exchange of ``src`` with the other processes of communicator number ``comm`` of
    the program (``Program.communicators``); the result goes to ``dst`` (never ``src``).

    ``kind``: ``all_reduce`` (``op`` "sum" or "max" over ``count`` elements; with ``root``
    set, ``dst`` is the sum on that rank and zeros elsewhere), ``all_gather`` (``count``
    elements from every rank, concatenated in rank order), ``reduce_scatter`` (the sum,
    of which this rank keeps block ``rank`` of ``count`` elements) or ``broadcast``
    (``root``'s ``count`` elements). Reductions see float32/float64/int32 only (lowering
    stages float16 and bool through those); the other kinds move bytes of any dtype.
    A failure of the exchange records error ``code`` (the error-flag contract).

    ``phase`` splits one exchange into nonblocking parts (``compiler/overlap.py``):
    ``"blocking"`` (the whole exchange here), ``"start"`` (begin it: request number
    ``request`` of the program), ``"test"`` (let the MPI library advance request
    ``request``, if not finished, while kernels run) and ``"wait"`` (finish it: ``dst`` is
    complete after). Between its start and its wait an exchange reads ``src`` and writes
    ``dst``: both stay live, and no statement touches them or can fail there.
    """

    kind: str
    src: str
    dst: str
    count: int
    dtype: DType
    comm: int
    op: str = "sum"
    root: int | None = None
    code: int = 0
    phase: str = "blocking"
    request: int = -1


@dataclass(frozen=True)
class SortRow(Stmt):
    """The positions of one row in stable sorted order: the row is ``src[src_index +
    src_stride * j]`` for ``j < n``; its first ``k`` sorted positions (int32) go to
    ``dst[dst_index + dst_stride * t]`` for ``t < k``. Ties keep their order; NaN is the
    largest value; ``descending`` puts the largest first.

    ``method`` is ``"merge"`` (insertion-sorted runs merged bottom-up: ``2n`` int32 of
    scratch) or ``"select"`` (the ``k`` best kept sorted by insertion while scanning the
    row once: ``k`` of scratch); the row's scratch is ``scratch[scratch_index + ...]``, a
    region no other row touches, so a loop over rows around this statement is parallel.
    """

    src: str
    src_index: Affine
    src_stride: int
    n: int
    dst: str
    dst_index: Affine
    dst_stride: int
    k: int
    scratch: str
    scratch_index: Affine
    dtype: DType
    descending: bool
    method: str


@dataclass(frozen=True)
class LayerSlot:
    """One entry of a layer body's I/O table: ``buffer + offset + stride * layer`` (elements)."""

    buffer: str
    offset: int
    stride: int
    writes: bool


@dataclass(frozen=True, eq=False)
class LayerLoop(Stmt):
    """``for layer in 0..length`` (descending when ``reverse``): run ``body``, a program
    lowered once (its own kernels, memory plan and I/O table), with slot ``k`` of its I/O
    table bound to ``slots[k]``'s per-layer slice and its arena at buffer ``arena``; then
    run ``after`` (plain loop nests, e.g. moving a carry into place for the next layer).

    A renderer emits the body's kernels once (a function in C) and calls it per layer, so
    the generated code and its compile time do not grow with the number of layers. The
    body's error codes are part of the enclosing program's ``errors``.
    """

    body: Program
    length: int
    reverse: bool
    slots: tuple[LayerSlot, ...]
    arena: str
    after: tuple[Stmt, ...] = ()


@dataclass
class Kernel:
    """One unit of work (a loop nest, or a few run back to back). ``work`` estimates its
    scalar operations (a size hint for scheduling decisions, never a switch in itself);
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
    """A compiled function: buffers, kernels run in order, and its calling convention.

    Attributes:
        name: shows in dumps and error messages.
        buffers: every named buffer.
        kernels: run in order.
        inputs: buffer name per graph input (state inputs name their state buffer).
        outputs: buffer name per graph output.
        state_of_output: output index -> the input index whose buffer it updates in place.
        constants: const buffer name -> its data.
        errors: error code -> message (the error-flag contract; codes start at 1).
        arena_bytes: size of the arena holding every temp (set by ``pack_arena``).
        n_slots: entries of the I/O table (set by ``assign_slots``).
        communicators: the communicator objects (``shapegrad.distributed``) that
            :class:`Collective` statements name by position.
    """

    name: str
    buffers: dict[str, BufferSpec]
    kernels: list[Kernel]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    state_of_output: dict[int, int] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    arena_bytes: int = 0
    n_slots: int = 0
    communicators: list[Any] = field(default_factory=list)

    def format(self) -> str:
        lines = [
            f"program {self.name}  # arena {self.arena_bytes} bytes, {len(self.kernels)} kernels"
        ]
        for b in self.buffers.values():
            where = f"slot {b.slot}" if b.kind != "temp" else f"arena+{b.offset}"
            lines.append(f"  buffer {b.name}: {b.dtype.name}[{b.size}] {b.kind} ({where})")
        if self.inputs:
            lines.append(f"  inputs: {', '.join(self.inputs)}")
            lines.append(f"  outputs: {', '.join(self.outputs)}")
        for code, text in sorted(self.errors.items()):
            lines.append(f"  error {code}: {text}")
        for n, comm in enumerate(self.communicators):
            lines.append(f"  communicator {n}: {getattr(comm, 'key', '?')}, {comm.size} processes")
        for k in self.kernels:
            lines.append(k.format())
        return "\n".join(lines)


def _format_stmts(body: tuple[Stmt, ...], depth: int) -> list[str]:
    pad = "  " * depth
    out: list[str] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(f"{pad}for {s.var.name} in {s.start}..{s.end} ({s.kind}):")
            out.extend(_format_stmts(s.body, depth + 1))
        elif isinstance(s, Block):
            out.append(f"{pad}copy ({s.note}):")
            out.extend(_format_stmts(s.body, depth + 1))
        elif isinstance(s, Store):
            op = f"{s.accumulate}=" if s.accumulate else "="
            flag = "  # commutative" if s.commutative else ""
            out.append(f"{pad}{s.buffer}[{s.index}] {op} {s.value}{flag}")
        elif isinstance(s, Reduce):
            over = ", ".join(f"{v.name} in 0..{v.extent}" for v in s.vars)
            out.append(f"{pad}{s.name} = reduce_{s.op}({s.value}, init {s.init}) over {over}")
        elif isinstance(s, Local):
            out.append(f"{pad}local {s.name}: {s.dtype.name}[{s.size}]")
        elif isinstance(s, IndexLoad):
            out.append(f"{pad}{s.var.name} = wrap({s.buffer}[{s.index}], {s.var.extent})")
        elif isinstance(s, SortRow):
            order = "descending" if s.descending else "ascending"
            out.append(
                f"{pad}{s.dst}[{s.dst_index} + {s.dst_stride}*t, t < {s.k}] = argsort_{s.method}("
                f"{s.src}[{s.src_index} + {s.src_stride}*j, j < {s.n}], {order}, "
                f"scratch {s.scratch}[{s.scratch_index}...])"
            )
        elif isinstance(s, CheckBounds):
            out.append(f"{pad}check {s.buffer}[0:{s.size}] in [-{s.n}, {s.n}) else error {s.code}")
        elif isinstance(s, LayerLoop):
            order = "descending" if s.reverse else "ascending"
            out.append(
                f"{pad}for layer in 0..{s.length} ({order}): call {s.body.name} (arena {s.arena})"
            )
            for k, slot in enumerate(s.slots):
                mode = "write" if slot.writes else "read"
                out.append(
                    f"{pad}  slot {k} = {slot.buffer} + {slot.offset} + {slot.stride}*layer ({mode})"
                )
            out.extend(_format_stmts(s.after, depth + 1))
            text = s.body.format().replace("\n", "\n" + pad + "  | ")
            out.append(f"{pad}  | {text}")
        elif isinstance(s, BatchFused):
            c = s.contract
            out.append(f"{pad}per batch index bi (scratch {s.scratch}, {s.slots} slots):")
            out.extend(_format_stmts(s.producer, depth + 1))
            out.extend(_format_stmts((c,), depth + 1))
            out.extend(_format_stmts(s.consumer, depth + 1))
        elif isinstance(s, Collective):
            how = s.op if s.kind in ("all_reduce", "reduce_scatter") else ""
            at = f" root={s.root}" if s.root is not None else ""
            call = (
                f"{s.kind}{'_' + how if how else ''}({s.src}, {s.count} x "
                f"{s.dtype.name}, comm {s.comm}{at}) else error {s.code}"
            )
            if s.phase == "blocking":
                out.append(f"{pad}{s.dst} = {call}")
            elif s.phase == "test":
                out.append(f"{pad}progress request {s.request} ({s.dst})")
            else:
                out.append(f"{pad}{s.phase} request {s.request}: {s.dst} = {call}")
        elif isinstance(s, Contract):
            scaled = f"*{s.alpha_buffer}[{s.alpha_index}]" if s.alpha_buffer else ""
            out.append(
                f"{pad}{s.c} = contract({s.a}{'^T' if s.trans_a else ''}, {s.b}{'^T' if s.trans_b else ''})"
                f" m={s.m} n={s.n} k={s.k} batch={s.batch} sum={s.sum_batch}"
                + (f" inner={s.inner}" if s.inner > 1 else "")
                + (f" ldc={s.ldc}" if s.row_c != s.n else "")
                + (
                    f" alpha={s.alpha}{scaled} beta={s.beta}"
                    if (s.alpha, s.beta) != (1.0, 0.0) or scaled
                    else ""
                )
            )
    return out


# ---------------------------------------------------------------------------
# The visitor: every traversal of the loop IR goes through these
# ---------------------------------------------------------------------------


def sub_statements(s: Stmt) -> tuple[Stmt, ...]:
    """The statements directly inside ``s`` (in execution order)."""
    if isinstance(s, Loop | Block):
        return s.body
    if isinstance(s, BatchFused):
        return (*s.producer, s.contract, *s.consumer)
    if isinstance(s, LayerLoop):
        return s.after
    return ()


def walk(body: Iterable[Stmt]) -> Iterator[Stmt]:
    """Every statement of ``body`` and inside it, pre-order."""
    for s in body:
        yield s
        yield from walk(sub_statements(s))


def expressions(s: Stmt) -> tuple[Expr, ...]:
    """The scalar expressions ``s`` itself evaluates (not those of sub-statements)."""
    if isinstance(s, Store):
        return (s.value,)
    if isinstance(s, Reduce):
        return (s.init, s.value)
    return ()


def expr_children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def walk_expr(e: Expr) -> Iterator[Expr]:
    """``e`` and every sub-expression, pre-order."""
    yield e
    for child in expr_children(e):
        yield from walk_expr(child)


def all_expressions(body: Iterable[Stmt]) -> Iterator[Expr]:
    """Every expression evaluated anywhere in ``body`` (roots only; see :func:`walk_expr`)."""
    for s in walk(body):
        yield from expressions(s)


def loads_in(body: Iterable[Stmt]) -> Iterator[Load]:
    """Every element Load in a statement list (including inside loops and batch-fused parts)."""
    for e in all_expressions(body):
        yield from (x for x in walk_expr(e) if isinstance(x, Load))


def expr_index(e: Expr) -> Affine | None:
    """The index one expression node reads at (a load's, an index value's or range test's,
    a random draw's counter); None for the others."""
    if isinstance(e, Load | IndexValue | InRange):
        return e.index
    if isinstance(e, Random):
        return e.counter
    return None


def indices_in(body: Iterable[Stmt]) -> Iterator[Affine]:
    """Every index expression in ``body``: stores, index loads and every expression's."""
    for s in walk(body):
        if isinstance(s, Store | IndexLoad):
            yield s.index
    for root in all_expressions(body):
        for e in walk_expr(root):
            if (index := expr_index(e)) is not None:
                yield index


ExprFn = Callable[[Expr], Expr]
StmtFn = Callable[[Stmt], Stmt]


def map_expr(e: Expr, fn: ExprFn) -> Expr:
    """Rebuild ``e`` bottom-up: children first, then ``fn`` on each (rebuilt) node."""
    if isinstance(e, Unary | Cast):
        e = replace(e, x=map_expr(e.x, fn))
    elif isinstance(e, Binary):
        e = replace(e, a=map_expr(e.a, fn), b=map_expr(e.b, fn))
    elif isinstance(e, Select):
        e = replace(e, cond=map_expr(e.cond, fn), a=map_expr(e.a, fn), b=map_expr(e.b, fn))
    return fn(e)


def map_stmt(s: Stmt, expr: ExprFn | None = None, stmt: StmtFn | None = None) -> Stmt:
    """Rebuild ``s`` bottom-up: sub-statements first, then its expressions through ``expr``,
    then ``stmt`` on the rebuilt statement."""
    if isinstance(s, Loop | Block):
        s = replace(s, body=map_body(s.body, expr, stmt))
    elif isinstance(s, BatchFused):
        producer = tuple(_as_loop(map_stmt(x, expr, stmt)) for x in s.producer)
        contract = map_stmt(s.contract, expr, stmt)
        assert isinstance(contract, Contract)
        consumer = tuple(_as_loop(map_stmt(x, expr, stmt)) for x in s.consumer)
        s = replace(s, producer=producer, contract=contract, consumer=consumer)
    elif isinstance(s, LayerLoop):
        s = replace(s, after=map_body(s.after, expr, stmt))
    if expr is not None:
        if isinstance(s, Store):
            s = replace(s, value=map_expr(s.value, expr))
        elif isinstance(s, Reduce):
            s = replace(s, init=map_expr(s.init, expr), value=map_expr(s.value, expr))
    return stmt(s) if stmt is not None else s


def map_body(
    body: tuple[Stmt, ...], expr: ExprFn | None = None, stmt: StmtFn | None = None
) -> tuple[Stmt, ...]:
    """:func:`map_stmt` over a statement list."""
    return tuple(map_stmt(s, expr, stmt) for s in body)


def _as_loop(s: Stmt) -> Loop:
    assert isinstance(s, Loop), "batch-fused parts stay loop nests"
    return s


def rename_buffers(body: tuple[Stmt, ...], fix: Callable[[str], str]) -> tuple[Stmt, ...]:
    """``body`` with every buffer name ``n`` (loads, stores, indices, products, scratch)
    replaced by ``fix(n)``."""

    def expr(e: Expr) -> Expr:
        return replace(e, buffer=fix(e.buffer)) if isinstance(e, Load) else e

    def stmt(s: Stmt) -> Stmt:
        if isinstance(s, Store | IndexLoad | CheckBounds):
            return replace(s, buffer=fix(s.buffer))
        if isinstance(s, Contract):
            alpha = fix(s.alpha_buffer) if s.alpha_buffer else None
            return replace(s, a=fix(s.a), b=fix(s.b), c=fix(s.c), alpha_buffer=alpha)
        if isinstance(s, BatchFused):
            return replace(s, scratch=fix(s.scratch))
        if isinstance(s, Collective):
            return replace(s, src=fix(s.src), dst=fix(s.dst))
        if isinstance(s, SortRow):
            return replace(s, src=fix(s.src), dst=fix(s.dst), scratch=fix(s.scratch))
        if isinstance(s, LayerLoop):
            slots = tuple(replace(x, buffer=fix(x.buffer)) for x in s.slots)
            return replace(s, slots=slots, arena=fix(s.arena))
        return s

    return map_body(body, expr, stmt)


def local_names(body: Iterable[Stmt]) -> set[str]:
    """Names of the scratch arrays (:class:`Local`) declared in ``body``."""
    return {s.name for s in walk(body) if isinstance(s, Local)}


def reads(body: Iterable[Stmt]) -> set[str]:
    """Buffers ``body`` reads: loads, index buffers, accumulated stores, product operands
    (and the product's destination when it accumulates into it). Locals excluded."""
    body = tuple(body)
    names = {ld.buffer for ld in loads_in(body)}
    for s in walk(body):
        if isinstance(s, Contract):
            names |= {s.a, s.b} | ({s.c} if s.beta else set())
            names |= {s.alpha_buffer} if s.alpha_buffer else set()
        elif isinstance(s, Collective) and s.phase != "test":
            names.add(s.src)
        elif isinstance(s, SortRow):  # the scratch is read back after it is written
            names |= {s.src, s.scratch}
        elif isinstance(s, IndexLoad | CheckBounds) or (isinstance(s, Store) and s.accumulate):
            names.add(s.buffer)
        elif isinstance(s, LayerLoop):  # a layer may read what an earlier layer wrote
            names |= {x.buffer for x in s.slots} | {s.arena}
    return names - local_names(body)


def writes(body: Iterable[Stmt]) -> set[str]:
    """Buffers ``body`` writes (stores and product destinations). Locals excluded."""
    body = tuple(body)
    out: set[str] = set()
    for s in walk(body):
        if isinstance(s, Store):
            out.add(s.buffer)
        elif isinstance(s, Contract):
            out.add(s.c)
        elif isinstance(s, Collective) and s.phase != "test":
            out.add(s.dst)
        elif isinstance(s, SortRow):
            out |= {s.dst, s.scratch}
        elif isinstance(s, LayerLoop):
            out |= {x.buffer for x in s.slots if x.writes} | {s.arena}
    return out - local_names(body)


def stmt_types() -> tuple[type[Stmt], ...]:
    """Every statement class (a renderer must have a rule for each)."""
    return (
        Loop,
        Block,
        Store,
        Reduce,
        Local,
        IndexLoad,
        CheckBounds,
        Contract,
        BatchFused,
        Collective,
        LayerLoop,
        SortRow,
    )


def nested_programs(program: Program) -> Iterator[Program]:
    """``program`` and every layer-loop body inside it (depth first)."""
    yield program
    for kernel in program.kernels:
        for s in walk(kernel.body):
            if isinstance(s, LayerLoop):
                yield from nested_programs(s.body)
