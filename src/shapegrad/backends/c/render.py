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

Threading (this renderer's own policy, not the IR's) is planned by ``schedule.py``
(``plan_region``: a pure function of the kernels, dumped by ``SHAPEGRAD_DEBUG`` as
``<name>.schedule.txt``) and printed here: a step with anything worth splitting is one
``#pragma omp parallel`` region: loop nests whose estimated work
(``splitting.estimate_work``) is at least ``CTuning.region_min_work`` become orphaned
``omp for`` loops with dynamic chunks of about ``CTuning.chunk_work`` scalar ops; large
library products are split into blocks of rows or columns of the result (or over their
summed axis), each block one single-threaded BLAS call, taken dynamically
(``teamsplit.py``); batch-fused products give each thread its own scratch slice; serial
kernels run under ``omp single``; barriers stand only where a later unit touches memory
an earlier one writes. Programs with layer loops or collectives keep one ``parallel for``
per large statement (``CTuning.omp_min_work``). Loops arrive split already (unrolled,
index-set split: the ``split_index_sets`` loop stage); the renderer prints them. The
static runtime (team size, adaptive team, flush-to-zero) is the packaged ``runtime.h``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from shapegrad.backends.c import batch_gemm, gemm_kernel
from shapegrad.backends.c.collectives import mpi_prelude
from shapegrad.backends.c.kernel_render import CRenderer, comment_safe
from shapegrad.backends.c.schedule import Region, fork_parallel, plan_region
from shapegrad.backends.cstyle import helpers
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import C_TARGET, CTuning, Target

# The static C text every unit starts with (packaged ``runtime.h``: team size, adaptive
# team, flush-to-zero, thread helpers), then the scalar helpers shared with CUDA. Inlined,
# not ``#include``d by path: the text is part of each unit's source and so of its cache key.
_PRELUDE = resources.files("shapegrad.backends.c").joinpath("runtime.h").read_text(
    encoding="utf-8"
) + helpers("static inline")

_BLAS_DECL = r"""
#define SG_USES_BLAS 1
void scipy_openblas_set_num_threads(int);
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double *, int,
                       const double *, int, double, double *, int);
"""

# The definitions of what runtime.h declares extern: once per library (its step unit),
# and in the harnesses that compile runtime.h alone to drive the adaptive team with
# synthetic or recorded times (tests/test_c_adaptive_team.py, benchmarks/team_replay.py).
RUNTIME_GLOBALS = r"""
SG_HIDDEN int sg_threads = 1;
SG_HIDDEN int sg_adaptive = 1;
SG_HIDDEN unsigned sg_team_epoch;
SG_HIDDEN unsigned long long sg_team_calls, sg_team_solo;
SG_HIDDEN unsigned long long sg_fp_caller = 0x1f80u;
SG_HIDDEN int sg_step_pick = 1;
"""

