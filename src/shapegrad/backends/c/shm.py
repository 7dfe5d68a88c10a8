"""The all-reduce of generated C over memory shared by the processes of one node.

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
  others' chunks of the result out of their segments. Every element is summed by one
  rank in one fixed order and copied to the others: the results are bitwise equal on
  every rank, and deterministic (with 2 ranks, a + b, bitwise MPI's too).
* ``wait``: progress until done; spins with the CPU's pause hint (``SHM_SPIN_SECONDS``),
  then sleeps on a futex on the flag it waits for (Linux; the publisher wakes it, only
  where a rank sleeps), else yields the core. Sleeping is what lets oversubscribed ranks
  run: 3 ranks on 2 cores, 1.2 MB in 4 all-reduces, 3.0 ms per call vs 9.8 ms yielding
  (MPI: 9.5-11 ms); 2 ranks at load 6 were equal either way (MLP step 7.4-8.4 vs
  7.8-8.2 ms, interleaved). With ``SHAPEGRAD_COLLECTIVE_TIMEOUT`` set, it gives up after
  that many seconds plus ``SHM_TIMEOUT_MARGIN`` (the watchdog of a watched step, which
  polls each second, names the step first), prints which ranks never arrived and fails
  the call.

Reuse is safe without a closing barrier: a rank writes a region's operand area for
exchange ``s + 1`` only after every rank published ``reduced = s`` (they have read its
operand of ``s``), and its result area only after every rank arrived at ``s + 1`` (they
have copied its result of ``s``). Operands and results need separate areas: exchanges
of one region may differ in size, so their chunk bounds differ. Each nonblocking request
has its own region (they overlap in time), blocking exchanges one more; a region's
areas are as large as the largest exchange that uses it (the operand area) and as its
largest chunk (the result area): 1.5x the exchanged bytes per rank. The segments belong
to one library and communicator: a library bound again (the same source) reuses them
(``MPICommunicator.shared_segments``).

**Reduce at the reader** (``shmplan.ReaderSum``, the exchanges whose result only
elementwise stores load, e.g. a gradient read by the optimizer's update): no copy and
no result at all. Such an exchange has a region of its own with two operand slots per
rank, used by alternate exchanges (the parity of ``s``). Its producer writes this
rank's operand straight into slot ``(s + 1) & 1`` of its own segment
(``sg_shm_operand`` gives the kernel that pointer), ``start`` only publishes
``arrived = s`` (``sg_shm_post``), ``wait`` waits until every rank has, and every load
of the result in the update's loop is ``slot_0[i] + slot_1[i] + ...`` in rank order
(``sg_shm_summand``, ``reader_load``), each partial sum behind ``SG_SUM_FENCE`` so that
``-fassociative-math`` cannot move a term into the surrounding expression: every rank
computes the same bits, the chunked path's. A slot written for exchange ``s + 2`` is
free: its writer has seen every rank publish ``s + 1``, which each does after its last
load of ``s`` (the program's loads of an exchange all precede its next start), so no
consumed flag is needed. Without segments (MPI), ``sg_shm_operand`` is the arena
buffer MPI reads, summand 0 is MPI's result and the others point at ``-0.0``
(``x + -0.0`` is ``x``, bitwise).

The C text is ``shm_prelude``'s, rendered after ``collectives.mpi_prelude``'s; each
all-reduce statement becomes ``if (sg_shm_n[c]) { shared memory } else { MPI }``
(``render_shared``); ``bind_shared`` runs after ``sg_mpi_bind``.

When the processes are not all on one node, no segment exists and the same code calls
MPI (``sg_shm_n`` is 0); ``allreduce="mpi"`` (``SHAPEGRAD_ALLREDUCE=mpi`` for the world)
renders MPI only. All other collectives, and the CUDA backend's, stay MPI's.
"""

from __future__ import annotations

import os
from typing import Any

from shapegrad.backends.c import shmplan
from shapegrad.backends.c.shmplan import ReaderSum, shareable, transport
from shapegrad.backends.c.shmshard import shard_plan
from shapegrad.compiler import loops as L
from shapegrad.distributed import DistributedError
from shapegrad.distributed._shm import MAX_NODE_RANKS

