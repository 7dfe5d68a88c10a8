"""Collectives in generated C: MPI called through function pointers, inside the native call.

The generated library never links MPI. ``mpi_prelude`` declares function-pointer
types for the few entry points it uses, with handles spelled as the running MPI's
ABI needs (``int`` for MPICH, ``void *`` for Open MPI); after ``dlopen`` the host
calls ``sg_mpi_bind`` with the addresses and handle values of the libmpi that
mpi4py already loaded (:meth:`shapegrad.distributed.MPICommunicator.native`). So a
data-parallel training step, all-reduce included, stays one native call, and
there is only one MPI in the process.

The source names each communicator by its ``key`` (``"world"``): a library is
cached per source, and its bound handles are those of that communicator.

Shared-memory all-reduce
------------------------
A communicator whose ``allreduce`` is ``"shm"`` (``MPICommunicator``'s default) gets its
sum and max all-reduces (without ``root``) done by the generated C itself, over memory
that every process of the node maps (``distributed/_shm.py`` allocates it at bind time;
``sg_shm_bind`` takes the segment of every rank). MPICH's shared-memory path copies each
byte through its cells twice per direction; here each byte crosses once:

* ``start``: rank ``me`` copies the chunks of its operand that the *other* ranks reduce
  into its own segment (the count split in ``n`` contiguous chunks, rank ``r`` reduces
  chunk ``r``; chunk bounds are multiples of 16 elements, so no two ranks write one cache
  line), then publishes ``arrived = s`` (a release store; ``s`` counts the exchanges of
  that region);
* ``progress`` (the ``test`` of a nonblocking exchange, and the loop of its ``wait``):
  once every rank has arrived, rank ``me`` sums chunk ``me`` over the ranks in rank order
  (its own operand read where it is), writes it to its result and to its segment's
  result area, publishes ``reduced = s``; once every rank has reduced, copies the
  others' chunks of the result out of their segments. Every element is summed by one rank in one fixed
  order and copied to the others: the results are bitwise equal on every rank, and
  deterministic (with 2 ranks, a + b, bitwise MPI's too).
* ``wait``: progress until done; spins with the CPU's pause hint, then yields the core
  (``sched_yield``, so a waiting rank does not starve the one it waits for on a loaded
  machine); with ``SHAPEGRAD_COLLECTIVE_TIMEOUT`` set, it gives up after that many
  seconds plus ``SHM_TIMEOUT_MARGIN`` (the watchdog of a watched step, which polls each
  second, names the step first), prints which ranks never arrived and fails the call.

Reuse is safe without a closing barrier: a rank writes a region's operand area for
exchange ``s + 1`` only after every rank published ``reduced = s`` (they have read its
operand of ``s``), and its result area only after every rank arrived at ``s + 1`` (they
have copied its result of ``s``). Operands and results need separate areas: exchanges
of one region may differ in size, so their chunk bounds differ. Each nonblocking request
has its own region (they overlap in time), blocking exchanges one more; a region's
areas are as large as the largest exchange that uses it. The segments belong to one library and communicator: a library bound again
(the same source) reuses them (``MPICommunicator.shared_segments``).

When the processes are not all on one node, no segment exists and the same code calls
MPI (``sg_shm_n`` is 0); ``allreduce="mpi"`` (``SHAPEGRAD_ALLREDUCE=mpi`` for the world)
renders MPI only. All other collectives, and the CUDA backend's, stay MPI's.
"""

from __future__ import annotations

import os
from typing import Any

from shapegrad.compiler import loops as L
from shapegrad.distributed import DistributedError, NativeMPI, check_same
from shapegrad.distributed._shm import MAX_NODE_RANKS

# Order of the handle table passed to sg_mpi_bind (and of the C enum below).
HANDLES = ("float32", "float64", "int32", "byte", "sum", "max")
FUNCTIONS = ("MPI_Allreduce", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Bcast",
             "MPI_Comm_rank", "MPI_Iallreduce", "MPI_Test", "MPI_Wait")  # fmt: skip

