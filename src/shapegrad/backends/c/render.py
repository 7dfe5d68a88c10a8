"""The C renderer: loop IR -> one readable C translation unit.

Layout of the generated file:

* helpers (NaN-propagating max/min, C-semantics integer division and power,
  the counter-based random generator shared with ``reference.random_uniform``);
* ``static int sg_body(void **io, char *arena)``: one ``{ ... }`` block per
  kernel. Buffer pointers are declared ``restrict`` *inside* each block, so
  temps that share arena bytes in different kernels never alias within one
  restrict scope. Returns 0, or the error code of a failed bounds check;
* ``int sg_run(void **io, char *arena)``: one call;
* ``int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step)``:
  ``k`` calls, advancing each I/O pointer by ``step[slot]`` bytes per call
  (stacked batches in, stacked outputs out, persistent state untouched);
* ``void sg_set_threads(int n)``: OpenMP team size and OpenBLAS threads;
* ``const char sg_key[]`` (appended by the toolchain): the cache key, checked after
  ``dlopen``.

``#pragma omp parallel for`` goes only on the outermost parallel loop of a
kernel whose estimated work is at least ``OMP_MIN_WORK`` scalar ops: below
that the fork/join (a few µs on this machine) costs more than it saves.
"""

from __future__ import annotations

import math
from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.segments import segments, specialize
from shapegrad.dtypes import DType

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