# Seconds added to SHAPEGRAD_COLLECTIVE_TIMEOUT before a shared-memory wait gives up: a step
# under the watchdog (distributed/_mpi.py, polling each second) is ended by it first, with
# a message naming the step; the native limit is for calls that nothing watches.
SHM_TIMEOUT_MARGIN = 2.0
# Seconds a waiting rank polls (with the CPU's pause hint) before it sleeps. 2 ranks x 1
# thread of the MLP step at load ~6 (2-core AMD EPYC, interleaved, 400 steps): 0.2, 1,
# 3 and 10 ms gave the same 10th/25th percentiles (2.49-2.65 ms vs 2.03-2.08 without
# exchange) and medians within the run-to-run noise (2.7-7.9 ms); the short one leaves
# the core sooner to ranks that outnumber the cores.
SHM_SPIN_SECONDS = 2e-4
# After the spins, a waiting rank sleeps on a futex until the flag it waits for changes
# (Linux), instead of yielding its core in a loop: it leaves the core to the others.
SHM_SLEEP = True
# Bytes of one rank's flags per region: arrived and reduced, each on its own cache line.
_FLAG_BYTES = 128

_SHM = r"""
/* shared-memory all-reduce within one node (backends/c/collectives.py) */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if {sleep} && defined(__linux__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SG_SHM_SLEEP 1
#else
#define SG_SHM_SLEEP 0
#endif
#if SG_SHM_SLEEP
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define SG_SHM_MAXRANKS {maxranks}
#define SG_SHM_NREG {nreg}
#define SG_SHM_BLOCKING {blocking} /* the region of the blocking chunked exchanges */
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

static double sg_shm_spin;             /* seconds a wait spins before it sleeps */

int sg_shm_bind(int comm, int n, int me, void **segments, double limit) {{
    if (comm < 0 || comm >= SG_SHM_NCOMM || n < 0 || n > SG_SHM_MAXRANKS) return 1;
    for (int r = 0; r < n; ++r) sg_shm_seg[comm][r] = (char *)segments[r];
    sg_shm_n[comm] = n;
    sg_shm_me[comm] = me;
    sg_shm_limit = limit;
    sg_shm_spin = {spin};
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

/* A flag's line: the sequence number (u64), then how many ranks sleep on it (u32). A rank
   waits on the low 32 bits of the flag (a futex); the publisher wakes it only where one
   sleeps (both sides sequentially consistent: a sleeper sees the flag or is woken). */
static inline void sg_shm_publish(uint64_t *flag, uint64_t seq) {{
#if SG_SHM_SLEEP
    __atomic_store_n(flag, seq, __ATOMIC_SEQ_CST);
    if (__atomic_load_n((uint32_t *)(flag + 1), __ATOMIC_SEQ_CST))
        syscall(SYS_futex, (uint32_t *)flag, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    __atomic_store_n(flag, seq, __ATOMIC_RELEASE);
#endif
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
    sg_shm_publish(sg_shm_flag(c, me, reg, 0), q->seq);
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
    if (q->stage == 3) {{ /* posted for the readers (sg_shm_post): complete once all are */
        for (int r = 0; r < n; ++r)
            if (__atomic_load_n(sg_shm_flag(c, r, reg, 0), __ATOMIC_ACQUIRE) < q->seq) return 0;
        q->stage = 0;
        return 1;
    }}
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
        sg_shm_publish(sg_shm_flag(c, me, reg, 1), q->seq);
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

/* Leave the core until the flag exchange ``reg`` waits for changes (at most 10 ms), or
   just yield it. */
static void sg_shm_doze(int c, int reg) {{
#if SG_SHM_SLEEP
    sg_shm_req_t *q = &sg_shm_req[c][reg];
    int which = q->stage == 2 ? 1 : 0;
    for (int r = 0; r < sg_shm_n[c]; ++r) {{
        uint64_t *flag = sg_shm_flag(c, r, reg, which);
        uint32_t *sleepers = (uint32_t *)(flag + 1);
        __atomic_fetch_add(sleepers, 1, __ATOMIC_SEQ_CST);
        uint64_t seen = __atomic_load_n(flag, __ATOMIC_SEQ_CST);
        if (seen < q->seq) {{
            struct timespec most = {{0, 10000000}};
            syscall(SYS_futex, (uint32_t *)flag, FUTEX_WAIT, (uint32_t)seen, &most, NULL, 0);
        }}
        __atomic_fetch_sub(sleepers, 1, __ATOMIC_SEQ_CST);
        if (seen < q->seq) return;
    }}
#else
    (void)c;
    (void)reg;
    sched_yield();
#endif
}}

/* Publish that this rank is done with exchange ``reg``'s part (its operand is in its slot,
   or, for a barrier, it has passed the point): sg_shm_wait then waits for every rank's. */
static void sg_shm_post(int c, int reg, int64_t count) {{
    sg_shm_req_t *q = &sg_shm_req[c][reg];
    uint64_t *flag = sg_shm_flag(c, sg_shm_me[c], reg, 0);
    q->count = count;
    q->kind = 0;
    q->seq = __atomic_load_n(flag, __ATOMIC_RELAXED) + 1;
    q->stage = 3;
    sg_shm_publish(flag, q->seq);
}}

/* This rank's part [lo, hi) of an update over n elements of state kept once per node
   (shmshard.py): its chunk where the bound step shards (``on``), else all of it. */
static inline void sg_shard_range(int c, int on, int64_t n, int64_t *lo, int64_t *hi) {{
    if (on && sg_shm_n[c]) sg_shm_chunk(c, n, sg_shm_me[c], lo, hi);
    else {{ *lo = 0; *hi = n; }}
}}

/* Finish exchange ``reg``: 0, or 1 after the time limit (the ranks missing printed). */
static int sg_shm_wait(int c, int reg) {{
    struct timespec t0, t1;
    int dozing = 0;
    for (uint64_t spin = 0; !sg_shm_progress(c, reg); ++spin) {{
        if (spin == 0) clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!dozing && (spin & 63) != 63) {{ sg_shm_relax(); continue; }}
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (!dozing && waited < sg_shm_spin) {{ sg_shm_relax(); continue; }}
        dozing = 1;
        sg_shm_doze(c, reg);
        if (sg_shm_limit > 0 && waited > sg_shm_limit) {{
            sg_shm_req_t *q = &sg_shm_req[c][reg];
            int which = q->stage == 2 ? 1 : 0;
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


_READER = r"""
/* reduce at the reader (shm.py, ReaderSum): the producer writes this rank's operand into
   its own segment (sg_shm_operand: the slot of the next exchange's parity), sg_shm_post
   publishes it, and every load of the result sums the ranks' slots in rank order
   (sg_shm_summand). Without segments (MPI), summand 0 is MPI's result and the others
   read -0.0, which adds exactly (x + -0.0 == x, bitwise, for every x).
   SG_SUM_FENCE keeps -fassociative-math from moving a rank's term into the expression
   that reads the sum (ranks compiling different programs, e.g. a rank-dependent key,
   would then round differently): gcc 12's __builtin_assoc_barrier (the loop still
   vectorizes), clang's __arithmetic_fence, else a register round trip the compiler
   cannot see through. */
