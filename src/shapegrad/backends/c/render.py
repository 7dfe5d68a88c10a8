"""The C renderer: loop IR -> one readable C translation unit (a ``CStyleRenderer``).

Layout of the generated file:

* helpers (``backends/cstyle.py``: NaN-propagating max/min, integer division and
  power, the counter-based random generator);
* ``static int sg_body(void **io, char *arena)``: one ``{ ... }`` block per
  kernel. Buffer pointers are declared ``restrict`` *inside* each block, so
  temps that share arena bytes in different kernels never alias within one
  restrict scope. Returns 0, or the code of the first failed bounds check: C runs
  synchronously, so "record the error and skip the rest" (the error-flag contract
  of ``compiler/loops.py``) is a ``return``;
* ``int sg_run(void **io, char *arena)``: one call;
* ``int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step,
  int64_t *done)``: ``k`` calls, advancing each I/O pointer by ``step[slot]``
  bytes per call (stacked batches in, stacked outputs out, persistent state
  untouched); stops at the first failing step, ``*done`` = steps completed;
* ``void sg_set_threads(int n)``: OpenMP team size and OpenBLAS threads;
* with collectives, ``int sg_mpi_bind(...)``: the MPI entry points the host hands
  in after loading (``backends/c/collectives.py``);
* ``const char sg_key[]`` (appended by the toolchain): the cache key, checked after
  ``dlopen``.

Scheduling (this renderer's own policy, not the IR's): ``#pragma omp parallel for``
goes only on the outermost parallel loop of a nest whose estimated work
(``cstyle.estimate_work``) is at least ``OMP_MIN_WORK`` scalar ops; large library
products are split into row blocks (or over their summed axis) across the team, each
block one single-threaded BLAS call; batch-fused products give each thread its own
scratch slice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shapegrad.backends.c.collectives import mpi_prelude, render_collective
from shapegrad.backends.cstyle import HELPERS, CStyleRenderer, estimate_work
from shapegrad.compiler import loops as L

# Fork/join of a 2-thread OpenMP team costs ~2-5 µs here; a kernel needs roughly this many
# scalar ops (≈ 20-40 µs of work) before splitting it pays off.
OMP_MIN_WORK = 1 << 18
# Library products at least this large (multiply-adds) are split into row blocks, one
# single-threaded BLAS call per OpenMP thread (nested BLAS threading is never used).
CONTRACT_SPLIT_MACS = 1 << 20
# A large sum of products whose output has at most this many elements is split over the
# summed axis instead (each thread keeps a private partial of the output on its stack):
# the products keep all their rows (m=32, not 16, for the CNN's weight gradient).
SUM_SPLIT_MAX_OUT = 1 << 14

_PRELUDE = r"""
#include <stdint.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* team size of every parallel loop (sg_set_threads); a clause, not the calling thread's ICV */
static int sg_threads = 1;
""" + HELPERS.format(q="static inline")

_BLAS_DECL = r"""
#define SG_USES_BLAS 1
void scipy_openblas_set_num_threads(int);
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double *, int,
                       const double *, int, double, double *, int);
"""

_STEPS = r"""
int sg_run(void **io, char *arena) { return sg_body(io, arena); }

int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step, int64_t *done) {
    void *local[SG_NSLOTS + 1];
    *done = 0;
    for (int64_t t = 0; t < k; ++t) {
        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];
        int rc = sg_body(local, arena);
        if (rc) return rc;
        *done = t + 1;
    }
    return 0;
}

