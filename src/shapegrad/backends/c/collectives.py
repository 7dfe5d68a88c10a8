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

The sum and max all-reduces of a communicator whose processes share a node run over
shared memory instead (``backends/c/shm.py``): the same source calls MPI where no
segment is bound.
"""

from __future__ import annotations

from typing import Any

from shapegrad.backends.c import shm, shmplan, shmshard
from shapegrad.compiler import loops as L
from shapegrad.distributed import DistributedError, NativeMPI, check_same

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
        f"all-reduce {shmplan.transport(c) if shared else 'mpi'} */"
        for k, c in enumerate(program.communicators)
    )
    text = _TYPES.format(
        handle=handle,
        ncomms=len(program.communicators),
        names=names,
        nrequests=max(1, requests(program)),
    )
    return text + (shm.shm_prelude(program, requests(program)) if shared else "")


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


def reader_sums(program: L.Program) -> list[shmplan.ReaderSum]:
    """The exchanges of ``program`` reduced at their readers (``shmplan.reader_sums``)."""
    if not program.communicators:
        return []
    return shmplan.reader_sums(program, requests(program))


def shard_text(program: L.Program, fail: Any) -> shmshard.ShardText | None:
    """The C of ``program``'s updates of state kept once per node (``shmshard``), or None;
    ``fail(code)``: the renderer's failure statement."""
    if not program.communicators:
        return None
    plan = shmshard.shard_plan(program)
    if plan is None:
        return None
    regions = shm.shard_regions(program, requests(program))
    return shmshard.ShardText(plan, regions, fail(plan.code))


def render_collective(
    s: L.Collective, type_name: str, emit: Any, depth: int, fused: shmplan.ReaderSum | None = None
) -> None:
    """The C of one ``Collective`` statement (``emit(depth, line)``); ``fused``: its
    ``ReaderSum`` where it reduces at its readers."""
    comm = f"sg_mpi_comm[{s.comm}]"
    fail = f"return {s.code};"
    if shmplan.shareable(s):  # the shared-memory exchange where the library has it, bound
        shm.render_shared(s, fail, emit, depth, fused)
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
            shmplan.transport(comm),
        )
        check_same(  # SHAPEGRAD_SHM_READER must agree too: the protocols differ
            comm,
            f"compiled program {program.name!r}: the all-reduces reduced at their readers "
            "(SHAPEGRAD_SHM_READER)",
            [(r.region, r.count) for r in reader_sums(program) if r.comm == k],
        )
        plan = shmshard.shard_plan(program)
        check_same(  # and SHAPEGRAD_SHM_SHARD: the sharded updates add barriers
            comm,
            f"compiled program {program.name!r}: the state kept once per node "
            "(SHAPEGRAD_SHM_SHARD)",
            list(plan.buffers) if plan else [],
        )


def bind(lib: Any, ffi: Any, program: L.Program) -> set[int]:
    """Hand the generated code the MPI entry points and handles (after ``dlopen``), and
    the shared-memory segments where it has the shared-memory all-reduce
    (``shm.bind_shared``); returns the communicators bound to shared memory."""
    if not program.communicators:
        return set()
    native = native_of(program.communicators[0])
    fns = ffi.new("void *[]", [ffi.cast("void *", native.functions[f]) for f in FUNCTIONS])
    handles = ffi.new("int64_t[]", [_signed(native.handles[h]) for h in HANDLES])
    comms = ffi.new(
        "int64_t[]", [_signed(native_of(c).handles["comm"]) for c in program.communicators]
    )
    lib.sg_mpi_bind(fns, handles, comms)
    return shm.bind_shared(lib, ffi, program, requests(program))


def _signed(handle: int) -> int:
    """A handle as int64: mpi4py gives MPICH's ``int`` handles of derived communicators
    sign-extended to 64 unsigned bits (0xffffffff84000000), which C truncates back."""
    value = int(handle) & 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >= 1 << 63 else value


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_.-/ " else "_" for ch in str(text))
