"""The C renderer: loop IR -> one readable C translation unit (a ``CStyleRenderer``).

Layout of the generated file:

* helpers (``backends/cstyle.py``: NaN-propagating max/min, integer division and
  power, the counter-based random generator);
* ``static int sg_body(void **io, char *arena)``: one ``{ ... }`` block per
  kernel (or per part of a kernel, see below). Buffer pointers are declared
  ``restrict`` *inside* each block, so temps that share arena bytes in different
  kernels never alias within one restrict scope. Returns 0, or the code of the first
  failed bounds check (the error-flag contract of ``compiler/loops.py``): a
  ``return`` outside an OpenMP region, a per-group flag inside one;
* ``int sg_run(void **io, char *arena)``: one call;
* ``int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step,
  int64_t *done)``: ``k`` calls, advancing each I/O pointer by ``step[slot]``
  bytes per call (stacked batches in, stacked outputs out, persistent state
  untouched); stops at the first failing step, ``*done`` = steps completed;
* ``void sg_set_threads(int n, int adaptive)``: OpenMP team size and OpenBLAS threads;
  ``adaptive`` 1: a step runs with the full team or one thread, whichever was faster
  lately; 0: always the full team; 2: always one thread (blocks still cut for ``n``);
* with collectives, ``int sg_mpi_bind(...)``: the MPI entry points the host hands
  in after loading (``backends/c/collectives.py``);
* ``const char sg_key[]`` (appended by the toolchain): the cache key, checked after
  ``dlopen``.

Scheduling (this renderer's own policy, not the IR's): a step with anything worth
splitting is one ``#pragma omp parallel`` region (``schedule.py``): loop nests whose
estimated work (``cstyle.estimate_work``) is at least ``REGION_MIN_WORK`` become orphaned
``omp for`` loops with dynamic chunks of about ``schedule.CHUNK_WORK`` scalar ops; large
library products are split into blocks of rows or columns of the result (or over their
summed axis), each block one single-threaded BLAS call, taken dynamically; batch-fused
products give each thread its own scratch slice; serial kernels run under ``omp single``;
barriers stand only where a later unit touches memory an earlier one writes. Programs
with layer loops or collectives keep one ``parallel for`` per large loop (``OMP_MIN_WORK``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from shapegrad.backends.c.collectives import mpi_prelude, render_collective
from shapegrad.backends.c.schedule import Tracker, Unit, chunk_size, fork_only, split_units
from shapegrad.backends.c.teamsplit import TeamRenderer, split_kind, split_parts
from shapegrad.backends.cstyle import HELPERS, estimate_work
from shapegrad.compiler import loops as L

# Fork/join of a 2-thread OpenMP team costs ~2-5 µs here; a kernel needs roughly this many
# scalar ops (≈ 20-40 µs of work) before splitting it pays off.
OMP_MIN_WORK = 1 << 18
# One OpenMP region per step (``CRenderer.body``); False: one region per large loop.
ONE_REGION = True
# Inside the step's one region a split loop costs no fork, only the wait for the slowest
# thread where a later kernel needs its result, so smaller loops are worth splitting there.
REGION_MIN_WORK = 1 << 18
# The static C text every unit starts with (packaged ``runtime.h``: team size, adaptive
# team, flush-to-zero, thread helpers), then the scalar helpers shared with CUDA. Inlined,
# not ``#include``d by path: the text is part of each unit's source and so of its cache key.
_PRELUDE = resources.files("shapegrad.backends.c").joinpath("runtime.h").read_text(
    encoding="utf-8"
) + HELPERS.format(q="static inline")

_BLAS_DECL = r"""
#define SG_USES_BLAS 1
void scipy_openblas_set_num_threads(int);
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double *, int,
                       const double *, int, double, double *, int);
"""

_STEPS = r"""
SG_HIDDEN int sg_threads = 1;
SG_HIDDEN int sg_adaptive = 1;
SG_HIDDEN unsigned sg_team_epoch;

int sg_run(void **io, char *arena) {
    SG_FP_ENTER;
    int rc = sg_body(io, arena);
    SG_FP_LEAVE;
    return rc;
}