void sg_set_threads(int n) {
    sg_threads = n > 0 ? n : 1;
#ifdef SG_USES_BLAS
    scipy_openblas_set_num_threads(1); /* we split products across our own threads */
#endif
    (void)n;
}
"""


class CRenderer(CStyleRenderer):
    """C with OpenMP scheduling and OpenBLAS products (see the module docstring)."""

    def __init__(self, program: L.Program) -> None:
        super().__init__(program)
        # functions of layer-loop bodies, shared by the renderers of one translation unit
        self.functions: list[str] = []

    def kernel(self, k: L.Kernel, number: int, profile: bool) -> None:
        self.emit(1, f"/* {k.name}: root {k.root}; work {k.work} */")
        if k.inlined:
            self.emit(1, f"/*   inlined: {', '.join(k.inlined)} */")
        self.emit(1, "{")
        if profile:
            self.emit(2, "double sg_t0 = sg_now();")
        for name in sorted(L.reads(k.body) | L.writes(k.body)):
            self.emit(2, self._pointer(name))
        # Each loop nest (concat parts, a library call and its epilogue) is judged on its
        # own estimated work.
        for s in k.body:
            self.stmt(s, 2, parallel_ok=estimate_work(s) >= OMP_MIN_WORK)
        if profile:
            self.emit(2, f"sg_profile[{number}] += sg_now() - sg_t0;")
        self.emit(1, "}")

    def _pointer(self, name: str) -> str:
        spec = self.program.buffers[name]
        t = self.type_name(spec.dtype)
        const = "const " if spec.kind in ("input", "const") else ""
        src = f"(arena + {spec.offset})" if spec.kind == "temp" else f"io[{spec.slot}]"
        return f"{const}{t} *restrict {name} = ({const}{t} *){src};"

    def loop(self, s: L.Loop, depth: int, parallel_ok: bool) -> None:
        """A large parallel loop is split across the team; a large reduction over rows
        (a bias gradient) is split over the row instead (``_split_rows``). Nothing inside
        a serial loop forks a team: a region per iteration would fork thousands of times."""
        if parallel_ok and s.kind == "parallel" and s.var.extent > 1:
            self.emit(depth, "#pragma omp parallel for schedule(static) num_threads(sg_threads)")
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = 0; {v} < {s.var.extent}; ++{v}) {{")
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            return
        if parallel_ok and s.kind == "reduction" and (row := _row_of(s)) is not None:
            self._split_rows(s, row, depth)
            return
        super().loop(s, depth, parallel_ok and s.var.extent <= 1)

    def _split_rows(self, nest: L.Loop, row: L.Loop, depth: int) -> None:
        """``for r (reduction): for j (parallel): x[j] op= ...`` with the j range split across
        the team, each thread running every r over its own block of j: per element the sum
        runs in the same order as serially, so results are identical."""
        j = row.var
        e = self.emit
        e(depth, "#pragma omp parallel for schedule(static) num_threads(sg_threads)")
        e(depth, "for (int64_t part = 0; part < sg_threads; ++part) {")
        e(depth + 1, f"const int64_t j0 = part * {j.extent} / sg_threads;")
        e(depth + 1, f"const int64_t j1 = (part + 1) * {j.extent} / sg_threads;")

        def blocked(x: L.Stmt) -> L.Stmt:
            return _BlockLoop(j, x.body) if isinstance(x, L.Loop) and x.var == j else x

        self.stmts(L.map_body((nest,), stmt=blocked), depth + 1, False)
        e(depth, "}")

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        if isinstance(s, _BlockLoop):
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = j0; {v} < j1; ++{v}) {{")
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            return
        super().stmt(s, depth, parallel_ok)

    def fail(self, code: int) -> str:
        return f"return {code};"

    def layer_loop(self, s: L.LayerLoop, depth: int) -> None:
        """The body as its own function (rendered once), called per layer with its I/O
        table pointing at the layer's slices (see ``loops.LayerLoop``)."""
        fn = f"sg_layer{len(self.functions)}"
        self.functions.append("")  # reserve the number; nested bodies come first
        sub = CRenderer(s.body)
        sub.functions = self.functions
        sub.lines.append(f"/* layer body {_comment_safe(s.body.name)} */")
        sub.lines.append(f"static int {fn}(void **restrict io, char *restrict arena) {{")
        sub.emit(1, "(void)io; (void)arena;")
        for number, k in enumerate(s.body.kernels):
            sub.kernel(k, number, False)
        sub.emit(1, "return 0;")
        sub.lines.append("}")
        self.functions[int(fn[len("sg_layer") :])] = "\n".join(sub.lines)
        e = self.emit
        e(depth, "{")
        e(depth + 1, f"void *sg_sub[{max(len(s.slots), 1)}];")
        e(depth + 1, f"for (int64_t sg_i = 0; sg_i < {s.length}; ++sg_i) {{")
        layer = f"{s.length - 1} - sg_i" if s.reverse else "sg_i"
        e(depth + 2, f"int64_t layer = {layer};")
        for number, slot in enumerate(s.slots):
            e(
                depth + 2,
                f"sg_sub[{number}] = (void *)({slot.buffer} + {slot.offset} + {slot.stride} * layer);",
            )
        e(depth + 2, f"int sg_rc = {fn}(sg_sub, (char *){s.arena});")
        e(depth + 2, "if (sg_rc) return sg_rc;")
        self.stmts(s.after, depth + 2, False)
        e(depth + 1, "}")
        e(depth, "}")

    def contract(self, s: L.Contract, depth: int) -> None:
        """Library products; large ones are split into row blocks across the OpenMP team
        (each block a single-threaded BLAS call), see ``sg_set_threads``."""
        fn = "scipy_cblas_sgemm" if s.dtype.name == "float32" else "scipy_cblas_dgemm"
        f = "f" if s.dtype.name == "float32" else ""
        one, alpha, beta = f"1.0{f}", _alpha(s), f"{s.beta!r}{f}"
        ta, tb = (112 if s.trans_a else 111), (112 if s.trans_b else 111)
        a_row = 1 if s.trans_a else s.lda  # elements between rows of op(a)
        big = s.m * s.n * s.k * s.batch * s.sum_batch >= CONTRACT_SPLIT_MACS
        if big and s.batch == 1 and s.sum_batch >= 2 and s.m * s.n <= SUM_SPLIT_MAX_OUT:
            self.contract_sum_split(s, depth)
            return
        if big and s.batch >= 8:
            # many independent products: hand whole products to threads, rows stay intact
            self.emit(depth, "#pragma omp parallel for schedule(static) num_threads(sg_threads)")
        split = big and s.batch < 8 and s.m >= 16
        if split:
            self.emit(depth, "#pragma omp parallel for schedule(static) num_threads(sg_threads)")
            self.emit(depth, "for (int64_t part = 0; part < sg_threads; ++part) {")
            depth += 1
            self.emit(depth, f"int64_t m0 = part * {s.m} / sg_threads;")
            self.emit(depth, f"int64_t m1 = (part + 1) * {s.m} / sg_threads;")
            rows, a_off, c_off = "(int)(m1 - m0)", f" + m0 * {a_row}", f" + m0 * {s.n}"
        else:
            rows, a_off, c_off = str(s.m), "", ""
        self.emit(depth, f"for (int64_t bi = 0; bi < {s.batch}; ++bi)")
        self.emit(depth + 1, f"for (int64_t si = 0; si < {s.sum_batch}; ++si)")
        self.emit(
            depth + 2,
            f"{fn}(101, {ta}, {tb}, {rows}, {s.n}, {s.k}, {alpha}, "
            f"{s.a} + {s.offset_a} + bi * {s.stride_a} + si * {s.sum_stride_a}{a_off}, {s.lda}, "
            f"{s.b} + {s.offset_b} + bi * {s.stride_b} + si * {s.sum_stride_b}, {s.ldb}, "
            f"si ? {one} : {beta}, {s.c} + bi * {s.stride_c}{c_off}, {s.n});",
        )
        if split:
            self.emit(depth - 1, "}")

    def contract_sum_split(self, s: L.Contract, depth: int) -> None:
        """A sum of products (a convolution's weight gradient) split over the summed axis:
        each thread accumulates whole products into a private partial, then the partials
        are added into ``c`` in thread order (deterministic for a given team size)."""
        fn = "scipy_cblas_sgemm" if s.dtype.name == "float32" else "scipy_cblas_dgemm"
        t, f = self.type_name(s.dtype), ("f" if s.dtype.name == "float32" else "")
        size, total = s.m * s.n, s.sum_batch
        e = self.emit
        e(depth, "{")
        e(depth, "#ifdef _OPENMP")
        e(depth, "#pragma omp parallel num_threads(sg_threads)")
        e(depth, "#endif")
        e(depth, "{")
        d = depth + 1
        e(d, "int nt = 1, tid = 0;")
        e(d, "#ifdef _OPENMP")
        e(d, "nt = omp_get_num_threads(); tid = omp_get_thread_num();")
        e(d, "#endif")
        e(d, f"{t} part[{size}];")
        e(d, f"int64_t s0 = tid * {total} / nt, s1 = (tid + 1) * {total} / nt;")
        e(d, "for (int64_t si = s0; si < s1; ++si)")
        a = f"{s.a} + {s.offset_a} + si * {s.sum_stride_a}"
        b = f"{s.b} + {s.offset_b} + si * {s.sum_stride_b}"
        e(d + 1, _partial_product(fn, s, a, b, f"si > s0 ? 1.0{f} : 0.0{f}"))
        self.add_partials(s, d, "tid")
        e(depth, "}")
        e(depth, "}")

    def add_partials(self, s: L.Contract, d: int, tid: str) -> None:
        """Add each thread's ``part`` (its products ``s0 <= si < s1``) into ``s.c``, in
        thread order; thread 0 also applies ``beta``. ``part`` is ``n x m`` when
        ``_partial_transposed(s)`` (see ``_partial_product``)."""
        e, f = self.emit, ("f" if s.dtype.name == "float32" else "")
        e(d, "for (int q = 0; q < nt; ++q) {")
        e(d + 1, "#ifdef _OPENMP")
        e(d + 1, "#pragma omp barrier")
        e(d + 1, "#endif")
        e(d + 1, f"if (q != {tid}) continue;")
        init = f"0.0{f}" if s.beta == 0.0 else f"{s.beta!r}{f} * {s.c}[i]"
        if _partial_transposed(s):
            loop = f"for (int64_t i = 0, r = 0; r < {s.m}; ++r) for (int64_t j = 0; j < {s.n}; ++j, ++i) "
            got = f"part[j * {s.m} + r]"
        else:
            loop, got = f"for (int64_t i = 0; i < {s.m * s.n}; ++i) ", "part[i]"
        e(d + 1, "if (q == 0)")
        e(d + 2, f"{loop}{s.c}[i] = {init} + (s1 > s0 ? {got} : 0.0{f});")
        e(d + 1, "else if (s1 > s0)")
        e(d + 2, f"{loop}{s.c}[i] += {got};")
        e(d, "}")

    def batch_fused(self, s: L.BatchFused, depth: int) -> None:
        """Per batch index: the producer nests write this thread's scratch slice, then one
        library call reads it (see ``loops.BatchFused``). Threads share the batch indices
        (or, for a sum of products, split them and add private partials in thread order)."""
        c, e = s.contract, self.emit
        fn = "scipy_cblas_sgemm" if c.dtype.name == "float32" else "scipy_cblas_dgemm"
        t, f = self.type_name(c.dtype), ("f" if c.dtype.name == "float32" else "")
        summed = c.sum_batch > 1
        count = c.sum_batch if summed else c.batch
        e(depth, "{")
        e(depth, f"int sg_team = sg_threads < {s.slots} ? sg_threads : {s.slots};")
        e(depth, "(void)sg_team;")
        e(depth, "#pragma omp parallel num_threads(sg_team)")
        e(depth, "{")
        d = depth + 1
        e(d, "int64_t sg_tid = 0; int nt = 1;")
        e(d, "#ifdef _OPENMP")
        e(d, "sg_tid = omp_get_thread_num(); nt = omp_get_num_threads();")
        e(d, "#endif")
        e(d, "(void)nt;")
        e(d, f"{t} *restrict sg_slice = {s.scratch} + sg_tid * {s.slice};")
        if summed:
            e(d, f"{t} part[{c.m * c.n}];")
            e(d, f"int64_t s0 = sg_tid * {count} / nt, s1 = (sg_tid + 1) * {count} / nt;")
            e(d, "for (int64_t bi = s0; bi < s1; ++bi) {")
        else:
            e(d, "#pragma omp for schedule(static)")
            e(d, f"for (int64_t bi = 0; bi < {count}; ++bi) {{")
        self._slice_nests(s.producer, s.scratch, d + 1)
        if s.operand == "c":
            c = replace(c, c="sg_slice", stride_c=0)
        a_step = c.sum_stride_a if summed else c.stride_a
        b_step = c.sum_stride_b if summed else c.stride_b
        a = "sg_slice" if s.operand == "a" else f"{c.a} + {c.offset_a} + bi * {a_step}"
        b = "sg_slice" if s.operand == "b" else f"{c.b} + {c.offset_b} + bi * {b_step}"
        if summed:
            e(d + 1, _partial_product(fn, c, a, b, f"bi > s0 ? 1.0{f} : 0.0{f}"))
        else:
            e(
                d + 1,
                f"{fn}(101, {112 if c.trans_a else 111}, {112 if c.trans_b else 111}, "
                f"{c.m}, {c.n}, {c.k}, {_alpha(c)}, {a}, {c.lda}, {b}, {c.ldb}, "
                f"{c.beta!r}{f}, {c.c} + bi * {c.stride_c}, {c.n});",
            )
        self._slice_nests(s.consumer, s.scratch, d + 1)
        e(d, "}")
        if summed:
            self.add_partials(c, d, "sg_tid")
        e(depth, "}")
        e(depth, "}")

    def collective(self, s: L.Collective, depth: int) -> None:
        """MPI through the pointers bound by ``sg_mpi_bind`` (``backends/c/collectives.py``)."""
        render_collective(s, self.type_name(s.dtype), self.emit, depth)

    def _slice_nests(self, nests: tuple[L.Loop, ...], scratch: str, depth: int) -> None:
        """Each nest with its outer variable fixed to ``bi`` and the scratch addressed
        through this thread's slice."""
        for nest in nests:
            body = L.rename_buffers(nest.body, lambda n: "sg_slice" if n == scratch else n)
            self.emit(depth, "{")
            self.emit(depth + 1, f"int64_t {nest.var.name} = bi;")
            self.stmts(body, depth + 1, parallel_ok=False)
            self.emit(depth, "}")