_TYPES = r"""
/* collectives: MPI entry points bound after loading (sg_mpi_bind); see collectives.py */
typedef {handle} sg_mpi_h;
typedef int (*sg_allreduce_f)(const void *, void *, int, sg_mpi_h, sg_mpi_h, sg_mpi_h);
typedef int (*sg_allgather_f)(const void *, int, sg_mpi_h, void *, int, sg_mpi_h, sg_mpi_h);
typedef int (*sg_reduce_scatter_f)(const void *, void *, int, sg_mpi_h, sg_mpi_h, sg_mpi_h);
typedef int (*sg_bcast_f)(void *, int, sg_mpi_h, int, sg_mpi_h);
typedef int (*sg_comm_rank_f)(sg_mpi_h, int *);
/* nonblocking exchanges (compiler/overlap.py): an MPI_Request has the handle's ABI type;
   statuses are ignored into a buffer larger than any MPI_Status (MPICH 20, Open MPI 24 B) */
typedef int (*sg_iallreduce_f)(const void *, void *, int, sg_mpi_h, sg_mpi_h, sg_mpi_h,
                               sg_mpi_h *);
typedef int (*sg_test_f)(sg_mpi_h *, int *, void *);
typedef int (*sg_wait_f)(sg_mpi_h *, void *);
static sg_allreduce_f sg_mpi_allreduce;
static sg_allgather_f sg_mpi_allgather;
static sg_reduce_scatter_f sg_mpi_reduce_scatter;
static sg_bcast_f sg_mpi_bcast;
static sg_comm_rank_f sg_mpi_comm_rank;
static sg_iallreduce_f sg_mpi_iallreduce;
static sg_test_f sg_mpi_test;
static sg_wait_f sg_mpi_wait;
static sg_mpi_h sg_mpi_request[{nrequests}];
static int64_t sg_mpi_status[16];
enum {{ SG_MPI_FLOAT32, SG_MPI_FLOAT64, SG_MPI_INT32, SG_MPI_BYTE, SG_MPI_SUM, SG_MPI_MAX,
       SG_MPI_NHANDLES }};
static sg_mpi_h sg_mpi_handle[SG_MPI_NHANDLES];
static sg_mpi_h sg_mpi_comm[{ncomms}];
{names}
int sg_mpi_bind(void **fns, const int64_t *handles, const int64_t *comms) {{
    sg_mpi_allreduce = (sg_allreduce_f)fns[0];
    sg_mpi_allgather = (sg_allgather_f)fns[1];
    sg_mpi_reduce_scatter = (sg_reduce_scatter_f)fns[2];
    sg_mpi_bcast = (sg_bcast_f)fns[3];
    sg_mpi_comm_rank = (sg_comm_rank_f)fns[4];
    sg_mpi_iallreduce = (sg_iallreduce_f)fns[5];
    sg_mpi_test = (sg_test_f)fns[6];
    sg_mpi_wait = (sg_wait_f)fns[7];
    for (int i = 0; i < SG_MPI_NHANDLES; ++i) sg_mpi_handle[i] = (sg_mpi_h)(intptr_t)handles[i];
    for (int i = 0; i < {ncomms}; ++i) sg_mpi_comm[i] = (sg_mpi_h)(intptr_t)comms[i];
    return 0;
}}
"""


# Seconds added to SHAPEGRAD_COLLECTIVE_TIMEOUT before a shared-memory wait gives up: a step
# under the watchdog (distributed/_mpi.py, polling each second) is ended by it first, with
# a message naming the step; the native limit is for calls that nothing watches.
SHM_TIMEOUT_MARGIN = 2.0
# Pause-hinted polls before a waiting rank starts yielding its core (~0.1 ms on a 4 GHz
# core: an exchange's other ranks are usually that close when both have a core).
SHM_SPINS = 4096
# Bytes of one rank's flags per region: arrived and reduced, each on its own cache line.
_FLAG_BYTES = 128