int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step, int64_t *done) {
    void *local[SG_NSLOTS + 1];
    int rc = 0;
    SG_FP_ENTER;
    *done = 0;
    for (int64_t t = 0; t < k; ++t) {
        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];
        rc = sg_body(local, arena);
        if (rc) break;
        *done = t + 1;
    }
    SG_FP_LEAVE;
    return rc;
}

void sg_set_threads(int n, int adaptive) {
    sg_threads = n > 0 ? n : 1;
    sg_adaptive = adaptive;
    ++sg_team_epoch; /* every unit's region resets its probe state on its next call */
#ifdef SG_USES_BLAS
    scipy_openblas_set_num_threads(1); /* we split products across our own threads */
#endif
    (void)n;
}
"""


class CRenderer(TeamRenderer):
    """C with OpenMP scheduling and OpenBLAS products (see the module docstring).

    ``mode`` says how the statement being rendered runs: ``"fork"`` (no enclosing region:
    a large loop opens its own ``parallel for``; layer bodies and programs with
    collectives), ``"shared"`` (inside the step's region, split by an orphaned
    work-sharing construct) or ``"serial"`` (inside the region, on one thread).
    """

    def __init__(self, program: L.Program) -> None:
        super().__init__(program)
        # functions of layer-loop bodies, shared by the renderers of one translation unit
        self.functions: list[str] = []
        self._fail_to: tuple[int, str] | None = None  # (flag index, skip label) in a region

    def body(self, kernels: list[L.Kernel], profile: bool, depth: int = 1, first: int = 0) -> None:
        """The statements of ``sg_body`` after its opening line, ending in ``return``.

        With at least one statement worth splitting (and no layer loop or collective),
        the whole step is one ``#pragma omp parallel`` region (``schedule.py``): shared
        units are orphaned ``omp for`` loops, runs of serial units one ``omp single``,
        barriers only where a later unit touches what an earlier one writes. A group that
        can fail records its code in its own ``sg_fail[g]``; after the group a barrier
        and a test of that flag send every thread to ``sg_end`` together, so the first
        failing check's code is returned and the rest skipped.
        """
        one = ONE_REGION and not fork_only(self.program)
        units = split_units(kernels, self.shareable, first) if one else []
        if not any(u.shared for u in units):
            for number, k in enumerate(kernels, first):
                self.kernel(k, number, profile)
            self.emit(depth, "return 0;")
            return
        groups: list[list[Unit]] = []
        for u in units:
            if u.shared or not groups or groups[-1][0].shared:
                groups.append([u])
            else:
                groups[-1].append(u)
        failing = [g for g in groups if any(u.fails for u in g)]
        e = self.emit
        if failing:
            e(depth, f"int sg_fail[{len(failing)}] = {{0}};")
        e(depth, "const int sg_pick = sg_team_pick();")
        e(depth, "const double sg_start = sg_threads > 1 && sg_adaptive == 1 ? sg_clock() : 0.0;")
        e(depth, f"#pragma omp parallel num_threads(sg_pick ? {self._team_size(kernels)} : 1)")
        e(depth, "{")
        d = depth + 1
        if self.flush_denormals:
            e(d, "SG_FP_ENTER;")
        pending = Tracker(self.program)
        for group in groups:
            reads = set().union(*(u.reads for u in group))
            writes = set().union(*(u.writes for u in group))
            if pending.needs_barrier(reads, writes) or profile:
                e(d, "#pragma omp barrier")
                pending.clear()
            pending.add(reads, writes)
            if group[0].shared:
                self._unit(group[0], d, profile)
                continue
            flag = failing.index(group) if group in failing else -1
            e(d, "#pragma omp single nowait")
            e(d, "{")
            self._fail_to = (flag, f"sg_skip{flag}") if flag >= 0 else None
            for u in group:
                self._unit(u, d + 1, profile)
            self._fail_to = None
            if flag >= 0:
                e(d + 1, f"sg_skip{flag}:;")
            e(d, "}")
            if flag >= 0:
                e(d, "#pragma omp barrier")
                e(d, f"if (sg_fail[{flag}]) goto sg_end;")
                pending.clear()
        if failing:
            e(d, "sg_end:;")
        if self.flush_denormals:
            e(d, "SG_FP_LEAVE;")
        e(depth, "}")
        e(depth, "if (sg_start != 0.0) sg_team_record(sg_pick, sg_clock() - sg_start);")
        if failing:
            e(depth, f"for (int g = 0; g < {len(failing)}; ++g)")
            e(depth + 1, "if (sg_fail[g]) return sg_fail[g];")
        e(depth, "return 0;")
        self.mode = "fork"

    def _team_size(self, kernels: list[L.Kernel]) -> str:
        """The region's team: ``sg_threads``, at most the scratch slices of any batch-fused
        product (each thread of the team owns one)."""
        slots = [s.slots for k in kernels for s in L.walk(k.body) if isinstance(s, L.BatchFused)]
        if not slots:
            return "sg_threads"
        return f"(sg_threads < {min(slots)} ? sg_threads : {min(slots)})"

    def shareable(self, s: L.Stmt) -> bool:
        """Whether the renderer splits top-level statement ``s`` across the team (the same
        decisions as ``loop`` and ``contract`` make in fork mode)."""
        if isinstance(s, L.BatchFused):
            return True
        if isinstance(s, L.Contract):
            return split_kind(s) is not None
        if isinstance(s, L.Loop) and estimate_work(s) >= REGION_MIN_WORK:
            if s.kind == "parallel" and s.var.extent > 1:
                return True
            return s.kind == "reduction" and _row_of(s) is not None
        return False

    def _unit(self, u: Unit, depth: int, profile: bool) -> None:
        k = u.kernel
        self.emit(
            depth, f"/* {k.name}: root {k.root}; work {k.work}{' (shared)' if u.shared else ''} */"
        )
        if k.inlined:
            self.emit(depth, f"/*   inlined: {', '.join(k.inlined)} */")
        self.emit(depth, "{")
        if profile:
            self.emit(depth + 1, "double sg_t0 = sg_now();")
        for name in sorted(u.reads | u.writes):
            self.emit(depth + 1, self._pointer(name))
        self.mode = "shared" if u.shared else "serial"
        for s in u.body:
            self.stmt(s, depth + 1, parallel_ok=u.shared)
        if profile:
            if u.shared:  # thread 0 times the whole construct, stragglers included
                self.emit(depth + 1, "#pragma omp barrier")
                self.emit(depth + 1, "if (sg_thread_id() == 0)")
                self.emit(depth + 2, f"sg_profile[{u.number}] += sg_now() - sg_t0;")
            else:
                self.emit(depth + 1, f"sg_profile[{u.number}] += sg_now() - sg_t0;")
        self.emit(depth, "}")

    def kernel(self, k: L.Kernel, number: int, profile: bool) -> None:
        self.mode = "fork"
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
            self.work_sharing(depth, f"dynamic, {chunk_size(s)}")
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = 0; {v} < {s.var.extent}; ++{v}) {{")
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            self.end_work_sharing(depth)
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
        parts = split_parts()
        self.work_sharing(depth, "dynamic, 1")
        e(depth, f"for (int64_t part = 0; part < {parts}; ++part) {{")
        e(depth + 1, f"const int64_t j0 = part * {j.extent} / {parts};")
        e(depth + 1, f"const int64_t j1 = (part + 1) * {j.extent} / {parts};")

        def blocked(x: L.Stmt) -> L.Stmt:
            return _BlockLoop(j, x.body) if isinstance(x, L.Loop) and x.var == j else x

        self.stmts(L.map_body((nest,), stmt=blocked), depth + 1, False)
        e(depth, "}")
        self.end_work_sharing(depth)

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        if isinstance(s, _BlockLoop):
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = j0; {v} < j1; ++{v}) {{")
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            return
        super().stmt(s, depth, parallel_ok)

    def fail(self, code: int) -> str:
        if self._fail_to is None:
            return f"return {code};"
        flag, label = self._fail_to
        return f"{{ sg_fail[{flag}] = {code}; goto {label}; }}"

    def layer_loop(self, s: L.LayerLoop, depth: int) -> None:
        """The body as its own function (rendered once), called per layer with its I/O
        table pointing at the layer's slices (see ``loops.LayerLoop``)."""
        fn = f"sg_layer{len(self.functions)}"
        self.functions.append("")  # reserve the number; nested bodies come first
        sub = CRenderer(s.body)
        sub.functions = self.functions
        sub.flush_denormals = self.flush_denormals
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

    def collective(self, s: L.Collective, depth: int) -> None:
        """MPI through the pointers bound by ``sg_mpi_bind`` (``backends/c/collectives.py``)."""
        render_collective(s, self.type_name(s.dtype), self.emit, depth)


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