@dataclass(frozen=True)
class _BlockLoop(L.Stmt):
    """``for var in [j0, j1)``: one thread's block of a split row (render-time only)."""

    var: L.Var
    body: tuple[L.Stmt, ...]


def _row_of(nest: L.Loop) -> L.Loop | None:
    """The row loop of ``for r1.. (reduction): for j (parallel): stores``, when every store
    in it addresses memory by j (and outer, fixed variables) but never by a reduced one,
    so blocks of j are independent across all r. None otherwise."""
    reduced = []
    s: L.Stmt = nest
    while isinstance(s, L.Loop) and s.kind == "reduction" and len(s.body) == 1:
        reduced.append(s.var)
        s = s.body[0]
    if not (isinstance(s, L.Loop) and s.kind == "parallel" and s.var.extent > 1 and reduced):
        return None
    stores = [x for x in L.walk(s.body) if isinstance(x, L.Store)]
    if not stores or any(isinstance(x, L.Loop | L.Reduce | L.Contract) for x in L.walk(s.body)):
        return None
    for store in stores:
        if store.index.coef(s.var) == 0 or any(store.index.coef(r) for r in reduced):
            return None
        if any(isinstance(a, L.DivMod) for a in store.index.atoms()):
            return None
    return s


def _partial_transposed(s: L.Contract) -> bool:
    """Whether a thread's private partial of a summed product is kept transposed.

    The partial is private, so its layout is free: OpenBLAS runs the form with more
    rows than columns faster (CNN weight gradient m=32, n=144, k=784: 75 -> 102 GF/s;
    m=16, n=144: 62 -> 81; m=64, n=576, k=196: 121 -> 138; one thread, this machine)."""
    return s.m < s.n