_SHM = r"""
/* shared-memory all-reduce within one node (backends/c/collectives.py) */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#define SG_SHM_MAXRANKS {maxranks}
#define SG_SHM_NREG {nreg}
#define SG_SHM_NCOMM {ncomms}
static const int64_t sg_shm_off[SG_SHM_NREG] = {{{offsets}}};  /* operand chunks */
static const int64_t sg_shm_res[SG_SHM_NREG] = {{{results}}};  /* this rank's result chunk */
static int sg_shm_n[SG_SHM_NCOMM];      /* ranks sharing memory; 0: MPI's all-reduce */
static int sg_shm_me[SG_SHM_NCOMM];
static double sg_shm_limit;             /* seconds a wait may take; <= 0: no limit */
static char *sg_shm_seg[SG_SHM_NCOMM][SG_SHM_MAXRANKS];
typedef struct {{ const char *src; char *dst; int64_t count; int kind; int stage; uint64_t seq; }}
    sg_shm_req_t;
static sg_shm_req_t sg_shm_req[SG_SHM_NCOMM][SG_SHM_NREG];

int sg_shm_bind(int comm, int n, int me, void **segments, double limit) {{
    if (comm < 0 || comm >= SG_SHM_NCOMM || n < 0 || n > SG_SHM_MAXRANKS) return 1;
    for (int r = 0; r < n; ++r) sg_shm_seg[comm][r] = (char *)segments[r];
    sg_shm_n[comm] = n;
    sg_shm_me[comm] = me;
    sg_shm_limit = limit;
    return 0;
}}

static inline uint64_t *sg_shm_flag(int c, int rank, int reg, int which) {{
    return (uint64_t *)(sg_shm_seg[c][rank] + {flag_bytes} * reg + 64 * which);
}}

static inline void sg_shm_chunk(int c, int64_t count, int r, int64_t *lo, int64_t *hi) {{
    int64_t per = (count + sg_shm_n[c] - 1) / sg_shm_n[c];
    per = (per + 15) & ~(int64_t)15; /* whole cache lines: no line written by two ranks */
    *lo = per * r < count ? per * r : count;
    *hi = *lo + per < count ? *lo + per : count;
}}

static inline int sg_shm_size(int kind) {{ return kind % 3 == 1 ? 8 : 4; }}

/* kind: 0..2 sum of float32, float64, int32; 3..5 max of the same */
static void sg_shm_start(int c, int reg, const void *src, void *dst, int64_t count, int kind) {{
    sg_shm_req_t *q = &sg_shm_req[c][reg];
    int me = sg_shm_me[c], es = sg_shm_size(kind);
    char *mine = sg_shm_seg[c][me] + sg_shm_off[reg];
    q->src = (const char *)src;
    q->dst = (char *)dst;
    q->count = count;
    q->kind = kind;
    q->seq = __atomic_load_n(sg_shm_flag(c, me, reg, 0), __ATOMIC_RELAXED) + 1;
    for (int r = 0; r < sg_shm_n[c]; ++r) {{
        int64_t lo, hi;
        if (r == me) continue;
        sg_shm_chunk(c, count, r, &lo, &hi);
        if (hi > lo) memcpy(mine + lo * es, q->src + lo * es, (size_t)((hi - lo) * es));
    }}
    __atomic_store_n(sg_shm_flag(c, me, reg, 0), q->seq, __ATOMIC_RELEASE);
    q->stage = 1;
}}

#define SG_SHM_SUM(a, b) ((a) + (b))
#define SG_SHM_ISUM(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b))) /* wraps, as MPI's */
#define SG_SHM_MAX(a, b) ((b) > (a) ? (b) : (a))
#define SG_SHM_REDUCE(T, OP)                                                              \
    {{                                                                                    \
        T *restrict d = (T *)q->dst + lo;                                                 \
        const T *restrict a = (const T *)p[0] + lo;                                      \
        if (n == 1) {{ for (int64_t i = 0; i < hi - lo; ++i) d[i] = a[i]; }}             \
        else {{                                                                           \
            const T *restrict b = (const T *)p[1] + lo;                                  \
            for (int64_t i = 0; i < hi - lo; ++i) d[i] = OP(a[i], b[i]);                 \
            for (int r = 2; r < n; ++r) {{                                                \
                const T *restrict e = (const T *)p[r] + lo;                              \
                for (int64_t i = 0; i < hi - lo; ++i) d[i] = OP(d[i], e[i]);             \
            }}                                                                            \
        }}                                                                                \
    }}

/* Advance exchange ``reg`` as far as the other ranks allow; 1 when it is complete. */
static int sg_shm_progress(int c, int reg) {{
    sg_shm_req_t *q = &sg_shm_req[c][reg];
    int n = sg_shm_n[c], me = sg_shm_me[c], es = sg_shm_size(q->kind);
    if (q->stage == 1) {{
        const char *p[SG_SHM_MAXRANKS];
        int64_t lo, hi;
        for (int r = 0; r < n; ++r)
            if (__atomic_load_n(sg_shm_flag(c, r, reg, 0), __ATOMIC_ACQUIRE) < q->seq) return 0;
        for (int r = 0; r < n; ++r) p[r] = r == me ? q->src : sg_shm_seg[c][r] + sg_shm_off[reg];
        sg_shm_chunk(c, q->count, me, &lo, &hi);
        switch (q->kind) {{
        case 0: SG_SHM_REDUCE(float, SG_SHM_SUM) break;
        case 1: SG_SHM_REDUCE(double, SG_SHM_SUM) break;
        case 2: SG_SHM_REDUCE(int32_t, SG_SHM_ISUM) break;
        case 3: SG_SHM_REDUCE(float, SG_SHM_MAX) break;
        case 4: SG_SHM_REDUCE(double, SG_SHM_MAX) break;
        default: SG_SHM_REDUCE(int32_t, SG_SHM_MAX) break;
        }}
        if (hi > lo)
            memcpy(sg_shm_seg[c][me] + sg_shm_res[reg], q->dst + lo * es,
                   (size_t)((hi - lo) * es));
        __atomic_store_n(sg_shm_flag(c, me, reg, 1), q->seq, __ATOMIC_RELEASE);
        q->stage = 2;
    }}
    if (q->stage == 2) {{
        for (int r = 0; r < n; ++r)
            if (__atomic_load_n(sg_shm_flag(c, r, reg, 1), __ATOMIC_ACQUIRE) < q->seq) return 0;
        for (int r = 0; r < n; ++r) {{
            int64_t lo, hi;
            if (r == me) continue;
            sg_shm_chunk(c, q->count, r, &lo, &hi);
            if (hi > lo)
                memcpy(q->dst + lo * es, sg_shm_seg[c][r] + sg_shm_res[reg],
                       (size_t)((hi - lo) * es));
        }}
        q->stage = 0;
    }}
    return 1;
}}

static inline void sg_shm_relax(void) {{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}}

/* Finish exchange ``reg``: 0, or 1 after the time limit (the ranks missing printed). */
static int sg_shm_wait(int c, int reg) {{
    struct timespec t0, t1;
    int timed = 0;
    for (uint64_t spin = 0; !sg_shm_progress(c, reg); ++spin) {{
        if (spin < {spins}) {{ sg_shm_relax(); continue; }}
        sched_yield();
        if (sg_shm_limit <= 0 || (spin & 63) != 0) continue;
        if (!timed) {{ clock_gettime(CLOCK_MONOTONIC, &t0); timed = 1; continue; }}
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (waited > sg_shm_limit) {{
            sg_shm_req_t *q = &sg_shm_req[c][reg];
            int which = q->stage == 1 ? 0 : 1;
            fprintf(stderr, "[rank %d/%d] shapegrad: a shared-memory all-reduce (%lld elements) "
                    "waited %.1f s (SHAPEGRAD_COLLECTIVE_TIMEOUT + %g s) for rank(s)",
                    sg_shm_me[c], sg_shm_n[c], (long long)q->count, waited, {margin});
            for (int r = 0; r < sg_shm_n[c]; ++r)
                if (__atomic_load_n(sg_shm_flag(c, r, reg, which), __ATOMIC_ACQUIRE) < q->seq)
                    fprintf(stderr, " %d", r);
            fprintf(stderr, " to %s; they are stuck or failed without ending the job\n",
                    which == 0 ? "arrive" : "finish reducing");
            fflush(stderr);
            return 1;
        }}
    }}
    return 0;
}}
"""