#if defined(__clang__) && defined(__has_builtin)
#if __has_builtin(__arithmetic_fence)
#define SG_SUM_FENCE(x) __arithmetic_fence(x)
#endif
#elif defined(__GNUC__) && __GNUC__ >= 12
#define SG_SUM_FENCE(x) __builtin_assoc_barrier(x)
#endif
#ifndef SG_SUM_FENCE
#define SG_SUM_FENCE(x) ({{ __typeof__(x) sg_v = (x); __asm__("" : "+m"(sg_v)); sg_v; }})
#endif
static const int64_t sg_shm_slot[SG_SHM_NREG] = {{{slots}}};  /* bytes between parities */
static float sg_shm_nz_f[{nzf}];
static double sg_shm_nz_d[{nzd}];
__attribute__((constructor)) static void sg_shm_fill_nz(void) {{
    for (int64_t i = 0; i < {nzf}; ++i) sg_shm_nz_f[i] = -0.0f;
    for (int64_t i = 0; i < {nzd}; ++i) sg_shm_nz_d[i] = -0.0;
}}

static inline char *sg_shm_operand(int c, int reg, char *own) {{
    if (!sg_shm_n[c]) return own;
    int me = sg_shm_me[c];
    uint64_t next = __atomic_load_n(sg_shm_flag(c, me, reg, 0), __ATOMIC_RELAXED) + 1;
    return sg_shm_seg[c][me] + sg_shm_off[reg] + (int64_t)(next & 1) * sg_shm_slot[reg];
}}