def _partial_product(fn: str, s: L.Contract, a: str, b: str, beta: str) -> str:
    """The library call adding one product of the summed ``s`` into ``part``: ``m x n`` as
    written, or ``n x m`` as ``op(b)^T @ op(a)^T`` when ``_partial_transposed(s)``."""
    ta, tb = (112 if s.trans_a else 111), (112 if s.trans_b else 111)
    if not _partial_transposed(s):
        return (
            f"{fn}(101, {ta}, {tb}, {s.m}, {s.n}, {s.k}, {_alpha(s)}, "
            f"{a}, {s.lda}, {b}, {s.ldb}, {beta}, part, {s.n});"
        )
    flip = {111: 112, 112: 111}
    return (
        f"{fn}(101, {flip[tb]}, {flip[ta]}, {s.n}, {s.m}, {s.k}, {_alpha(s)}, "
        f"{b}, {s.ldb}, {a}, {s.lda}, {beta}, part, {s.m});"
    )


def _alpha(s: L.Contract) -> str:
    """The product's scale: a literal, times a run-time scalar when it has one."""
    f = "f" if s.dtype.name == "float32" else ""
    if s.alpha_buffer is None:
        return f"{s.alpha!r}{f}"
    return f"({s.alpha!r}{f} * {s.alpha_buffer}[{s.alpha_index}])"