@dataclass(frozen=True)
class CUnit:
    """One translation unit of a program's library: ``name`` (``"step"`` for the unit with
    ``sg_run``; ``"kernels<n>"`` for a group of kernels), its full ``source``, and
    ``lines``, its rendered size (the kernel lines, without the shared header)."""

    name: str
    source: str
    lines: int


# A unit holds about this many generated lines (consecutive kernels, never split), as ONE
# function: gcc's per-function overhead made one function per kernel cost 12-20% more
# compiler CPU than one per unit (GPT step 3.0-3.2 vs 2.7-2.9 s; 64-layer MLP 1.8-1.9 vs
# 1.5 s). Units of 600 or 1200 lines cost the same CPU (GPT 2.7-2.9 s, MLP 1.5 s); 600
# gives 7-8 units, which balance better over the compiler processes and recompile less
# after an edit. Per unit, gcc's start-up is ~0.1 s wall (cc1 + as; the 70-line shared
# header parses in 0.04 s).
UNIT_LINES = 600
# Programs below this many kernel lines stay one unit. Measured (gcc 12, -O2, compiler CPU
# seconds, one unit vs 600-line units + step unit + link, load average 7 so wall times are
# not comparable): MLP step depth 8 (~700 lines) 0.18 vs 0.21, depth 16 (~1300) 0.35 vs
# 0.37, depth 32 (~2000) 0.82 vs 0.76, depth 64 (3900) 1.9 vs 1.5, GPT (4400) 2.5-2.8 vs
# 2.7-2.8. On two free cores the split finishes in about half its CPU time, so it pays
# from ~1000 lines on; below, the extra units and the link cost more than they save.
SPLIT_MIN_LINES = 1000