static inline float sg_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float sg_minf(float a, float b) { return (a < b || a != a) ? a : b; }
static inline double sg_maxd(double a, double b) { return (a > b || a != a) ? a : b; }
static inline double sg_mind(double a, double b) { return (a < b || a != a) ? a : b; }
static inline int32_t sg_maxi(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t sg_mini(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t sg_idiv(int32_t a, int32_t b) {
    /* NumPy reference: x / 0 -> x; INT_MIN / -1 wraps (never UB). */
    if (b == 0) return a;
    if (b == -1) return (int32_t)(0u - (uint32_t)a);
    return a / b;
}
static inline int32_t sg_ipow(int32_t a, int32_t b) {
    uint32_t r = 1u, base = (uint32_t)a;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) { if (b & 1) r *= base; base *= base; b >>= 1; }
    return (int32_t)r;
}
static inline double sg_rand(uint32_t counter, uint32_t seed_mix) {
    uint32_t x = counter + seed_mix;
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (double)(x >> 8) * (1.0 / 16777216.0);
}
"""

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

int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step) {
    void *local[SG_NSLOTS + 1];
    for (int64_t t = 0; t < k; ++t) {
        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];
        int rc = sg_body(local, arena);
        if (rc) return rc;
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

_FLOAT_FN = {
    "exp": "exp",
    "log": "log",
    "sin": "sin",
    "cos": "cos",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "abs": "fabs",
}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_COMPARE = {"lt": "<", "le": "<=", "eq": "==", "ne": "!="}


def ctype(dtype: DType) -> str:
    """The C spelling of an element type."""
    return dtype.c_name


def render_const(c: L.Const) -> str:
    v, dtype = c.value, c.dtype
    if dtype.is_float:
        f = float(v)
        if math.isnan(f):
            text = "NAN"
        elif math.isinf(f):
            text = "INFINITY" if f > 0 else "(-INFINITY)"
        else:
            text = repr(f) + ("f" if dtype.name == "float32" else "")
            if dtype.name == "float16":
                return f"(({ctype(dtype)}){f!r})"
        return text if dtype.name != "float16" else f"(({ctype(dtype)}){text})"
    if dtype.name == "bool":
        return "1" if v else "0"
    iv = int(v)
    return "(-2147483647 - 1)" if iv == -(2**31) else str(iv)


def render_affine(a: L.Affine) -> str:
    parts = []
    for atom, coef in a.terms:
        text = atom.name if isinstance(atom, L.Var) else _divmod(atom)
        parts.append(text if coef == 1 else f"{coef} * {text}")
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")


def _divmod(atom: L.DivMod) -> str:
    return f"(({render_affine(atom.inner)}) {'%' if atom.is_mod else '/'} {atom.divisor})"


def _suffix(dtype: DType) -> str:
    return "f" if dtype.name in ("float32", "float16") else ""


def render_expr(e: L.Expr) -> str:
    """C expression text for a scalar loop-IR expression."""
    if isinstance(e, L.Const):
        return render_const(e)
    if isinstance(e, L.Load):
        return f"{e.buffer}[{render_affine(e.index)}]"
    if isinstance(e, L.Ref):
        return e.name
    if isinstance(e, L.Unary):
        return _unary(e)
    if isinstance(e, L.Binary):
        return _binary(e.op, e.dtype, render_expr(e.a), render_expr(e.b), e.a.dtype)
    if isinstance(e, L.Select):
        return f"({render_expr(e.cond)} ? {render_expr(e.a)} : {render_expr(e.b)})"
    if isinstance(e, L.Cast):
        if e.dtype.name == "bool":
            return f"(uint8_t)({render_expr(e.x)} != 0)"
        return f"({ctype(e.dtype)})({render_expr(e.x)})"
    if isinstance(e, L.IndexValue):
        return f"(int32_t)({render_affine(e.index)})"
    if isinstance(e, L.InRange):
        x = render_affine(e.index)
        return f"({e.lo} <= ({x}) && ({x}) < {e.hi})"
    if isinstance(e, L.Random):
        mix = (e.seed * 0x9E3779B9) & 0xFFFFFFFF
        return f"({ctype(e.dtype)})sg_rand((uint32_t)({render_affine(e.counter)}), {mix}u)"
    raise NotImplementedError(f"C renderer: no rule for {type(e).__name__}")


def _unary(e: L.Unary) -> str:
    x = render_expr(e.x)
    if e.op == "neg":
        return f"(-{x})"
    if not e.dtype.is_float:
        return f"({x} < 0 ? -{x} : {x})" if e.op == "abs" else x
    fn = _FLOAT_FN[e.op] + _suffix(e.dtype)
    if e.dtype.name == "float16":
        return f"(({ctype(e.dtype)}){fn}((float){x}))"
    return f"{fn}({x})"


def _binary(op: str, dtype: DType, a: str, b: str, operand: DType) -> str:
    if op in _COMPARE:
        return f"(uint8_t)({a} {_COMPARE[op]} {b})"
    if op == "and":
        return f"({a} && {b})"
    if op == "add" and dtype.name == "bool":
        return f"(uint8_t)({a} | {b})"
    if op in _ARITH:
        if dtype.name == "int32" and op != "sub":
            # wrap like NumPy instead of signed-overflow UB
            return f"(int32_t)((uint32_t){a} {_ARITH[op]} (uint32_t){b})"
        if dtype.name == "int32":
            return f"(int32_t)((uint32_t){a} - (uint32_t){b})"
        return f"({a} {_ARITH[op]} {b})"
    if op == "div":
        return f"({a} / {b})" if dtype.is_float else f"sg_idiv({a}, {b})"
    if op == "pow":
        if not dtype.is_float:
            return f"sg_ipow({a}, {b})"
        if dtype.name == "float16":
            return f"(({ctype(dtype)})powf((float){a}, (float){b}))"
        return f"pow{_suffix(dtype)}({a}, {b})"
    if op in ("max", "min"):
        if dtype.name == "bool":
            return f"({a} {'|' if op == 'max' else '&'} {b})"
        kind = {"float32": "f", "float64": "d", "int32": "i"}.get(dtype.name)
        if kind is None:
            return f"(({ctype(dtype)})sg_{op}f((float){a}, (float){b}))"
        return f"sg_{op}{kind}({a}, {b})"
    raise NotImplementedError(f"C renderer: binary {op}")


class _Writer:
    def __init__(self, program: L.Program) -> None:
        self.program = program
        self.lines: list[str] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def kernel(self, k: L.Kernel, number: int, profile: bool) -> None:
        self.emit(1, f"/* {k.name}: root {k.root}; work {k.work} */")
        if k.inlined:
            self.emit(1, f"/*   inlined: {', '.join(k.inlined)} */")
        self.emit(1, "{")
        if profile:
            self.emit(2, "double sg_t0 = sg_now();")
        used = sorted(_buffers_of(k.body))
        for name in used:
            self.emit(2, self._pointer(name))
        # Kernels made of several loop nests (concat parts, a library call and its
        # epilogue) judge each nest on its own size; a single nest uses the kernel's work.
        per_nest = len(k.body) > 1 or any(isinstance(s, L.Contract) for s in k.body)
        for s in k.body:
            work = _nest_size(s) if per_nest else k.work
            self.stmt(s, 2, parallel_ok=work >= OMP_MIN_WORK)
        if profile:
            self.emit(2, f"sg_profile[{number}] += sg_now() - sg_t0;")
        self.emit(1, "}")

    def _pointer(self, name: str) -> str:
        spec = self.program.buffers[name]
        t = ctype(spec.dtype)
        const = "const " if spec.kind in ("input", "const") else ""
        src = f"(arena + {spec.offset})" if spec.kind == "temp" else f"io[{spec.slot}]"
        return f"{const}{t} *restrict {name} = ({const}{t} *){src};"

    def stmts(self, body: tuple[L.Stmt, ...], depth: int, parallel_ok: bool) -> None:
        for s in body:
            self.stmt(s, depth, parallel_ok)

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        if isinstance(s, L.Loop):
            if parallel_ok and s.kind == "parallel" and s.var.extent > 1:
                self.emit(
                    depth, "#pragma omp parallel for schedule(static) num_threads(sg_threads)"
                )
                parallel_ok = False
            elif (segs := segments(s)) is not None:
                for lo, hi in segs:  # no per-element range tests inside (pads, col2im)
                    v = s.var.name
                    self.emit(depth, f"for (int64_t {v} = {lo}; {v} < {hi}; ++{v}) {{")
                    self.stmts(specialize(s.body, s.var, lo, hi), depth + 1, parallel_ok)
                    self.emit(depth, "}")
                return
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = 0; {v} < {s.var.extent}; ++{v}) {{")
            self.stmts(s.body, depth + 1, parallel_ok)
            self.emit(depth, "}")
        elif isinstance(s, L.Store):
            self.emit(depth, _store(s, self.program))
        elif isinstance(s, L.Local):
            self.emit(depth, f"{ctype(s.dtype)} {s.name}[{s.size}];")
        elif isinstance(s, L.Declare):
            self.emit(depth, f"{ctype(s.init.dtype)} {s.name} = {render_expr(s.init)};")
        elif isinstance(s, L.Accumulate):
            ref = L.Ref(s.value.dtype, s.name)
            value = _binary(s.op, s.value.dtype, s.name, render_expr(s.value), s.value.dtype)
            self.emit(depth, f"{render_expr(ref)} = {value};")
        elif isinstance(s, L.IndexLoad):
            v = s.var.name
            self.emit(depth, f"int64_t {v} = {s.buffer}[{render_affine(s.index)}];")
            self.emit(depth, f"if ({v} < 0) {v} += {s.var.extent};")
        elif isinstance(s, L.CheckBounds):
            self.emit(depth, f"for (int64_t q = 0; q < {s.size}; ++q)")
            self.emit(
                depth + 1,
                f"if ({s.buffer}[q] < -{s.n} || {s.buffer}[q] >= {s.n}) return {s.code};",
            )
        elif isinstance(s, L.Contract):
            self.contract(s, depth)
        elif isinstance(s, L.BatchFused):
            self.batch_fused(s, depth)
        else:
            raise NotImplementedError(f"C renderer: statement {type(s).__name__}")

    def contract(self, s: L.Contract, depth: int) -> None:
        """Library products; large ones are split into row blocks across the OpenMP team
        (each block a single-threaded BLAS call), see ``sg_set_threads``."""
        fn = "scipy_cblas_sgemm" if s.dtype.name == "float32" else "scipy_cblas_dgemm"
        f = "f" if s.dtype.name == "float32" else ""
        one, alpha, beta = f"1.0{f}", f"{s.alpha!r}{f}", f"{s.beta!r}{f}"
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
        t, f = ctype(s.dtype), ("f" if s.dtype.name == "float32" else "")
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
        e(
            d + 1,
            f"{fn}(101, {112 if s.trans_a else 111}, {112 if s.trans_b else 111}, "
            f"{s.m}, {s.n}, {s.k}, {s.alpha!r}{f}, "
            f"{s.a} + {s.offset_a} + si * {s.sum_stride_a}, {s.lda}, "
            f"{s.b} + {s.offset_b} + si * {s.sum_stride_b}, {s.ldb}, "
            f"si > s0 ? 1.0{f} : 0.0{f}, part, {s.n});",
        )
        self.add_partials(s, d, "tid")
        e(depth, "}")
        e(depth, "}")

    def add_partials(self, s: L.Contract, d: int, tid: str) -> None:
        """Add each thread's ``part`` (its products ``s0 <= si < s1``) into ``s.c``, in
        thread order; thread 0 also applies ``beta``."""
        e, f, size = self.emit, ("f" if s.dtype.name == "float32" else ""), s.m * s.n
        e(d, "for (int q = 0; q < nt; ++q) {")
        e(d + 1, "#ifdef _OPENMP")
        e(d + 1, "#pragma omp barrier")
        e(d + 1, "#endif")
        e(d + 1, f"if (q != {tid}) continue;")
        init = f"0.0{f}" if s.beta == 0.0 else f"{s.beta!r}{f} * {s.c}[i]"
        e(d + 1, "if (q == 0)")
        e(
            d + 2,
            f"for (int64_t i = 0; i < {size}; ++i) {s.c}[i] = {init} + (s1 > s0 ? part[i] : 0.0{f});",
        )
        e(d + 1, "else if (s1 > s0)")
        e(d + 2, f"for (int64_t i = 0; i < {size}; ++i) {s.c}[i] += part[i];")
        e(d, "}")

    def batch_fused(self, s: L.BatchFused, depth: int) -> None:
        """Per batch index: the producer nests write this thread's scratch slice, then one
        library call reads it (see ``loops.BatchFused``)."""
        c, e = s.contract, self.emit
        fn = "scipy_cblas_sgemm" if c.dtype.name == "float32" else "scipy_cblas_dgemm"
        t, f = ctype(c.dtype), ("f" if c.dtype.name == "float32" else "")
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
        if summed:
            e(d, f"{t} part[{c.m * c.n}];")
            e(d, f"int64_t s0 = sg_tid * {count} / nt, s1 = (sg_tid + 1) * {count} / nt;")
            e(d, "for (int64_t bi = s0; bi < s1; ++bi) {")
        else:
            e(d, "#pragma omp for schedule(static)")
            e(d, f"for (int64_t bi = 0; bi < {count}; ++bi) {{")
        for nest in s.producer:
            e(d + 1, "{")
            e(d + 2, f"int64_t {nest.var.name} = bi;")
            self.stmts(nest.body, d + 2, parallel_ok=False)
            e(d + 1, "}")
        if s.operand == "c":
            c = replace(c, c=f"{s.scratch} + sg_tid * {s.slice}", stride_c=0)
        fed = f"{s.scratch} + sg_tid * {s.slice}"
        a_step = c.sum_stride_a if summed else c.stride_a
        b_step = c.sum_stride_b if summed else c.stride_b
        a = fed if s.operand == "a" else f"{c.a} + {c.offset_a} + bi * {a_step}"
        b = fed if s.operand == "b" else f"{c.b} + {c.offset_b} + bi * {b_step}"
        beta = f"bi > s0 ? 1.0{f} : 0.0{f}" if summed else f"{c.beta!r}{f}"
        out = "part" if summed else f"{c.c} + bi * {c.stride_c}"
        e(
            d + 1,
            f"{fn}(101, {112 if c.trans_a else 111}, {112 if c.trans_b else 111}, "
            f"{c.m}, {c.n}, {c.k}, {c.alpha!r}{f}, {a}, {c.lda}, {b}, {c.ldb}, "
            f"{beta}, {out}, {c.n});",
        )
        for nest in s.consumer:
            e(d + 1, "{")
            e(d + 2, f"int64_t {nest.var.name} = bi;")
            self.stmts(nest.body, d + 2, parallel_ok=False)
            e(d + 1, "}")
        e(d, "}")
        if summed:
            self.add_partials(c, d, "sg_tid")
        e(depth, "}")
        e(depth, "}")


def _nest_size(s: L.Stmt) -> int:
    """Iterations of the innermost statements of a loop nest (1 for a non-loop)."""
    if not isinstance(s, L.Loop):
        return 1
    return s.var.extent * max((_nest_size(x) for x in s.body), default=1)


def _store(s: L.Store, program: L.Program) -> str:
    target = f"{s.buffer}[{render_affine(s.index)}]"
    value = render_expr(s.value)
    if s.accumulate is None:
        return f"{target} = {value};"
    dtype = s.value.dtype
    return f"{target} = {_binary(s.accumulate, dtype, target, value, dtype)};"


def _buffers_of(body: tuple[L.Stmt, ...]) -> set[str]:
    from shapegrad.compiler.memory import buffers_read, buffers_written

    k = L.Kernel("_", body, 0, "_")
    return buffers_read(k) | buffers_written(k)


def uses_blas(program: L.Program) -> bool:
    """Whether any kernel calls the matrix-multiply library."""
    from shapegrad.compiler.memory import _walk

    return any(isinstance(s, L.Contract) for k in program.kernels for s in _walk(k.body))


_PROFILE = r"""
#include <time.h>
static double sg_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
"""


def render_c(program: L.Program, n_slots: int, profile: bool = False) -> str:
    """The full C source of ``program`` (``n_slots`` entries in the I/O table).

    With ``profile`` every kernel adds its wall time to ``double sg_profile[k]``.

    Example:
        >>> print(render_c(lowered.program, 4))
    """
    w = _Writer(program)
    w.lines.append(f"/* shapegrad generated: program {program.name} */")
    w.lines.append(_PRELUDE)
    if uses_blas(program):
        w.lines.append(_BLAS_DECL)
    w.lines.append(f"#define SG_NSLOTS {n_slots}")
    if profile:
        w.lines.append(_PROFILE)
        w.lines.append(f"double sg_profile[{max(len(program.kernels), 1)}];")
    w.lines.append("")
    w.lines.append("static int sg_body(void **restrict io, char *restrict arena) {")
    w.emit(1, "(void)io; (void)arena;")
    for number, k in enumerate(program.kernels):
        w.kernel(k, number, profile)
    w.emit(1, "return 0;")
    w.lines.append("}")
    w.lines.append(_STEPS)
    return "\n".join(w.lines) + "\n"
