"""Overlapping all-reduces with computation: the ``overlap_collectives`` loop stage.

A data-parallel step all-reduces its gradients in buckets (``train/step.py``: one
``all_reduce`` per bucket of about ``BUCKET_BYTES``). Graph order puts every bucket's
exchange after the whole backward pass; here each blocking all-reduce becomes a
nonblocking one:

* its kernel is split at the exchange: the statements up to it and a ``start``
  (``MPI_Iallreduce``) form one kernel, a ``wait`` and the statements after it another;
* the kernels are reordered by list scheduling over their true dependencies (read and
  write sets, in the original order): the kernels that the next exchange needs run first
  (the next: the one needing the least work in all), so it starts as soon as its
  bucket's last gradient is written; the other kernels keep their order; a ``wait`` runs
  only when nothing else can, i.e. just before the first kernel that reads the result
  (the optimizer's update of that bucket's parameters, which reads the reduced gradient
  in one elementwise pass), and of several ready waits the one started earliest (the
  most likely finished): the last bucket (the first layer's gradient, started after the
  backward's last product) is waited for last, after the other buckets' updates, so it
  stays nonblocking and those updates run while the slower rank catches up;
* while exchanges are in flight, a ``test`` after each kernel of at least
  ``PROGRESS_MIN_WORK`` scalar operations lets the MPI library advance them (MPICH moves
  a nonblocking collective only inside MPI calls; without these the whole exchange would
  happen in the ``wait``).

Invariants kept: every process runs the same program, so every process starts, tests and
waits the same exchanges in the same order (``check_program`` compares them, phases
included); a kernel that can fail (a bounds check, a layer loop, another exchange) keeps
its place (no kernel moves across it) and never runs while an exchange is in flight, so a
failing step returns with nothing pending and has changed what it changed before (the
error-flag contract of ``loops.py``); an exchange's source and destination stay live
from its start to its wait (they are read and written by both), so ``pack_arena`` gives
nothing else their bytes.

The phases keep their meaning for the shared-memory all-reduce within a node
(``backends/c/shm.py``, the default there): ``start`` copies this rank's operand chunks
in, ``test`` advances without waiting (reduces this rank's chunk once every rank has
arrived, copies the result out once every rank has reduced), ``wait`` finishes. Its work
runs on this rank's core either way, so overlapping hides the wait for the slower rank,
not the work, and the early buckets are done in tests between backward kernels instead
of all at the end. An exchange reduced at its readers (``backends/c/shmplan.py``) has
no work of its own: ``start`` publishes the operand its producer wrote in place,
``test`` does nothing, ``wait`` waits for every rank's operand, and the update sums them
as it loads them.

An exchange that nothing runs alongside (one bucket: its start is right before its wait)
stays blocking. Only top-level all-reduces without ``root`` are overlapped (the
data-parallel ones); other collectives stay blocking and are ordered like any failing
kernel. An MPI failure ends the job (``distributed/_mpi.py``'s failure policy), so the
exchanges it leaves in flight are never waited for.
"""

from __future__ import annotations

from dataclasses import replace

from shapegrad.compiler import loops as L

# A kernel this large (estimated scalar ops) is followed by an MPI_Test of each exchange in
# flight. MPICH moves a large shared-memory message in chunks, about one per progress call
# of each side, so the tests are what moves the early buckets while the backward runs: on
# the 2-core AMD EPYC at load ~14 (benchmarks/data_parallel.py --bucket-sweep, five runs)
# the MLP step with 1 MiB buckets took 24.2-26.2 ms with them and 31.4-38.9 ms without.
# A test of an unfinished request costs ~0.2-1 us, so kernels under ~10 us of work
# (scalar bookkeeping) get none (that threshold is reasoned, not measured).
PROGRESS_MIN_WORK = 10_000


def overlap_collectives(program: L.Program) -> L.Program:
    """Split the program's top-level all-reduces into start/test/wait and reorder its kernels
    (see the module docstring). A program without such an all-reduce is left as it is."""
    kernels, requests = _split(program.kernels)
    if not requests:
        return program
    program.kernels = _rejoin_unoverlapped(_schedule(kernels))
    return program