def _header(
    program: L.Program, profile: bool, vector_math: bool, flush_denormals: bool
) -> list[str]:
    """What every unit of ``program`` starts with: includes, helpers, shared declarations."""
    lines = [f"/* shapegrad generated: program {_comment_safe(program.name)} */"]
    if flush_denormals:
        lines.append("#define SG_FLUSH_DENORMALS 1")
    lines.append(_PRELUDE)
    if vector_math:
        lines.append(_VECTOR_MATH)
    if uses_blas(program):
        lines.append(_BLAS_DECL)
    lines.append(f"#define SG_NSLOTS {max(program.n_slots, 1)}")
    if program.communicators:
        lines.append(mpi_prelude(program))
    if profile:
        lines.append(_PROFILE)
        lines.append(f"extern double sg_profile[{max(len(program.kernels), 1)}];")
    return lines


def _profile_storage(program: L.Program, profile: bool) -> list[str]:
    return [f"double sg_profile[{max(len(program.kernels), 1)}];"] if profile else []


def _kernel_lines(program: L.Program) -> list[int]:
    """Each kernel's rendered size in lines (its block and its layer functions), to cut the
    program into units; rendered on its own, outside any region."""
    w = CRenderer(program)
    sizes = []
    for number, k in enumerate(program.kernels):
        first_line, first_fn = len(w.lines), len(w.functions)
        w.kernel(k, number, False)
        functions = w.functions[first_fn:]
        sizes.append(len(w.lines) - first_line + sum(f.count("\n") + 1 for f in functions))
    return sizes


def _function(
    program: L.Program,
    kernels: list[L.Kernel],
    first: int,
    signature: str,
    profile: bool,
    flush_denormals: bool,
) -> list[str]:
    """``signature`` with ``kernels`` as its body (one OpenMP region when anything is worth
    splitting, ``CRenderer.body``), preceded by the layer functions it calls."""
    w = CRenderer(program)
    w.flush_denormals = flush_denormals
    w.lines.append(signature + " {")
    w.emit(1, "(void)io; (void)arena;")
    w.body(kernels, profile, first=first)
    w.lines.append("}")
    # layer bodies (declared first: a body may call a nested body defined after it)
    declared = [
        f"static int sg_layer{n}(void **restrict io, char *restrict arena);"
        for n in range(len(w.functions))
    ]
    return declared + w.functions + w.lines