static inline const char *sg_shm_summand(int c, int reg, int r, const char *sum,
                                         const char *nz) {{
    if (!sg_shm_n[c]) return r == 0 ? sum : nz;
    uint64_t seq = __atomic_load_n(sg_shm_flag(c, sg_shm_me[c], reg, 0), __ATOMIC_RELAXED);
    return sg_shm_seg[c][r] + sg_shm_off[reg] + (int64_t)(seq & 1) * sg_shm_slot[reg];
}}

"""


def shm_prelude(program: L.Program, nrequests: int) -> str:
    """The C of the shared-memory all-reduce for ``program`` ("" when none of its
    communicators has ``allreduce == "shm"``); ``nrequests``: its nonblocking requests."""
    if not any(transport(c) == "shm" for c in program.communicators):
        return ""
    offsets, results, slots, _ = _layout(program, nrequests)
    text = _SHM.format(
        maxranks=MAX_NODE_RANKS,
        nreg=len(offsets),
        blocking=nrequests,
        ncomms=len(program.communicators),
        offsets=", ".join(map(str, offsets)),
        results=", ".join(map(str, results)),
        flag_bytes=_FLAG_BYTES,
        spin=SHM_SPIN_SECONDS,
        sleep=int(SHM_SLEEP),
        margin=SHM_TIMEOUT_MARGIN,
    )
    sums = shmplan.reader_sums(program, nrequests)
    if not sums:
        return text
    counts = {name: max((s.count for s in sums if s.dtype == name), default=1)
              for name in ("float32", "float64")}  # fmt: skip
    return text + _READER.format(
        slots=", ".join(map(str, slots)), nzf=counts["float32"], nzd=counts["float64"]
    )


def shared_layout(program: L.Program, nrequests: int) -> tuple[list[int], list[int], int]:
    """(offsets, results, segment bytes) of ``_layout``."""
    offsets, results, _, nbytes = _layout(program, nrequests)
    return offsets, results, nbytes


def _layout(program: L.Program, nrequests: int) -> tuple[list[int], list[int], list[int], int]:
    """(offset of each region's operand area in a rank's segment, of its result area,
    segment bytes). Region ``r`` serves request ``r``, the next one (number
    ``nrequests``, ``SG_SHM_BLOCKING``) the blocking exchanges; the flags of all regions come first (``_FLAG_BYTES`` each), every area
    starts on a cache line. Operands and results have separate areas: two exchanges of
    one region may differ in size, so chunk ``r`` of one overlaps chunk ``q`` of the next,
    and a rank writing its next operand must not overwrite a result still being read.
    The result area holds the rank's own chunk only: at most half the elements (rounded
    up, plus the 16 of the chunk rounding) with 2 or more ranks.

    The exchanges reduced at their readers (``reader_sums``) follow, one region each: two
    operand slots (parities), no result area; ``slots``: the bytes from one slot to the
    next (0 for the chunked regions)."""
    sums = shmplan.reader_sums(program, nrequests)
    fused = {(s.comm, s.dst) for s in sums}
    nreg = nrequests + 1
    sizes, chunks = [0] * nreg, [0] * nreg
    for p in L.nested_programs(program):
        for k in p.kernels:
            for s in L.walk(k.body):
                if isinstance(s, L.Collective) and shareable(s):
                    if p is program and (s.comm, s.dst) in fused:
                        continue
                    reg = nreg - 1 if s.phase == "blocking" else s.request
                    itemsize = s.dtype.numpy.itemsize
                    sizes[reg] = max(sizes[reg], s.count * itemsize)
                    # a chunk: ceil(count / ranks) rounded up to 16 elements, ranks >= 2
                    chunks[reg] = max(chunks[reg], ((s.count + 1) // 2 + 16) * itemsize)
    slots = [0] * nreg
    for rs in sums:
        slot = -(-rs.count * rs.itemsize // 64) * 64
        sizes.append(2 * slot)
        chunks.append(0)
        slots.append(slot)
    if shard_plan(program) is not None:  # the barriers of sharded updates: flags only
        sizes += [0, 0]
        chunks += [0, 0]
        slots += [0, 0]
    offsets, results, at = [], [], _FLAG_BYTES * len(sizes)
    for size, chunk in zip(sizes, chunks, strict=True):
        offsets.append(at)
        at += -(-size // 64) * 64
        results.append(at)
        at += -(-chunk // 64) * 64
    return offsets, results, slots, at


def shard_regions(program: L.Program, nrequests: int) -> tuple[int, int]:
    """The regions of the two barriers of sharded updates (``shmshard``): ``read`` (every
    rank is done reading shared state outside the updates) and ``updated``; they follow
    the regions of the exchanges reduced at their readers."""
    first = nrequests + 1 + len(shmplan.reader_sums(program, nrequests))
    return first, first + 1


def render_shared(
    s: L.Collective, fail: str, emit: Any, depth: int, fused: ReaderSum | None = None
) -> None:
    """``if (sg_shm_n[c]) { the shared-memory exchange } else`` ahead of the MPI call
    (compiled in where the prelude has the shared-memory functions). ``fused``: the
    exchange reduces at its readers (its start only publishes; a test has nothing to do)."""
    kind = ("float32", "float64", "int32").index(s.dtype.name) + (3 if s.op == "max" else 0)
    reg = "SG_SHM_BLOCKING" if s.phase == "blocking" else str(s.request)
    c = s.comm
    emit(0, "#ifdef SG_SHM_NREG")
    if fused is not None:
        reg = str(fused.region)
        emit(depth, f"if (sg_shm_n[{c}]) {{")
        if s.phase in ("blocking", "start"):
            emit(depth + 1, f"sg_shm_post({c}, {reg}, {s.count});")
        if s.phase in ("blocking", "wait"):
            emit(depth + 1, f"if (sg_shm_wait({c}, {reg})) {fail}")
    elif s.phase in ("blocking", "start"):
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


def reader_pointers(rs: ReaderSum, name: str, own: str, loaded: bool) -> list[str]:
    """The C declarations of buffer ``name`` (``rs.src`` or ``rs.dst``) in a kernel; ``own``:
    its address in the arena (where MPI's all-reduce reads and writes it). The source
    points at this rank's slot; the destination keeps its own pointer, plus one per rank
    (``{dst}_sum{r}``) where the kernel loads it."""
    t = "float" if rs.dtype == "float32" else "double"
    if name == rs.src:
        return [f"{t} *restrict {name} = ({t} *)sg_shm_operand({rs.comm}, {rs.region}, {own});"]
    out = [f"{t} *restrict {name} = ({t} *){own};"]
    if loaded:
        nz = "sg_shm_nz_f" if rs.dtype == "float32" else "sg_shm_nz_d"
        out += [
            f"const {t} *restrict {name}_sum{r} = (const {t} *)sg_shm_summand({rs.comm}, "
            f"{rs.region}, {r}, (const char *){own}, (const char *){nz});"
            for r in range(rs.ranks)
        ]
    return out


def reader_load(rs: ReaderSum, index: str) -> str:
    """A load of ``rs.dst`` at ``index``: the ranks' values summed in rank order (the order
    of the chunked path's sum), each partial sum fenced against reassociation
    (``SG_SUM_FENCE``), so every rank computes the same bits."""
    text = f"{rs.dst}_sum0[{index}]"
    for r in range(1, rs.ranks):
        text = f"SG_SUM_FENCE({text} + {rs.dst}_sum{r}[{index}])"
    return text


def bind_shared(lib: Any, ffi: Any, program: L.Program, nrequests: int) -> set[int]:
    """Hand the generated code every rank's shared segment, for each communicator whose
    ``allreduce`` is ``"shm"`` and whose processes are all on this node (collective over
    those communicators; the others keep MPI's all-reduce). Where it binds, the messages
    of the program's all-reduce failures say that a wait may also have timed out.
    Returns the indices of the communicators bound to shared memory."""
    bound: set[int] = set()
    if not any(transport(c) == "shm" for c in program.communicators):
        return bound
    try:
        lib.sg_shm_bind  # noqa: B018 -- a library rendered without it (CUDA's) keeps MPI
    except AttributeError:
        return bound
    _, _, nbytes = shared_layout(program, nrequests)
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
        bound.add(k)
        for p in L.nested_programs(program):
            for kernel in p.kernels:
                for s in L.walk(kernel.body):
                    if isinstance(s, L.Collective) and s.comm == k and shareable(s) and seconds:
                        _note_timeout(program, s.code)
    return bound


def _note_timeout(program: L.Program, code: int) -> None:
    text = program.errors.get(code)
    extra = ", or its shared-memory wait timed out (SHAPEGRAD_COLLECTIVE_TIMEOUT; see stderr)"
    if text is not None and extra not in text:
        program.errors[code] = text + extra