_STEPS = (
    RUNTIME_GLOBALS
    + r"""
/* timed calls of the adaptive team so far, and those that ran on one thread */
void sg_team_counts(unsigned long long *out) {
    out[0] = sg_team_calls;
    out[1] = sg_team_solo;
}

int sg_run(void **io, char *arena) {
    SG_FP_CALL_ENTER;
    int rc = sg_body(io, arena);
    SG_FP_CALL_LEAVE;
    return rc;
}

int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step, int64_t *done) {
    void *local[SG_NSLOTS + 1];
    int rc = 0;
    SG_FP_CALL_ENTER;
    *done = 0;
    for (int64_t t = 0; t < k; ++t) {
        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];
        rc = sg_body(local, arena);
        if (rc) break;
        *done = t + 1;
    }
    SG_FP_CALL_LEAVE;
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
)


def c_tuning(target: Target = C_TARGET) -> CTuning:
    """The C renderer's constants of ``target`` (C defaults where it has a base record)."""
    return CTuning.of(target.tuning)


def uses_blas(program: L.Program) -> bool:
    """Whether any kernel calls the matrix-multiply library."""
    return any(
        isinstance(s, L.Contract)
        for p in L.nested_programs(program)
        for k in p.kernels
        for s in L.walk(k.body)
    )


def uses_own_gemm(program: L.Program) -> bool:
    """Whether any product is rendered with shapegrad's own ``sgemm.h`` (``gemm_kernel``)."""
    return any(
        gemm_kernel.uses_own(s)
        for p in L.nested_programs(program)
        for k in p.kernels
        for s in L.walk(k.body)
    )


def uses_batch_gemm(program: L.Program) -> bool:
    """Whether any batched product is rendered as ``sg_sgemm_batch`` (``batch_gemm``)."""
    return any(
        isinstance(s, L.Contract) and batch_gemm.takes(s)
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


def _header(
    program: L.Program, profile: bool, vector_math: bool, flush_denormals: bool
) -> list[str]:
    """What every unit of ``program`` starts with: includes, helpers, shared declarations."""
    lines = [f"/* shapegrad generated: program {comment_safe(program.name)} */"]
    if flush_denormals:
        lines.append("#define SG_FLUSH_DENORMALS 1")
    lines.append(_PRELUDE)
    if vector_math:
        lines.append(_VECTOR_MATH)
    if uses_blas(program):
        lines.append(_BLAS_DECL)
        batched = uses_batch_gemm(program)
        if batched or uses_own_gemm(program):
            lines.append(gemm_kernel.SOURCE)  # sgemm_batch.h uses its register transpose
        if batched:
            lines.append(batch_gemm.SOURCE)
    lines.append(f"#define SG_NSLOTS {max(program.n_slots, 1)}")
    if program.communicators:
        lines.append(mpi_prelude(program))
    if profile:
        lines.append(_PROFILE)
        lines.append(f"extern double sg_profile[{max(len(program.kernels), 1)}];")
    return lines


def _profile_storage(program: L.Program, profile: bool) -> list[str]:
    return [f"double sg_profile[{max(len(program.kernels), 1)}];"] if profile else []


def _kernel_lines(program: L.Program, tuning: CTuning) -> list[int]:
    """Each kernel's rendered size in lines (its block and its layer functions), to cut the
    program into units; rendered on its own, outside any region."""
    w = CRenderer(program, tuning)
    sizes = []
    for number, k in enumerate(program.kernels):
        first_line, first_fn = len(w.lines), len(w.functions)
        w.kernel(k, number, False, fork_parallel(k, tuning))
        functions = w.functions[first_fn:]
        sizes.append(len(w.lines) - first_line + sum(f.count("\n") + 1 for f in functions))
    return sizes


def _function(
    program: L.Program,
    plan: Region,
    signature: str,
    profile: bool,
    flush_denormals: bool,
    tuning: CTuning,
) -> list[str]:
    """``signature`` with ``plan``'s kernels as its body (one OpenMP region when anything
    is worth splitting, ``CRenderer.body``), preceded by the layer functions it calls."""
    w = CRenderer(program, tuning, flush_denormals)
    w.lines.append((_FORK_BODY if plan.forks else signature) + " {")
    w.emit(1, "(void)io; (void)arena;")
    w.body(plan, profile)
    w.lines.append("}")
    if plan.forks:  # the kernels' parallel statements open teams of the call's choice
        w.lines += [signature + " {", _FORK_CALL, "}"]
    # layer bodies (declared first: a body may call a nested body defined after it)
    declared = [
        f"static int sg_layer{n}(void **restrict io, char *restrict arena);"
        for n in range(len(w.functions))
    ]
    return declared + w.functions + w.lines


# Fork mode with splits: the kernels are a function of their own, and the function the
# step calls picks the team of every ``parallel`` statement of the call (``runtime.h``'s
# adaptive choice, ``teamsplit.FORK_TEAM``) and times the call.
_FORK_BODY = "static int sg_fork_body(void **restrict io, char *restrict arena)"
_FORK_CALL = """    const int sg_pick = sg_team_pick();
    sg_team_now = sg_pick ? sg_threads : 1;
    const double sg_start = sg_threads > 1 && sg_adaptive == 1 ? sg_clock() : 0.0;
    const int rc = sg_fork_body(io, arena);
    if (sg_start != 0.0) sg_team_record(sg_pick, sg_clock() - sg_start);
    return rc;"""


# A step split into kernel units decides once per call (runtime.h, SG_FOLLOW_STEP): the
# step unit picks the team and times the call; the kernel units follow its pick.
_FOLLOW_STEP = "#define SG_FOLLOW_STEP 1"
_STEP_PICK = """    int rc = 0;
    sg_step_pick = sg_team_pick();
    const double sg_start = sg_threads > 1 && sg_adaptive == 1 ? sg_clock() : 0.0;"""
_STEP_RECORD = "    if (sg_start != 0.0) sg_team_record(sg_step_pick, sg_clock() - sg_start);"


def render_c(
    program: L.Program,
    profile: bool = False,
    vector_math: bool = False,
    flush_denormals: bool = False,
    tuning: CTuning | None = None,
) -> str:
    """The full C source of ``program`` (its I/O table already numbered) as one unit.

    With ``profile`` every kernel adds its wall time to ``double sg_profile[k]``; with
    ``vector_math`` transcendental calls in vectorizable loops use libmvec (link ``-lmvec``);
    with ``flush_denormals`` (a floating-point mode) the entry points and every thread of
    their OpenMP teams run with denormal floats flushed to zero (x86 MXCSR FTZ and DAZ,
    aarch64 FPCR FZ), and restore their previous mode when the call returns. ``tuning``:
    the target's C constants (default: ``C_TARGET``'s).

    Example:
        >>> print(render_c(program))
    """
    tuning = tuning if tuning is not None else c_tuning()
    plan = plan_region(program, program.kernels, tuning, profile=profile)
    lines = [*_header(program, profile, vector_math, flush_denormals)]
    lines += [*_profile_storage(program, profile), ""]
    signature = "static int sg_body(void **restrict io, char *restrict arena)"
    lines += _function(program, plan, signature, profile, flush_denormals, tuning)
    lines.append(_STEPS)
    return "\n".join(lines) + "\n"


def unit_groups(
    program: L.Program,
    tuning: CTuning,
    unit_lines: int | None = None,
    split_min_lines: int | None = None,
) -> tuple[list[list[int]], int]:
    """(kernel numbers of each kernel unit, total kernel lines): consecutive kernels of
    about ``unit_lines`` lines per unit; one group when the program stays one unit
    (under ``split_min_lines`` lines, collectives, or a single kernel)."""
    unit_lines = tuning.unit_lines if unit_lines is None else unit_lines
    split_min_lines = tuning.split_min_lines if split_min_lines is None else split_min_lines
    sizes = _kernel_lines(program, tuning)
    total = sum(sizes)
    if total < split_min_lines or program.communicators or len(sizes) < 2:
        return [list(range(len(sizes)))], total
    groups: list[list[int]] = [[]]
    size = 0
    for n, kernel_lines in enumerate(sizes):
        if groups[-1] and size >= unit_lines:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += kernel_lines
    return groups, total


def plan_units(
    program: L.Program,
    tuning: CTuning,
    profile: bool = False,
    unit_lines: int | None = None,
    split_min_lines: int | None = None,
) -> list[Region]:
    """The threading plan of each kernel unit :func:`render_c_units` writes (one plan, the
    whole program's, when it stays one unit)."""
    groups, _total = unit_groups(program, tuning, unit_lines, split_min_lines)
    return [
        plan_region(program, [program.kernels[n] for n in g], tuning, g[0] if g else 0, profile)
        for g in groups
    ]


def schedule_text(
    program: L.Program,
    tuning: CTuning,
    profile: bool = False,
    unit_lines: int | None = None,
    split_min_lines: int | None = None,
) -> str:
    """The threading plans of ``program``'s functions as text (``SHAPEGRAD_DEBUG``'s
    ``<name>.schedule.txt``), layer bodies included."""
    plans = plan_units(program, tuning, profile, unit_lines, split_min_lines)
    out = []
    for g, plan in enumerate(plans):
        name = "sg_body" if len(plans) == 1 else f"sg_kernels{g}"
        out.append(f"{name}: {plan.format(tuning)}")
    for nested in list(L.nested_programs(program))[1:]:
        plan = plan_region(nested, nested.kernels, tuning, nested=True)
        out.append(f"layer body {nested.name}: {plan.format(tuning)}")
    return "\n".join(out) + "\n"


def render_c_units(
    program: L.Program,
    profile: bool = False,
    vector_math: bool = False,
    unit_lines: int | None = None,
    split_min_lines: int | None = None,
    flush_denormals: bool = False,
    tuning: CTuning | None = None,
) -> list[CUnit]:
    """``program`` as translation units compiled separately (in parallel, each cached by its
    own content) and linked into one library: the step unit (``sg_body`` calling one
    function per kernel unit, ``sg_run``/``sg_run_steps``/``sg_set_threads``) plus kernel
    units of about ``unit_lines`` lines each (default ``tuning.unit_lines``).

    Kernel unit ``g`` holds consecutive kernels as the body of one function
    ``SG_HIDDEN int sg_kernels<g>(void **io, char *arena)`` (one OpenMP region of its own,
    see ``CRenderer.body``), returning 0 or the first error code; state shared by the units
    (``sg_threads``, ``sg_adaptive``, ``sg_team_epoch``, ``sg_profile``) is declared
    ``extern`` in the common header and defined in the step unit. Programs under
    ``split_min_lines`` lines (default ``tuning.split_min_lines``), and programs with
    collectives (their MPI entry points are per-unit statics), stay one unit
    (:func:`render_c`).
    """
    tuning = tuning if tuning is not None else c_tuning()
    groups, total = unit_groups(program, tuning, unit_lines, split_min_lines)
    if len(groups) == 1:
        source = render_c(program, profile, vector_math, flush_denormals, tuning)
        return [CUnit("step", source, total)]
    header = _header(program, profile, vector_math, flush_denormals)
    units = []
    signature = "(void **restrict io, char *restrict arena)"
    calls = [f"sg_kernels{g}" for g in range(len(groups))]
    for g, numbers in enumerate(groups):
        kernels = [program.kernels[n] for n in numbers]
        plan = plan_region(program, kernels, tuning, numbers[0], profile)
        fn = _function(
            program,
            plan,
            f"SG_HIDDEN int {calls[g]}{signature}",
            profile,
            flush_denormals,
            tuning,
        )
        lines = [_FOLLOW_STEP, *header, "", *fn]
        units.append(CUnit(f"kernels{g}", "\n".join(lines) + "\n", len(lines) - len(header) - 1))
    step = [*header, *_profile_storage(program, profile), ""]
    step += [f"SG_HIDDEN int {c}{signature};" for c in calls]
    step.append(f"static int sg_body{signature} {{")
    step.append(_STEP_PICK)
    step += [f"    if (!rc) rc = {c}(io, arena);" for c in calls]
    step += [_STEP_RECORD, "    return rc;", "}", _STEPS]
    return [CUnit("step", "\n".join(step) + "\n", len(step) - len(header)), *units]