def render_c(
    program: L.Program,
    profile: bool = False,
    vector_math: bool = False,
    flush_denormals: bool = False,
) -> str:
    """The full C source of ``program`` (its I/O table already numbered) as one unit.

    With ``profile`` every kernel adds its wall time to ``double sg_profile[k]``; with
    ``vector_math`` transcendental calls in vectorizable loops use libmvec (link ``-lmvec``);
    with ``flush_denormals`` the entry points and every thread of their OpenMP teams run
    with denormal floats flushed to zero (x86 MXCSR FTZ and DAZ, aarch64 FPCR FZ), and
    restore their previous mode when the call returns.

    Example:
        >>> print(render_c(program))
    """
    lines = [*_header(program, profile, vector_math, flush_denormals)]
    lines += [*_profile_storage(program, profile), ""]
    signature = "static int sg_body(void **restrict io, char *restrict arena)"
    lines += _function(program, list(program.kernels), 0, signature, profile, flush_denormals)
    lines.append(_STEPS)
    return "\n".join(lines) + "\n"


def render_c_units(
    program: L.Program,
    profile: bool = False,
    vector_math: bool = False,
    unit_lines: int = UNIT_LINES,
    split_min_lines: int = SPLIT_MIN_LINES,
    flush_denormals: bool = False,
) -> list[CUnit]:
    """``program`` as translation units compiled separately (in parallel, each cached by its
    own content) and linked into one library: the step unit (``sg_body`` calling one
    function per kernel unit, ``sg_run``/``sg_run_steps``/``sg_set_threads``) plus kernel
    units of about ``unit_lines`` lines each.

    Kernel unit ``g`` holds consecutive kernels as the body of one function
    ``SG_HIDDEN int sg_kernels<g>(void **io, char *arena)`` (one OpenMP region of its own,
    see ``CRenderer.body``), returning 0 or the first error code; state shared by the units
    (``sg_threads``, ``sg_adaptive``, ``sg_team_epoch``, ``sg_profile``) is declared
    ``extern`` in the common header and defined in the step unit. Programs under
    ``split_min_lines`` lines, and programs with collectives (their MPI entry points are
    per-unit statics), stay one unit (:func:`render_c`).
    """
    sizes = _kernel_lines(program)
    total = sum(sizes)
    if total < split_min_lines or program.communicators or len(sizes) < 2:
        source = render_c(program, profile, vector_math, flush_denormals)
        return [CUnit("step", source, total)]
    header = _header(program, profile, vector_math, flush_denormals)
    groups: list[list[int]] = [[]]
    size = 0
    for n, kernel_lines in enumerate(sizes):
        if groups[-1] and size >= unit_lines:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += kernel_lines
    units = []
    signature = "(void **restrict io, char *restrict arena)"
    calls = [f"sg_kernels{g}" for g in range(len(groups))]
    for g, numbers in enumerate(groups):
        kernels = [program.kernels[n] for n in numbers]
        fn = _function(
            program,
            kernels,
            numbers[0],
            f"SG_HIDDEN int {calls[g]}{signature}",
            profile,
            flush_denormals,
        )
        lines = [*header, "", *fn]
        units.append(CUnit(f"kernels{g}", "\n".join(lines) + "\n", len(lines) - len(header)))
    step = [*header, *_profile_storage(program, profile), ""]
    step += [f"SG_HIDDEN int {c}{signature};" for c in calls]
    step.append(f"static int sg_body{signature} {{")
    step.append("    int rc;")
    step += [f"    if ((rc = {c}(io, arena))) return rc;" for c in calls]
    step += ["    return 0;", "}", _STEPS]
    return [CUnit("step", "\n".join(step) + "\n", len(step) - len(header)), *units]


def _comment_safe(text: str) -> str:
    """``text`` made harmless inside a C comment (a user-chosen function name)."""
    return "".join(ch if ch.isalnum() or ch in "_.-<> " else "_" for ch in text)