def native_of(comm: Any) -> NativeMPI:
    native = comm.native() if hasattr(comm, "native") else None
    if native is None:
        raise DistributedError(
            f"the C backend runs collectives through MPI, but {comm!r} offers no MPI entry "
            "points (Communicator.native() is None); use an MPICommunicator or backend='numpy'"
        )
    assert isinstance(native, NativeMPI)
    return native


def mpi_prelude(program: L.Program, shared: bool = True) -> str:
    """Declarations and ``sg_mpi_bind`` for a program with collectives ("" without); with
    ``shared`` (the C backend; not CUDA's) and a communicator whose ``allreduce`` is
    ``"shm"``, the shared-memory all-reduce too (see the module docstring)."""
    if not program.communicators:
        return ""
    handle = native_of(program.communicators[0]).handle_type
    names = "\n".join(
        f"/* communicator {k}: {_safe(getattr(c, 'key', '?'))}, {c.size} processes, "
        f"all-reduce {transport(c) if shared else 'mpi'} */"
        for k, c in enumerate(program.communicators)
    )
    text = _TYPES.format(
        handle=handle,
        ncomms=len(program.communicators),
        names=names,
        nrequests=max(1, requests(program)),
    )
    if not shared or not any(transport(c) == "shm" for c in program.communicators):
        return text
    offsets, results, _ = shared_layout(program)
    return text + _SHM.format(
        maxranks=MAX_NODE_RANKS,
        nreg=len(offsets),
        ncomms=len(program.communicators),
        offsets=", ".join(map(str, offsets)),
        results=", ".join(map(str, results)),
        flag_bytes=_FLAG_BYTES,
        spins=SHM_SPINS,
        margin=SHM_TIMEOUT_MARGIN,
    )