def _rejoin_unoverlapped(kernels: list[L.Kernel]) -> list[L.Kernel]:
    """An exchange with no kernel of at least ``PROGRESS_MIN_WORK`` between its start and
    its wait hides nothing: it becomes one blocking exchange again, at its start. MPICH
    runs a blocking all-reduce with its shared-memory collective algorithms, fewer
    handshakes than the nonblocking one; on the 2-core AMD EPYC under load (9-15) the
    MLP step with one bucket took 30.2 ms blocking vs 32.2 ms nonblocking (means of five
    interleaved runs; 23.1 vs 24.0 in five more)."""
    starts: dict[int, int] = {}
    hidden: set[int] = set()  # requests with real work in flight
    for n, kernel in enumerate(kernels):
        phase, request = _phase(kernel)
        if phase != "wait" and kernel.work >= PROGRESS_MIN_WORK:
            hidden.update(starts)  # the exchanges already in flight
        if phase == "start":
            starts[request] = n
        elif phase == "wait":
            starts.pop(request)
    out: list[L.Kernel] = []
    for kernel in kernels:
        phase, request = _phase(kernel)
        body = kernel.body
        if request not in hidden and phase in ("start", "wait"):
            body = tuple(
                replace(s, phase="blocking", request=-1)
                if isinstance(s, L.Collective) and s.request == request and s.phase == "start"
                else s
                for s in body
                if not (isinstance(s, L.Collective) and s.request == request and s.phase == "wait")
            )
        body = tuple(  # no tests of exchanges that are blocking again
            s
            for s in body
            if not (isinstance(s, L.Collective) and s.phase == "test" and s.request not in hidden)
        )
        if body:
            out.append(replace(kernel, body=body) if body != kernel.body else kernel)
    return out


def _overlappable(s: L.Stmt) -> bool:
    return (
        isinstance(s, L.Collective)
        and s.phase == "blocking"
        and s.kind == "all_reduce"
        and s.root is None
    )


def _split(kernels: list[L.Kernel]) -> tuple[list[L.Kernel], int]:
    """Each kernel with a top-level overlappable all-reduce becomes a start kernel and a
    wait kernel (numbered requests from 0, in program order). Lowering gives every
    collective a kernel of its own; should a kernel hold more than one, the later ones
    stay blocking (in the wait kernel)."""
    out: list[L.Kernel] = []
    request = 0
    for kernel in kernels:
        at = next((i for i, s in enumerate(kernel.body) if _overlappable(s)), None)
        if at is None:
            out.append(kernel)
            continue
        s = kernel.body[at]
        assert isinstance(s, L.Collective)
        start = replace(s, phase="start", request=request)
        wait = replace(s, phase="wait", request=request)
        out.append(replace(kernel, name=f"{kernel.name}_start", body=(*kernel.body[:at], start)))
        out.append(
            L.Kernel(
                f"{kernel.name}_wait", (wait, *kernel.body[at + 1 :]), kernel.work, kernel.root,
                list(kernel.inlined),
            )
        )  # fmt: skip
        request += 1
    return out, request


def _phase(kernel: L.Kernel) -> tuple[str, int]:
    """("start" | "wait", request) for the kernels ``_split`` made, else ("", -1)."""
    for s in kernel.body:
        if isinstance(s, L.Collective) and s.phase in ("start", "wait"):
            return s.phase, s.request
    return "", -1


def _can_fail(kernel: L.Kernel) -> bool:
    """Whether the kernel may return an error (or exchange) with nothing else in flight."""
    return any(
        isinstance(s, L.CheckBounds | L.LayerLoop)
        or (isinstance(s, L.Collective) and s.phase == "blocking")
        for s in L.walk(kernel.body)
    )