def uses_blas(program: L.Program) -> bool:
    """Whether any kernel calls the matrix-multiply library."""
    return any(
        isinstance(s, L.Contract)
        for p in L.nested_programs(program)
        for k in p.kernels
        for s in L.walk(k.body)
    )


_PROFILE = r"""
#include <time.h>
static double sg_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
"""


# glibc's vector math library (libmvec) has SIMD versions of these; declaring them
# ``omp declare simd`` lets GCC vectorize loops that call them (glibc's own headers do this
# only under -ffast-math). libmvec's documented accuracy is 4 ulp at most.
_VECTOR_MATH = "".join(
    f"#pragma omp declare simd notinbranch\n{t} {fn}({args});\n"
    for t, fn, args in [
        ("float", "expf", "float"),
        ("float", "logf", "float"),
        ("float", "tanhf", "float"),
        ("float", "sinf", "float"),
        ("float", "cosf", "float"),
        ("float", "powf", "float, float"),
        ("double", "exp", "double"),
        ("double", "log", "double"),
        ("double", "tanh", "double"),
        ("double", "sin", "double"),
        ("double", "cos", "double"),
        ("double", "pow", "double, double"),
    ]
)


def render_c(program: L.Program, profile: bool = False, vector_math: bool = False) -> str:
    """The full C source of ``program`` (its I/O table already numbered).

    With ``profile`` every kernel adds its wall time to ``double sg_profile[k]``; with
    ``vector_math`` transcendental calls in vectorizable loops use libmvec (link ``-lmvec``).

    Example:
        >>> print(render_c(program))
    """
    w = CRenderer(program)
    w.lines.append(f"/* shapegrad generated: program {_comment_safe(program.name)} */")
    w.lines.append(_PRELUDE)
    if vector_math:
        w.lines.append(_VECTOR_MATH)
    if uses_blas(program):
        w.lines.append(_BLAS_DECL)
    w.lines.append(f"#define SG_NSLOTS {max(program.n_slots, 1)}")
    if program.communicators:
        w.lines.append(mpi_prelude(program))
    if profile:
        w.lines.append(_PROFILE)
        w.lines.append(f"double sg_profile[{max(len(program.kernels), 1)}];")
    w.lines.append("")
    head = len(w.lines)
    w.lines.append("static int sg_body(void **restrict io, char *restrict arena) {")
    w.emit(1, "(void)io; (void)arena;")
    for number, k in enumerate(program.kernels):
        w.kernel(k, number, profile)
    w.emit(1, "return 0;")
    w.lines.append("}")
    # layer bodies (declared first: a body may call a nested body defined after it)
    declared = [
        f"static int sg_layer{n}(void **restrict io, char *restrict arena);"
        for n in range(len(w.functions))
    ]
    w.lines[head:head] = declared + w.functions
    w.lines.append(_STEPS)
    return "\n".join(w.lines) + "\n"


def _comment_safe(text: str) -> str:
    """``text`` made harmless inside a C comment (a user-chosen function name)."""
    return "".join(ch if ch.isalnum() or ch in "_.-<> " else "_" for ch in text)
