"""Overlapped data-parallel all-reduces: gradient buckets (``train/step.py``) and the
``overlap_collectives`` loop stage (``compiler/overlap.py``) on the program of a real
MLP training step, and the order of the nonblocking MPI calls in its generated C.

These tests only lower and render (no exchange runs), so they stand in a two-process
communicator whose host collectives refuse to run. The values (ranks bit-equal, equal to
one process on the global batch, for several bucket sizes) are checked under ``mpiexec``
by ``tests/distributed_worker.py`` (``check_buckets``)."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c import collectives, shm, shmplan
from shapegrad.backends.c.render import render_c
from shapegrad.compiler import loops as L
from shapegrad.compiler.overlap import overlap_collectives
from shapegrad.compiler.pipeline import LOOP_PIPELINE, LoopStage, lower_program
from shapegrad.compiler.target import C_TARGET
from shapegrad.distributed import NativeMPI
from shapegrad.train.step import average_over_processes, gradient_buckets

SHAPES = [(64, 256), (256,), (256, 256), (256,), (256, 10), (10,)]  # products big enough for BLAS


class _TwoProcesses:
    """A 2-process communicator for lowering only: nothing here may exchange data."""

    rank, size, key = 0, 2, "world"

    def native(self) -> NativeMPI:  # the generated code's bindings; never called here
        return NativeMPI("int", {}, {}, 0)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a lowering-only test tried to run {name}")


# --- gradient buckets ---------------------------------------------------------------------


def test_buckets_last_gradient_first_and_filled_to_the_size() -> None:
    # 4-byte items, 64-byte buckets: 3 + 2 + 10 elements (60 B) do not fill the first
    # bucket yet, 3 more (72 B) do; the rest (12 B) is the last bucket
    assert gradient_buckets([1, 2, 3, 10, 2, 3], 4, 64) == [[5, 4, 3, 2], [1, 0]]


def test_one_bucket_when_everything_fits() -> None:
    assert gradient_buckets([5, 1, 7], 8, 1 << 30) == [[2, 1, 0]]


def test_a_gradient_larger_than_a_bucket_is_a_bucket_of_its_own() -> None:
    # the 100-element gradient (400 B > 64 B) is never split nor merged with its neighbours
    assert gradient_buckets([3, 100, 2, 1], 4, 64) == [[3, 2], [1], [0]]
    sizes = [784 * 512, 512, 512 * 512, 512, 512 * 10, 10]  # the benchmark's MLP at 1 MiB
    assert gradient_buckets(sizes, 4, 1 << 20) == [[5, 4, 3], [2], [1], [0]]


def test_every_gradient_alone_and_bad_sizes() -> None:
    assert gradient_buckets([2, 2, 2], 4, 1) == [[2], [1], [0]]
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        gradient_buckets([2], 4, 0)


# --- the loop stage on a training step -------------------------------------------------------


def _mlp_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = x
    for i in range(0, len(params) - 2, 2):
        h = sg.relu(h @ params[i] + params[i + 1])
    return sg.functional.cross_entropy(h @ params[-2] + params[-1], y)


def _step_program(bucket_bytes: int, pipeline: list[LoopStage] | None = None) -> L.Program:
    """The loop program of one data-parallel SGD step of a 3-layer MLP (C target)."""
    plan = types.SimpleNamespace(comm=_TwoProcesses())

    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        loss, grads = sg.value_and_grad(_mlp_loss)(params, x, y)
        loss, grads = average_over_processes(plan, loss, grads, bucket_bytes)  # type: ignore[arg-type]
        return loss, [w - 0.1 * g for w, g in zip(params, grads, strict=True)]

    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    graph = sg.compile(step, backend="numpy").graph(params, x, y)
    program, _ = lower_program(graph, C_TARGET, name="dp_step", pipeline=pipeline)
    return program


def _exchanges(program: L.Program, phase: str) -> dict[int, tuple[int, L.Collective]]:
    """request -> (kernel position, statement) of each exchange statement of ``phase``."""
    out: dict[int, tuple[int, L.Collective]] = {}
    for n, k in enumerate(program.kernels):
        for s in k.body:
            if isinstance(s, L.Collective) and s.phase == phase:
                out[s.request] = (n, s)
    return out


def _has_exchange(kernel: L.Kernel, phase: str) -> bool:
    return any(isinstance(s, L.Collective) and s.phase == phase for s in kernel.body)


def _has_product(kernel: L.Kernel) -> bool:
    return any(isinstance(s, L.Contract) for s in L.walk(kernel.body))


@pytest.mark.parametrize("bucket_bytes", [1, 1 << 12, 1 << 30])
def test_each_bucket_starts_after_its_last_gradient_and_waits_before_its_update(
    bucket_bytes: int,
) -> None:
    program = _step_program(bucket_bytes)
    kernels = program.kernels
    sizes = [*(int(np.prod(s)) for s in SHAPES), 1]  # the loss rides last
    buckets = gradient_buckets(sizes, 4, bucket_bytes)
    starts, waits = _exchanges(program, "start"), _exchanges(program, "wait")
    if len(buckets) == 1:  # nothing to overlap with: one blocking exchange, after the backward
        at = next(n for n, k in enumerate(kernels) if _has_exchange(k, "blocking"))
        assert not starts and not waits
        assert sum(_has_exchange(k, "blocking") for k in kernels) == 1
        assert not any(_has_product(k) for k in kernels[at + 1 :])
        return
    # one exchange per bucket; one with nothing big to run alongside stays blocking
    blocking = [
        s for k in kernels for s in k.body if isinstance(s, L.Collective) and s.phase == "blocking"
    ]
    assert sorted(starts) == sorted(waits) and starts
    assert len(starts) + len(blocking) == len(buckets)
    for r, (at, start) in starts.items():
        wait_at, wait = waits[r]
        assert (wait.src, wait.dst, wait.count) == (start.src, start.dst, start.count)
        # started right after the kernel that completes its operand ...
        assert start.src in L.writes(kernels[at - 1].body) or start.src in L.writes(
            kernels[at].body
        )
        # ... and waited for right before the first kernel that reads the result
        between = kernels[at + 1 : wait_at]
        assert not any(start.dst in L.reads(k.body) | L.writes(k.body) for k in between)
        assert not any(start.src in L.writes(k.body) for k in between)
        after = [k for k in kernels[wait_at + 1 :] if start.dst in L.reads(k.body)]
        assert after and kernels.index(after[0]) == wait_at + 1 + sum(
            1 for k in kernels[wait_at + 1 : kernels.index(after[0])] if "_wait" in k.name
        )
        # nothing that can fail runs while it is in flight (error-flag contract)
        assert not any(
            isinstance(s, L.CheckBounds | L.LayerLoop) for k in between for s in L.walk(k.body)
        )
    # the first bucket (the last layer's gradients) overlaps the earlier layers' products
    first = min(starts, key=lambda r: starts[r][0])  # the first exchange started
    first_at, first_wait = starts[first][0], waits[first][0]
    assert any(_has_product(k) for k in kernels[first_at + 1 : first_wait])
    # every exchange but the first layer's starts before the first layer's weight gradient
    # (the backward's last product)
    last_product = max(n for n, k in enumerate(kernels) if _has_product(k))
    order = sorted(at for at, _ in starts.values())
    assert all(at < last_product for at in order[:-1])
    # large kernels in flight give MPI a chance to progress
    tests = [
        s
        for k in kernels[first_at + 1 : first_wait]
        for s in k.body
        if isinstance(s, L.Collective) and s.phase == "test"
    ]
    assert tests and all(t.request in starts for t in tests)


def test_input_checks_still_run_first() -> None:
    program = _step_program(1)
    assert program.kernels[0].name == "k_checks"


def test_no_kernel_moves_across_one_that_can_fail() -> None:
    """Kernels with bounds checks (here: the labels of the cross-entropy, checked where they
    are computed) keep exactly the kernels before them that they had without the stage."""
    without = [s for s in LOOP_PIPELINE if s.name != "overlap_collectives"]
    plain = _step_program(1 << 12, without)
    overlapped = _step_program(1 << 12)

    def before_each_check(program: L.Program) -> list[set[str]]:
        names = [k.name.removesuffix("_start").removesuffix("_wait") for k in program.kernels]
        return [
            set(names[:n])
            for n, k in enumerate(program.kernels)
            if any(isinstance(s, L.CheckBounds) for s in L.walk(k.body))
        ]

    checks = before_each_check(plain)
    assert len(checks) >= 2  # the hoisted input checks and a computed index's check
    assert before_each_check(overlapped) == checks


def test_a_program_without_all_reduce_is_left_as_it_is() -> None:
    plain = _step_program(1 << 12, [s for s in LOOP_PIPELINE if s.name != "overlap_collectives"])
    program = L.Program("p", dict(plain.buffers), [k for k in plain.kernels])
    for k in program.kernels:  # the same program with its exchanges removed
        k.body = tuple(s for s in k.body if not isinstance(s, L.Collective))
    kernels = list(program.kernels)
    assert overlap_collectives(program).kernels == kernels


def test_generated_c_starts_tests_and_waits_in_order() -> None:
    program = _step_program(1 << 12)
    source = render_c(program)
    # a program that forks teams (collectives do) renders its step as sg_fork_body under
    # the adaptive-team wrapper sg_body
    start = source.find("static int sg_fork_body")
    body = source[start if start >= 0 else source.index("static int sg_body") :]
    lines = body.splitlines()

    def first(text: str) -> int:
        return next(n for n, line in enumerate(lines) if text in line)

    starts = [n for n, line in enumerate(lines) if "sg_mpi_iallreduce(" in line]
    waits = [n for n, line in enumerate(lines) if "sg_mpi_wait(&" in line]
    blocking = [n for n, line in enumerate(lines) if "sg_mpi_allreduce(" in line]
    sizes = [*(int(np.prod(s)) for s in SHAPES), 1]
    assert len(starts) == len(waits) >= 1
    assert len(starts) + len(blocking) == len(gradient_buckets(sizes, 4, 1 << 12))

    def request(n: int) -> str:
        return lines[n][lines[n].index("&sg_mpi_request[") :].split("]")[0]

    wait_of = {request(w): w for w in waits}
    assert sorted(wait_of) == sorted(request(s) for s in starts)
    assert all(s < wait_of[request(s)] for s in starts)
    # the first exchange starts before the first layer's weight-gradient product and is
    # tested for progress while it runs
    products = [n for n, line in enumerate(lines) if "cblas_sgemm" in line or "sg_gemm" in line]
    first_wait = wait_of[request(starts[0])]
    assert products and starts[0] < max(products) < first_wait
    assert starts[0] < first(f"sg_mpi_test({request(starts[0])}]") < first_wait


# --- the shared-memory all-reduce in the generated C (values: tests/distributed_worker.py) ---


class _TwoOnOneNode(_TwoProcesses):
    """The stand-in with the shared-memory transport (``MPICommunicator(allreduce="shm")``)."""

    allreduce = "shm"

    def shared_segments(self, tag: str, nbytes: int) -> None:
        raise AssertionError("a lowering-only test tried to bind shared memory")


def test_shared_memory_exchange_rendered_beside_mpi_and_laid_out_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shmplan, "READER_SUMS", False)  # the chunked path (reader sums below)
    plan_comm = _TwoOnOneNode()
    program = _step_program(1 << 12)
    program.communicators = [plan_comm]  # same program, the transport of the stand-in
    source = render_c(program)
    starts, waits = _exchanges(program, "start"), _exchanges(program, "wait")
    tests = sum(
        1
        for k in program.kernels
        for s in k.body
        if isinstance(s, L.Collective) and s.phase == "test"
    )
    blocking = [
        s
        for k in program.kernels
        for s in k.body
        if isinstance(s, L.Collective) and s.phase == "blocking"
    ]
    # every phase has its shared-memory call, the MPI call kept as the else branch
    assert source.count("sg_shm_start(0, ") == len(starts) + len(blocking)
    assert source.count("sg_shm_wait(0, ") == len(waits) + len(blocking)
    assert source.count("sg_shm_progress(0, ") == tests
    assert source.count("sg_mpi_iallreduce(") == len(starts)
    assert "int sg_shm_bind(" in source and "all-reduce shm */" in source
    # one region per request and one for the blocking exchanges, each as large as its largest
    offsets, results, nbytes = shm.shared_layout(program, collectives.requests(program))
    assert len(offsets) == len(results) == max(starts) + 2  # requests keep their numbers
    # (operands: every element; results: one chunk, at most half of them + 16 rounding)
    ends = [*offsets[1:], nbytes]
    for r, (_, start) in starts.items():
        assert results[r] - offsets[r] >= 4 * start.count
        assert ends[r] - results[r] >= 4 * ((start.count + 1) // 2 + 16)
    if blocking:
        assert results[-1] - offsets[-1] >= 4 * max(s.count for s in blocking)
        assert nbytes - results[-1] >= 4 * max((s.count + 1) // 2 + 16 for s in blocking)
    assert all(o % 64 == 0 for o in [*offsets, *results, nbytes])


def test_mpi_transport_renders_no_shared_memory() -> None:
    source = render_c(_step_program(1 << 12))  # _TwoProcesses: no shared_segments
    assert "sg_shm_bind" not in source and "all-reduce mpi */" in source


def test_allreduce_transport_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from shapegrad.distributed._shm import allreduce_transport

    monkeypatch.delenv("SHAPEGRAD_ALLREDUCE", raising=False)
    assert allreduce_transport(None) == "shm" and allreduce_transport("mpi") == "mpi"
    monkeypatch.setenv("SHAPEGRAD_ALLREDUCE", "mpi")
    assert allreduce_transport(None) == "mpi"
    monkeypatch.setenv("SHAPEGRAD_ALLREDUCE", "nccl")
    with pytest.raises(ValueError, match="SHAPEGRAD_ALLREDUCE must be one of 'shm', 'mpi'"):
        allreduce_transport(None)
    with pytest.raises(ValueError, match="allreduce must be one of"):
        allreduce_transport("fast")


# --- reduce at the reader (backends/c/shmplan.py, ReaderSum) --------------------------------------


def _body(source: str) -> str:
    start = source.find("static int sg_fork_body")
    return source[start if start >= 0 else source.index("static int sg_body") :]


def test_gradients_are_summed_where_the_update_loads_them() -> None:
    """Every exchange of the MLP step (gradients read only by the update's elementwise
    loop, the loss by a division) reduces at its readers: the producer writes this
    rank's slot, the start only publishes, each load is the ranks' sum in rank order;
    MPI's calls stay as the else branch (no segment bound). Regions: one per exchange
    after the chunked ones, two 64-byte-aligned slots each."""
    program = _step_program(1 << 12)
    program.communicators = [_TwoOnOneNode()]
    starts, waits = _exchanges(program, "start"), _exchanges(program, "wait")
    blocking = [
        s for k in program.kernels for s in k.body
        if isinstance(s, L.Collective) and s.phase == "blocking"
    ]  # fmt: skip
    sums = collectives.reader_sums(program)
    assert len(sums) == len(starts) + len(blocking) >= 2
    source = render_c(program)
    body = _body(source)
    assert body.count("sg_shm_post(0, ") == len(sums)
    # the blocking chunked exchanges keep a region of their own, before the summed ones
    assert f"#define SG_SHM_BLOCKING {collectives.requests(program)} " in source
    assert "sg_shm_start(" not in body and "sg_shm_progress(" not in body
    assert body.count("sg_shm_wait(0, ") == len(waits) + len(blocking)
    assert body.count("sg_mpi_iallreduce(") == len(starts)
    nrequests = collectives.requests(program)
    offsets, _, nbytes = shm.shared_layout(program, nrequests)
    ends = [*offsets[1:], nbytes]
    for n, rs in enumerate(sums):
        assert rs.region == nrequests + 1 + n and rs.ranks == 2
        assert f"{rs.src} = (float *)sg_shm_operand(0, {rs.region}, " in body
        assert f"{rs.dst}[" not in body  # never loaded as one buffer: always the sum
        assert f"SG_SUM_FENCE({rs.dst}_sum0[" in body and f" + {rs.dst}_sum1[" in body
        assert ends[rs.region] - offsets[rs.region] >= 2 * 4 * rs.count
    assert all(o % 64 == 0 for o in [*offsets, nbytes])


def _lowered(fn: Any, *args: np.ndarray) -> L.Program:
    graph = sg.compile(fn, backend="numpy").graph(*args)
    program, _ = lower_program(graph, C_TARGET, name="p")
    return program


def test_an_exchange_read_otherwise_keeps_the_chunked_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sum that a library product or a reduction reads, or that the program returns, is
    materialized (the chunked exchange); a max is never summed at a reader; SHAPEGRAD_SHM_READER=0
    turns the reader sums off."""
    from shapegrad import distributed as D

    comm = _TwoOnOneNode()
    a = np.ones((64, 64), np.float32)
    product = _lowered(lambda x, y: D.all_reduce(x, "sum", comm) @ y, a, a)
    returned = _lowered(lambda x: D.all_reduce(x, "sum", comm), a)
    maximum = _lowered(lambda x: D.all_reduce(x, "max", comm) * 2.0, a)
    norm = _lowered(lambda x: (D.all_reduce(x * 3.0, "sum", comm) ** 2).sum(), a)
    scaled = _lowered(lambda x: D.all_reduce(x * 3.0, "sum", comm) * 2.0, a)
    for program in (product, returned, maximum, norm):
        assert collectives.reader_sums(program) == []
        assert "sg_shm_start(0, " in _body(render_c(program))
    assert [rs.count for rs in collectives.reader_sums(scaled)] == [64 * 64]
    assert "sg_shm_post(0, " in _body(render_c(scaled))
    monkeypatch.setenv("SHAPEGRAD_SHM_READER", "0")
    assert collectives.reader_sums(scaled) == []
    monkeypatch.setenv("SHAPEGRAD_SHM_READER", "off")
    with pytest.raises(ValueError, match=r"SHAPEGRAD_SHM_READER must be '1'.* or '0'.*'off'"):
        collectives.reader_sums(scaled)