def _dependencies(kernels: list[L.Kernel], fails: list[bool]) -> list[set[int]]:
    """For each kernel, the earlier kernels it must follow (read-after-write,
    write-after-read, write-after-write on a buffer, in the original order). A kernel that
    can fail is a barrier: nothing moves across it either way, so the checks of input
    indices still run first, and a failing step has changed exactly what it changed
    before (no state update moves before a check)."""
    last_writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    deps: list[set[int]] = []
    barrier: int | None = None
    since: list[int] = []  # kernels after the last barrier
    for n, kernel in enumerate(kernels):
        read, written = L.reads(kernel.body), L.writes(kernel.body)
        mine: set[int] = set()
        if barrier is not None:
            mine.add(barrier)
        if fails[n]:
            mine.update(since)
            barrier, since = n, []
        else:
            since.append(n)
        for name in read | written:
            if name in last_writer:
                mine.add(last_writer[name])
        for name in written:
            mine.update(readers.get(name, ()))
        for name in written:
            last_writer[name] = n
            readers[name] = []
        for name in read:
            readers.setdefault(name, []).append(n)
        mine.discard(n)
        deps.append(mine)
    return deps


def _schedule(kernels: list[L.Kernel]) -> list[L.Kernel]:
    """List scheduling (see the module docstring), with ``test`` statements after large
    kernels while exchanges are in flight."""
    phases = [_phase(k) for k in kernels]
    fails = [_can_fail(k) for k in kernels]
    deps = _dependencies(kernels, fails)
    users: list[list[int]] = [[] for _ in kernels]
    for n, mine in enumerate(deps):
        for d in mine:
            users[d].append(n)
    waiting = [len(d) for d in deps]
    ancestors = {
        n: _closure(deps, n) | {n} for n, (phase, _) in enumerate(phases) if phase == "start"
    }
    # The exchanges in the order their operands can be complete: by the work of everything
    # they need (graph order says nothing: it may put a first layer's product before the
    # last layer's).
    starts = sorted(ancestors, key=lambda n: (sum(kernels[a].work for a in ancestors[n] - {n}), n))
    ready = {n for n, w in enumerate(waiting) if w == 0}
    done: set[int] = set()
    in_flight: dict[int, L.Collective] = {}  # request -> its start statement
    started: dict[int, int] = {}  # request in flight -> how many exchanges started before
    order: list[L.Kernel] = []
    pending = 0  # starts[pending]: the next exchange
    while ready:
        while pending < len(starts) and starts[pending] in done:
            pending += 1
        target = ancestors[starts[pending]] if pending < len(starts) else set()
        n = _pick(ready, phases, fails, target, started)
        ready.discard(n)
        done.add(n)
        kernel = kernels[n]
        phase, request = phases[n]
        if phase == "wait":
            in_flight.pop(request)
            started.pop(request)
        if phase != "start" and in_flight and kernel.work >= PROGRESS_MIN_WORK:
            tests = tuple(replace(s, phase="test") for _, s in sorted(in_flight.items()))
            kernel = replace(kernel, body=(*kernel.body, *tests))
        if phase == "start":
            start = kernel.body[-1]
            assert isinstance(start, L.Collective)
            in_flight[request] = start
            started[request] = len(order)
        order.append(kernel)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.add(u)
    assert len(order) == len(kernels), "overlap_collectives: the dependencies form a cycle"
    return order


def _pick(
    ready: set[int],
    phases: list[tuple[str, int]],
    fails: list[bool],
    target: set[int],
    started: dict[int, int],
) -> int:
    """The next kernel: first what the next exchange still needs (``target``: its start
    and every kernel it depends on), then any other kernel in program order; a kernel that
    can fail only with nothing in flight (``started``: the requests in flight, by when
    they started); a wait only when nothing else is ready, the earliest started first
    (the most likely done: the updates of the later ones then run while they finish)."""
    plain = [n for n in ready if phases[n][0] != "wait" and not (started and fails[n])]
    preferred = [n for n in plain if n in target]
    if preferred:
        return min(preferred)
    if plain:
        return min(plain)
    waits = [n for n in ready if phases[n][0] == "wait"]
    if waits:
        return min(waits, key=lambda n: (started.get(phases[n][1], len(phases)), n))
    return min(ready)


def _closure(deps: list[set[int]], n: int) -> set[int]:
    """Every kernel ``n`` depends on, directly or not."""
    seen: set[int] = set()
    stack = list(deps[n])
    while stack:
        d = stack.pop()
        if d not in seen:
            seen.add(d)
            stack.extend(deps[d])
    return seen