def transport(comm: Any) -> str:
    """How compiled all-reduces over ``comm`` exchange: ``"shm"`` or ``"mpi"``."""
    return (
        "shm" if getattr(type(comm), "shared_segments", None) and comm.allreduce == "shm" else "mpi"
    )


def _shared(s: L.Collective) -> bool:
    """Whether the shared-memory path can run exchange ``s`` (when its communicator has it)."""
    return s.kind == "all_reduce" and s.root is None and s.op in ("sum", "max")


def shared_layout(program: L.Program) -> tuple[list[int], list[int], int]:
    """(offset of each region's operand area in a rank's segment, of its result area,
    segment bytes). Region ``r`` serves request ``r``, the last one the blocking
    exchanges; the flags of all regions come first (``_FLAG_BYTES`` each), every area
    starts on a cache line. Operands and results have separate areas: two exchanges of
    one region may differ in size, so chunk ``r`` of one overlaps chunk ``q`` of the next,
    and a rank writing its next operand must not overwrite a result still being read.
    The result area holds the rank's own chunk only: at most half the elements (rounded
    up, plus the 16 of the chunk rounding) with 2 or more ranks."""
    nreg = requests(program) + 1
    sizes, chunks = [0] * nreg, [0] * nreg
    for p in L.nested_programs(program):
        for k in p.kernels:
            for s in L.walk(k.body):
                if isinstance(s, L.Collective) and _shared(s):
                    reg = nreg - 1 if s.phase == "blocking" else s.request
                    itemsize = s.dtype.numpy.itemsize
                    sizes[reg] = max(sizes[reg], s.count * itemsize)
                    # a chunk: ceil(count / ranks) rounded up to 16 elements, ranks >= 2
                    chunks[reg] = max(chunks[reg], ((s.count + 1) // 2 + 16) * itemsize)
    offsets, results, at = [], [], _FLAG_BYTES * nreg
    for size, chunk in zip(sizes, chunks, strict=True):
        offsets.append(at)
        at += -(-size // 64) * 64
        results.append(at)
        at += -(-chunk // 64) * 64
    return offsets, results, at


def requests(program: L.Program) -> int:
    """How many nonblocking requests the program's exchanges number (0: none). Layer
    bodies number theirs from 0 too: a layer loop never runs while an exchange of the
    enclosing program is in flight (``compiler/overlap.py``), so they share the slots."""
    return 1 + max(
        (
            s.request
            for p in L.nested_programs(program)
            for k in p.kernels
            for s in L.walk(k.body)
            if isinstance(s, L.Collective)
        ),
        default=-1,
    )


def render_collective(s: L.Collective, type_name: str, emit: Any, depth: int) -> None:
    """The C of one ``Collective`` statement (``emit(depth, line)``)."""
    comm = f"sg_mpi_comm[{s.comm}]"
    fail = f"return {s.code};"
    if _shared(s):  # the shared-memory exchange where the library has it and it is bound
        _render_shared(s, fail, emit, depth)
    if s.phase != "blocking":
        _render_nonblocking(s, comm, fail, emit, depth)
        return
    if s.kind in ("all_reduce", "reduce_scatter"):
        mpi_type = {
            "float32": "SG_MPI_FLOAT32",
            "float64": "SG_MPI_FLOAT64",
            "int32": "SG_MPI_INT32",
        }[s.dtype.name]
        op = "SG_MPI_MAX" if s.op == "max" else "SG_MPI_SUM"
        fn = "sg_mpi_allreduce" if s.kind == "all_reduce" else "sg_mpi_reduce_scatter"
        emit(
            depth,
            f"if ({fn}({s.src}, {s.dst}, {s.count}, sg_mpi_handle[{mpi_type}], "
            f"sg_mpi_handle[{op}], {comm}) != 0) {fail}",
        )
        if s.root is not None:  # the sum stays on the root; the others hold zeros
            emit(depth, "{")
            emit(depth + 1, "int sg_rank = 0;")
            emit(depth + 1, f"if (sg_mpi_comm_rank({comm}, &sg_rank) != 0) {fail}")
            emit(depth + 1, f"if (sg_rank != {s.root})")
            emit(depth + 2, f"for (int64_t q = 0; q < {s.count}; ++q) {s.dst}[q] = 0;")
            emit(depth, "}")
        return
    nbytes = s.count * s.dtype.numpy.itemsize
    if s.kind == "all_gather":
        emit(
            depth,
            f"if (sg_mpi_allgather({s.src}, {nbytes}, sg_mpi_handle[SG_MPI_BYTE], {s.dst}, "
            f"{nbytes}, sg_mpi_handle[SG_MPI_BYTE], {comm}) != 0) {fail}",
        )
        return
    # broadcast: the root sends its copy, the others receive into theirs
    emit(depth, f"for (int64_t q = 0; q < {s.count}; ++q) {s.dst}[q] = {s.src}[q];")
    emit(
        depth,
        f"if (sg_mpi_bcast({s.dst}, {nbytes}, sg_mpi_handle[SG_MPI_BYTE], {s.root or 0}, "
        f"{comm}) != 0) {fail}",
    )
    del type_name


def _render_shared(s: L.Collective, fail: str, emit: Any, depth: int) -> None:
    """``if (sg_shm_n[c]) { the shared-memory exchange } else`` ahead of the MPI call
    (compiled in where the prelude has the shared-memory functions)."""
    kind = ("float32", "float64", "int32").index(s.dtype.name) + (3 if s.op == "max" else 0)
    reg = "SG_SHM_NREG - 1" if s.phase == "blocking" else str(s.request)
    c = s.comm
    emit(0, "#ifdef SG_SHM_NREG")
    if s.phase in ("blocking", "start"):
        emit(depth, f"if (sg_shm_n[{c}]) {{")
        emit(depth + 1, f"sg_shm_start({c}, {reg}, {s.src}, {s.dst}, {s.count}, {kind});")
        if s.phase == "blocking":
            emit(depth + 1, f"if (sg_shm_wait({c}, {reg})) {fail}")
    elif s.phase == "test":
        emit(depth, f"if (sg_shm_n[{c}]) {{")
        emit(depth + 1, f"sg_shm_progress({c}, {reg});")
    elif s.phase == "wait":
        emit(depth, f"if (sg_shm_n[{c}]) {{")
        emit(depth + 1, f"if (sg_shm_wait({c}, {reg})) {fail}")
    else:
        raise ValueError(f"unknown collective phase {s.phase!r}")
    emit(depth, "} else")
    emit(0, "#endif")


def _render_nonblocking(s: L.Collective, comm: str, fail: str, emit: Any, depth: int) -> None:
    """Start, advance or finish request ``s.request`` (a sum or max all-reduce)."""
    if s.kind != "all_reduce" or s.root is not None:
        raise NotImplementedError(
            f"C backend: only all_reduce without root runs nonblocking, not {s.kind} "
            f"(root {s.root})"
        )
    request = f"&sg_mpi_request[{s.request}]"
    if s.phase == "start":
        mpi_type = {
            "float32": "SG_MPI_FLOAT32",
            "float64": "SG_MPI_FLOAT64",
            "int32": "SG_MPI_INT32",
        }
        op = "SG_MPI_MAX" if s.op == "max" else "SG_MPI_SUM"
        emit(
            depth,
            f"if (sg_mpi_iallreduce({s.src}, {s.dst}, {s.count}, "
            f"sg_mpi_handle[{mpi_type[s.dtype.name]}], sg_mpi_handle[{op}], {comm}, "
            f"{request}) != 0) {fail}",
        )
    elif s.phase == "test":  # a finished request is MPI_REQUEST_NULL: testing it is free
        emit(depth, "{")
        emit(depth + 1, "int sg_done = 0;")
        emit(depth + 1, f"if (sg_mpi_test({request}, &sg_done, sg_mpi_status) != 0) {fail}")
        emit(depth, "}")
    elif s.phase == "wait":
        # MPI_Wait spins (MPICH polls shared memory). Testing and sleeping 2-50 us between
        # tests instead (so a waiting rank leaves its core to the one it waits for) was
        # slower on the 2-core AMD EPYC at load 10: 18.5-28.5 vs 16.9 ms per MLP step.
        emit(depth, f"if (sg_mpi_wait({request}, sg_mpi_status) != 0) {fail}")
    else:
        raise ValueError(f"unknown collective phase {s.phase!r}")


def collective_signature(program: L.Program, comm_index: int) -> list[tuple[Any, ...]]:
    """What every process must agree on: kind, count, dtype, op, root of each exchange."""
    return [
        (s.kind, s.count, s.dtype.name, s.op, s.root, s.phase, s.request)
        for k in program.kernels
        for s in L.walk(k.body)
        if isinstance(s, L.Collective) and s.comm == comm_index
    ]


def check_program(program: L.Program) -> None:
    """Every process compiled the same exchanges (else ``RankMismatchError`` naming the
    ranks, raised on all of them before any native exchange could hang or corrupt)."""
    for k, comm in enumerate(program.communicators):
        check_same(
            comm,
            f"compiled program {program.name!r}: its collectives (kind, elements, dtype, op, root)",
            collective_signature(program, k),
        )
        check_same(  # SHAPEGRAD_ALLREDUCE must agree: one rank in MPI, another in shm, hangs
            comm,
            f"compiled program {program.name!r}: the all-reduce transport (SHAPEGRAD_ALLREDUCE)",
            transport(comm),
        )


def bind(lib: Any, ffi: Any, program: L.Program) -> None:
    """Hand the generated code the MPI entry points and handles (after ``dlopen``), and
    the shared-memory segments where it has the shared-memory all-reduce
    (:func:`bind_shared`)."""
    if not program.communicators:
        return
    native = native_of(program.communicators[0])
    fns = ffi.new("void *[]", [ffi.cast("void *", native.functions[f]) for f in FUNCTIONS])
    handles = ffi.new("int64_t[]", [_signed(native.handles[h]) for h in HANDLES])
    comms = ffi.new(
        "int64_t[]", [_signed(native_of(c).handles["comm"]) for c in program.communicators]
    )
    lib.sg_mpi_bind(fns, handles, comms)
    bind_shared(lib, ffi, program)


def bind_shared(lib: Any, ffi: Any, program: L.Program) -> None:
    """Hand the generated code every rank's shared segment, for each communicator whose
    ``allreduce`` is ``"shm"`` and whose processes are all on this node (collective over
    those communicators; the others keep MPI's all-reduce). Where it binds, the messages
    of the program's all-reduce failures say that a wait may also have timed out."""
    if not any(transport(c) == "shm" for c in program.communicators):
        return
    try:
        lib.sg_shm_bind  # noqa: B018 -- a library rendered without it (CUDA's) keeps MPI
    except AttributeError:
        return
    _, _, nbytes = shared_layout(program)
    key = ffi.string(lib.sg_key).decode()
    limit = os.environ.get("SHAPEGRAD_COLLECTIVE_TIMEOUT")
    seconds = float(limit) + SHM_TIMEOUT_MARGIN if limit else 0.0
    for k, comm in enumerate(program.communicators):
        if transport(comm) != "shm":
            continue
        segments = comm.shared_segments(key, nbytes)
        if segments is None:
            continue
        table = ffi.new("void *[]", [ffi.cast("void *", a) for a in segments.addresses])
        if lib.sg_shm_bind(k, len(segments.addresses), comm.rank, table, seconds) != 0:
            raise DistributedError(f"sg_shm_bind refused communicator {k} ({comm!r})")
        for p in L.nested_programs(program):
            for kernel in p.kernels:
                for s in L.walk(kernel.body):
                    if isinstance(s, L.Collective) and s.comm == k and _shared(s) and seconds:
                        _note_timeout(program, s.code)


def _note_timeout(program: L.Program, code: int) -> None:
    text = program.errors.get(code)
    extra = ", or its shared-memory wait timed out (SHAPEGRAD_COLLECTIVE_TIMEOUT; see stderr)"
    if text is not None and extra not in text:
        program.errors[code] = text + extra


def _signed(handle: int) -> int:
    """A handle as int64: mpi4py gives MPICH's ``int`` handles of derived communicators
    sign-extended to 64 unsigned bits (0xffffffff84000000), which C truncates back."""
    value = int(handle) & 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_.-/ " else "_" for ch in str(text))
