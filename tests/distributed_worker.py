"""The program that tests/test_distributed.py launches with ``mpiexec -n N``.

``python tests/distributed_worker.py TASK OUT_DIR``: every process runs TASK; on
success rank 0 writes ``OUT_DIR/ok-TASK.txt`` (and whatever files the task leaves
for the launching test to check). A failed assertion raises, which aborts the job
(``sg.distributed``'s failure policy), so the launcher sees a non-zero exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad import distributed as D
from shapegrad.backends.c import nodestate
from shapegrad.train.step import average_over_processes

DTYPES = ("float16", "float32", "float64", "int32", "bool")
BACKENDS = ("eager", "numpy", "c")


def _run(backend: str, fn: Any, *args: Any) -> Any:
    if backend == "eager":
        return fn(*args)
    return sg.compile(fn, backend=backend)(*args)


def _rank_data(rank: int, dtype: str, shape: tuple[int, ...] = (6, 5)) -> np.ndarray:
    """Different values on every rank (small integers: exact in every dtype)."""
    rng = np.random.default_rng(100 + rank)
    values = rng.integers(-4, 5, size=shape)
    return (values > 0) if dtype == "bool" else values.astype(dtype)


def check_collectives(comm: D.Communicator) -> None:
    """Values of every collective against NumPy, every dtype, eager + numpy + C."""
    everyone = [_rank_data(r, "float64") for r in range(comm.size)]
    for dtype in DTYPES:
        xs = [_rank_data(r, dtype) for r in range(comm.size)]
        x = sg.tensor(xs[comm.rank], dtype)
        numeric = [a.astype(np.float64) for a in xs]
        expected: dict[str, np.ndarray] = {
            "max": np.max(numeric, axis=0),
            "gather": np.concatenate(xs, axis=0),
            "bcast": xs[comm.size - 1],
        }
        if dtype != "bool":
            expected["sum"] = np.sum(numeric, axis=0)
            block = x.shape[0]  # reduce_scatter of the gathered array: sum x size, own block
            expected["scatter"] = np.sum(numeric, axis=0) * 0 + comm.size * numeric[comm.rank]
            del block
        if dtype.startswith("float"):
            expected["mean"] = np.sum(numeric, axis=0) / comm.size
        last = comm.size - 1
        fns = {
            "sum": lambda t: D.all_reduce(t, "sum"),
            "mean": lambda t: D.all_reduce(t, "mean"),
            "max": lambda t: D.all_reduce(t, "max"),
            "gather": lambda t: D.all_gather(t),
            "bcast": lambda t, last=last: D.broadcast(t, root=last),
            "scatter": lambda t: D.reduce_scatter(D.all_gather(t)),
        }
        for backend in BACKENDS:
            for name, want in expected.items():
                got = _run(backend, fns[name], x).numpy()
                assert got.dtype == np.dtype(dtype if dtype != "bool" else np.bool_), (
                    name,
                    got.dtype,
                )
                assert got.shape == want.shape, (backend, dtype, name, got.shape, want.shape)
                tol = 1e-2 if dtype == "float16" else 1e-12
                ok = np.allclose(got.astype(np.float64), want.astype(np.float64), atol=tol)
                assert ok, (backend, dtype, name, got, want)
    del everyone


def check_metrics(comm: D.Communicator) -> None:
    """Metrics reduced over the processes (what rank 0 prints)."""
    assert D.reduce_metric(comm.rank, "sum") == sum(range(comm.size))
    assert D.reduce_metric(comm.rank + 1.0) == (comm.size + 1) / 2
    assert D.reduce_metric(comm.rank, "max") == comm.size - 1


def check_gradients(comm: D.Communicator) -> None:
    """Gradients of each collective against float64 central differences of the global loss
    sum_r <c_r, f(x)_r> with a random cotangent c_r per rank (the summed objective every
    VJP rule is written for), eager + numpy + C."""
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(4, 3)) for _ in range(comm.size)]
    cts = [rng.normal(size=(4 * comm.size, 3)) for _ in range(comm.size)]
    # ties for max: rank 0's row 0 equals rank 1's
    if comm.size > 1:
        xs[1][0] = xs[0][0] + 0.0
    fns = {
        "sum": (lambda t: D.all_reduce(t, "sum"), lambda a: np.sum(a, 0)),
        "mean": (lambda t: D.all_reduce(t, "mean"), lambda a: np.mean(a, 0)),
        "gather": (lambda t: D.all_gather(t), lambda a: np.concatenate(list(a), 0)),
        "bcast": (lambda t: D.broadcast(t, root=comm.size - 1), lambda a: a[-1]),
        "scatter": (lambda t: D.reduce_scatter(t), None),
        "max": (lambda t: D.all_reduce(t, "max"), lambda a: np.max(a, 0)),
    }
    for name, (fn, ref) in fns.items():
        shape_in = (4 * comm.size, 3) if name == "scatter" else (4, 3)
        xin = [rng.normal(size=shape_in) if name == "scatter" else xs[r] for r in range(comm.size)]
        xin = comm.broadcast_object(xin, 0)
        out_shape = np.shape(_global(name, ref, xin, comm.size, 0))
        ct = [c.reshape(-1)[: int(np.prod(out_shape))].reshape(out_shape) for c in cts]

        def objective(
            arrays: list[np.ndarray], ct: Any = ct, name: str = name, ref: Any = ref
        ) -> float:
            return sum(
                float(np.sum(ct[r] * _global(name, ref, arrays, comm.size, r)))
                for r in range(comm.size)
            )

        numeric = np.zeros_like(xin[comm.rank])
        eps = 1e-6
        for i in np.ndindex(*numeric.shape):
            up = [a.copy() for a in xin]
            down = [a.copy() for a in xin]
            up[comm.rank][i] += eps
            down[comm.rank][i] -= eps
            numeric[i] = (objective(up) - objective(down)) / (2 * eps)
        ctr = sg.tensor(ct[comm.rank], "float64")

        def loss(t: sg.Tensor, fn: Any = fn, ctr: sg.Tensor = ctr) -> sg.Tensor:
            return (fn(t) * ctr).sum()

        for backend in BACKENDS:
            g = _run(backend, sg.grad(loss), sg.tensor(xin[comm.rank], "float64"))
            err = float(np.abs(g.numpy() - numeric).max())
            assert err < 1e-6, (backend, name, err, g.numpy(), numeric)


def _global(name: str, ref: Any, arrays: list[np.ndarray], size: int, rank: int) -> np.ndarray:
    """The collective's result on ``rank`` computed from every rank's input in NumPy."""
    if name == "scatter":
        total = np.sum(arrays, 0)
        block = total.shape[0] // size
        return total[rank * block : (rank + 1) * block]
    return np.asarray(ref(np.stack(arrays)))


def check_mismatch(comm: D.Communicator) -> None:
    """A shape that differs on one rank: every rank gets RankMismatchError naming it."""
    rows = 3 if comm.rank == comm.size - 1 else 2
    x = sg.tensor(np.ones((rows, 4)))
    for backend in BACKENDS:
        try:
            _run(backend, lambda t: D.all_reduce(t * 2.0, "sum"), x)
        except D.RankMismatchError as error:
            text = str(error)
            assert f"rank {comm.size - 1}" in text, text
            # host collectives name the shapes; compiled C names the element counts
            assert ("(3, 4)" in text and "(2, 4)" in text) or (" 12," in text and " 8," in text)
        else:
            raise AssertionError(f"{backend}: no RankMismatchError for a shape mismatch")
    # the data-parallel trainer checks the batch signature at the first step
    trainer = sg.ScalarTrainer(_mse, _params("float64"), data_parallel=True)
    try:
        trainer.step(np.ones((rows, 2)), np.ones(rows))
    except D.RankMismatchError as error:
        assert "ScalarTrainer.step" in str(error) and f"rank {comm.size - 1}" in str(error)
    else:
        raise AssertionError("trainer: no RankMismatchError for different batch shapes")


# --- training parity ------------------------------------------------------------------------


def _mse(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2 = params
    h = sg.tanh(x @ w1 + b1)
    out = (h @ w2 + b2).reshape(-1)
    return ((out - y) * (out - y)).mean()


def _params(dtype: str) -> list[sg.Tensor]:
    rng = np.random.default_rng(3)
    shapes = [(2, 16), (16,), (16, 1), (1,)]
    return [sg.tensor(rng.normal(size=s) * 0.5, dtype) for s in shapes]


def _run_steps(trainer: sg.ScalarTrainer, batches: Any, steps: int) -> None:
    """``steps`` trainer steps over ``batches``, starting epochs again as needed."""
    done = 0
    while done < steps:
        for bx, by in batches:
            trainer.step(bx, by)
            done += 1
            if done == steps:
                return


def _data(dtype: str, n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(n, 2))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1]
    return x.astype(dtype), y.astype(dtype)


def _train(
    comm: Any, mode: str, backend: str, opt: str, dtype: str, steps: int
) -> list[np.ndarray]:
    optimizer = sg.optim.SGD(lr=0.05, momentum=0.9) if opt == "sgd" else sg.optim.Adam(lr=0.01)
    trainer = sg.ScalarTrainer(
        _mse, _params(dtype), mode=mode, backend=backend, optimizer=optimizer,
        clip_norm=0.3, data_parallel=comm if comm is not None else False,
    )  # fmt: skip
    x, y = _data(dtype)
    batches = sg.data.Batches(x, y, batch_size=24, seed=5, shard=comm)
    _run_steps(trainer, batches, steps)
    return [np.asarray(p.numpy()) for p in trainer.get_params()]


def check_training(comm: D.Communicator, steps: int = 50) -> None:
    """N processes on shards == one process on the global batch; params identical on all."""
    cases = [
        ("compiled", "c", opt, dtype) for opt in ("sgd", "adam") for dtype in ("float64", "float32")
    ] + [("compiled", "numpy", opt, "float64") for opt in ("sgd", "adam")]
    cases += [("eager", "c", opt, "float64") for opt in ("sgd", "adam")]
    for mode, backend, opt, dtype in cases:
        mine = _train(comm, mode, backend, opt, dtype, steps)
        everyone = comm.gather_objects(mine)
        for r, theirs in enumerate(everyone):
            for a, b in zip(mine, theirs, strict=True):
                assert np.array_equal(a, b), f"params differ between rank {comm.rank} and {r}"
        if comm.rank == 0:
            single = _train(None, mode, backend, opt, dtype, steps)
            tol = 1e-10 if dtype == "float64" else 1e-5
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
            assert err <= tol, (mode, backend, opt, dtype, err)
            print(f"parity {mode}/{backend} {opt} {dtype}: max |diff| {err:.2e}")


def check_buckets(comm: D.Communicator, steps: int = 20) -> None:
    """Gradient buckets of every shape (each gradient alone; several, with a gradient
    larger than a bucket; one bucket), all-reduced nonblocking inside the C step: ranks
    bit-equal, equal to one process on the global batch, and equal to the last bits to the
    same buckets exchanged blocking (the overlap_collectives stage off)."""
    from shapegrad.compiler import pipeline
    from shapegrad.train import step

    saved, stages = step.BUCKET_BYTES, list(pipeline.LOOP_PIPELINE)
    single = _train(None, "compiled", "c", "sgd", "float64", steps)
    try:
        for bucket_bytes in (1, 200, 1 << 40):
            step.BUCKET_BYTES = bucket_bytes
            mine = _train(comm, "compiled", "c", "sgd", "float64", steps)
            for r, theirs in enumerate(comm.gather_objects(mine)):
                for a, b in zip(mine, theirs, strict=True):
                    assert np.array_equal(a, b), f"buckets {bucket_bytes}: rank {comm.rank} vs {r}"
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
            assert err <= 1e-10, (bucket_bytes, err)
            if bucket_bytes == 200:
                pipeline.LOOP_PIPELINE[:] = [s for s in stages if s.name != "overlap_collectives"]
                blocking = _train(comm, "compiled", "c", "sgd", "float64", steps)
                pipeline.LOOP_PIPELINE[:] = stages
                # The same sums, but the two kernel orders may fuse the mean's division
                # into different kernels, and under -fassociative-math a fused expression
                # may round differently (measured: 3.3e-16 after 20 steps): the exchanges
                # themselves agree, so the programs agree to the last bits only.
                err = max(float(np.abs(a - b).max()) for a, b in zip(mine, blocking, strict=True))
                assert err <= 1e-13, f"nonblocking != blocking exchanges: {err:.2e}"
            if comm.rank == 0:
                print(f"buckets of {bucket_bytes} B: max |diff| vs one process {err:.2e}")
    finally:
        step.BUCKET_BYTES = saved
        pipeline.LOOP_PIPELINE[:] = stages


def _bound_shared(comm: D.Communicator) -> bool:
    """Whether compiled programs over ``comm`` got shared segments (the shm all-reduce)."""
    return any(v is not None for v in getattr(comm, "_segments", {}).values())


def check_shared_allreduce(comm: D.Communicator, steps: int = 20) -> None:
    """The shared-memory all-reduce of the generated C (``backends/c/collectives.py``)
    against MPI's, on one program with exchanges of several sizes, dtypes and ops (one
    region reused with different chunk bounds) and on bucketed data-parallel training:
    ranks bit-equal, equal to the NumPy sum, to MPI's all-reduce and to one process.
    Under ``SHAPEGRAD_FAKE_NODES`` the ranks look like several nodes: MPI is used."""
    from mpi4py import MPI

    from shapegrad.train import step

    assert isinstance(comm, D.MPICommunicator) and comm.allreduce == "shm"
    over_mpi = D.MPICommunicator(MPI.COMM_WORLD.Dup(), key="world-mpi", allreduce="mpi")
    rng = np.random.default_rng(7 + comm.rank)
    sizes = (1, 17, 1000, 100_003, 31)
    cases = [(dtype, op) for dtype in ("float32", "float64", "int32") for op in ("sum", "max")]
    xs = [
        (rng.integers(-50, 50, n) if dtype == "int32" else rng.standard_normal(n)).astype(dtype)
        for dtype, _ in cases
        for n in sizes
    ]
    ops = [op for _, op in cases for _ in sizes]

    def reduce_all(group: D.Communicator) -> Any:
        return lambda arrays: [
            D.all_reduce(x, op, group) for x, op in zip(arrays, ops, strict=True)
        ]

    shared = [np.asarray(v) for v in sg.compile(reduce_all(comm), backend="c")(xs)]
    expect_shared = not os.environ.get("SHAPEGRAD_FAKE_NODES")
    assert _bound_shared(comm) == expect_shared, (comm.rank, comm._segments)
    assert not _bound_shared(over_mpi)
    again = [np.asarray(v) for v in sg.compile(reduce_all(comm), backend="c")(xs)]  # rebound
    mpi = [np.asarray(v) for v in sg.compile(reduce_all(over_mpi), backend="c")(xs)]
    everyone = comm.gather_objects(xs)
    for r, theirs in enumerate(comm.gather_objects(shared)):
        for a, b in zip(shared, theirs, strict=True):
            assert np.array_equal(a, b), f"shm all-reduce differs between rank {comm.rank} and {r}"
    for n, (a, b, c, op) in enumerate(zip(shared, again, mpi, ops, strict=True)):
        rows = [xs_r[n] for xs_r in everyone]
        want = rows[0]
        for row in rows[1:]:  # in rank order, rounding in the dtype at each step
            want = np.maximum(want, row) if op == "max" else want + row
        assert np.array_equal(a, want), (n, a.dtype, op)  # the shm order, to the last bit
        assert np.array_equal(a, b), n
        if op == "max" or a.dtype == np.int32 or comm.size == 2:  # a + b == b + a
            assert np.array_equal(a, c), (n, a.dtype, op, float(np.abs(a - c).max()))
        else:  # MPI may add three ranks in another order
            tol = 1e-5 if a.dtype == np.float32 else 1e-12
            assert np.allclose(a, c, rtol=tol, atol=tol), (n, a.dtype, op)
    saved = step.BUCKET_BYTES
    try:  # several nonblocking buckets (overlapped) and one blocking exchange
        for bucket_bytes in (200, 1 << 40):
            step.BUCKET_BYTES = bucket_bytes
            mine = _train(comm, "compiled", "c", "sgd", "float64", steps)
            theirs_mpi = _train(over_mpi, "compiled", "c", "sgd", "float64", steps)
            for r, theirs in enumerate(comm.gather_objects(mine)):
                for a, b in zip(mine, theirs, strict=True):
                    assert np.array_equal(a, b), f"buckets {bucket_bytes}: rank {comm.rank} vs {r}"
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, theirs_mpi, strict=True))
            assert err <= (0.0 if comm.size == 2 else 1e-13), (bucket_bytes, err)
    finally:
        step.BUCKET_BYTES = saved
    single = _train(None, "compiled", "c", "sgd", "float64", steps)
    err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
    assert err <= 1e-10, err
    # ranks disagreeing on the transport are refused at compile time, not left to hang
    mixed = D.MPICommunicator(
        MPI.COMM_WORLD.Dup(), key="mixed", allreduce="shm" if comm.rank == 0 else "mpi"
    )
    try:
        sg.compile(reduce_all(mixed), backend="c")(xs)
    except D.RankMismatchError as exc:
        assert "the all-reduce transport (SHAPEGRAD_ALLREDUCE)" in str(exc), str(exc)
        assert "rank 0: 'shm'" in str(exc), str(exc)
    else:
        raise AssertionError("a shm rank and an MPI rank compiled the same all-reduce")
    if comm.rank == 0:
        print(f"shm all-reduce (bound: {expect_shared}): max |diff| vs one process {err:.2e}")


def _train_reader(
    comm: Any, opt: str, dtype: str, steps: int, reader: bool = True
) -> tuple[list[np.ndarray], int]:
    """Data-parallel training of ``_mse`` on odd sizes (26, 13, 13 and 1 parameters), with
    ``opt``; (params, how many exchanges the compiled step reduced at their readers)."""
    from shapegrad.backends.c import shmplan

    optimizer: sg.optim.Optimizer = {
        "sgd": sg.optim.SGD(lr=0.05, momentum=0.9),
        "adam": sg.optim.Adam(lr=0.01, weight_decay=0.01),  # g + wd * x: a sum read in a sum
        "adamw": sg.optim.AdamW(lr=0.01, weight_decay=0.01),
    }[opt]
    rng = np.random.default_rng(5)
    params = [sg.tensor(rng.normal(size=s) * 0.5, dtype) for s in [(2, 13), (13,), (13, 1), (1,)]]
    trainer = sg.ScalarTrainer(
        _mse, params, mode="compiled", backend="c", optimizer=optimizer,
        data_parallel=comm if comm is not None else False,
    )  # fmt: skip
    x, y = _data(dtype)
    batches = sg.data.Batches(x, y, batch_size=24, seed=5, shard=comm)
    counted: list[int] = []
    original = shmplan.reader_sums

    def spy(program: Any, nrequests: int) -> list[shmplan.ReaderSum]:
        found = original(program, nrequests)
        counted.append(len(found))
        return found

    saved = os.environ.get("SHAPEGRAD_SHM_READER")
    os.environ["SHAPEGRAD_SHM_READER"] = "1" if reader else "0"
    shmplan.reader_sums = spy  # type: ignore[assignment]
    try:
        _run_steps(trainer, batches, steps)
    finally:
        shmplan.reader_sums = original  # type: ignore[assignment]
        if saved is None:
            del os.environ["SHAPEGRAD_SHM_READER"]
        else:
            os.environ["SHAPEGRAD_SHM_READER"] = saved
    return [np.asarray(p.numpy()) for p in trainer.get_params()], max(counted, default=0)


def check_reader_sums(comm: D.Communicator, steps: int = 12) -> None:
    """Gradients summed where the optimizer's update loads them (``shmplan.ReaderSum``): SGD
    with momentum, Adam with L2 weight decay, AdamW; float32 and float64; odd sizes; each
    gradient alone, several buckets, one bucket. Ranks bit-equal; equal to the chunked
    shared-memory path (SHAPEGRAD_SHM_READER=0) to the last bit; equal to MPI's
    all-reduce (exactly with 2 ranks) and to one process on the global batch. Under
    SHAPEGRAD_FAKE_NODES no segment is bound: MPI's result plus -0.0, the same bits.
    Ranks disagreeing on SHAPEGRAD_SHM_READER are refused when they compile."""
    from mpi4py import MPI

    from shapegrad.train import step

    assert isinstance(comm, D.MPICommunicator) and comm.allreduce == "shm"
    over_mpi = D.MPICommunicator(MPI.COMM_WORLD.Dup(), key="world-mpi", allreduce="mpi")
    cases = [("sgd", "float64", b) for b in (1, 60, 1 << 40)]
    cases += [(opt, dtype, 1 << 40) for opt in ("sgd", "adam", "adamw") for dtype in ("float32",)]
    cases += [(opt, "float64", 60) for opt in ("adam", "adamw")]
    saved = step.BUCKET_BYTES
    try:
        for opt, dtype, bucket_bytes in cases:
            step.BUCKET_BYTES = bucket_bytes
            mine, fused = _train_reader(comm, opt, dtype, steps)
            chunked, none = _train_reader(comm, opt, dtype, steps, reader=False)
            via_mpi, _ = _train_reader(over_mpi, opt, dtype, steps)
            assert fused >= 1 and none == 0, (fused, none)
            for r, theirs in enumerate(comm.gather_objects(mine)):
                for a, b in zip(mine, theirs, strict=True):
                    assert np.array_equal(a, b), f"{opt} {dtype}: rank {comm.rank} vs {r}"
            case = (opt, dtype, bucket_bytes)
            for a, b in zip(mine, chunked, strict=True):
                assert np.array_equal(a, b), (case, float(np.abs(a - b).max()))
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, via_mpi, strict=True))
            tol = 1e-13 if dtype == "float64" else 1e-6  # MPI may add 3 ranks in another order
            assert err <= (0.0 if comm.size == 2 else tol), (case, err)
            if comm.rank == 0:
                single, _ = _train_reader(None, opt, dtype, steps)
                err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
                assert err <= (1e-10 if dtype == "float64" else 1e-5), (case, err)
                print(f"reader sums {case}: {fused} exchanges, max |diff| vs one process {err:.2e}")
    finally:
        step.BUCKET_BYTES = saved
    # ranks disagreeing on SHAPEGRAD_SHM_READER are refused at compile time, not left to hang
    saved_env = os.environ.get("SHAPEGRAD_SHM_READER")
    os.environ["SHAPEGRAD_SHM_READER"] = "1" if comm.rank == 0 else "0"
    try:
        sg.compile(lambda a: D.all_reduce(a + 1.0, "sum", comm) * 2.0, backend="c")(
            np.ones(100, np.float32)
        )
    except D.RankMismatchError as exc:
        assert "reduced at their readers (SHAPEGRAD_SHM_READER)" in str(exc), str(exc)
    else:
        raise AssertionError("ranks with and without reader sums compiled the same all-reduce")
    finally:
        if saved_env is None:
            del os.environ["SHAPEGRAD_SHM_READER"]
        else:
            os.environ["SHAPEGRAD_SHM_READER"] = saved_env


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the block (compiles inside it see it)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def _live_exe(trainer: sg.ScalarTrainer) -> Any:
    """The executable of ``trainer``'s bound step (the C backend's bound strategy)."""
    live = getattr(trainer.strategy, "live", None)
    assert live is not None, "the trainer has no bound step"
    return live.bound.exe


def _train_sharded(comm: Any, opt: str, dtype: str, shard: bool) -> tuple[list[Any], bool]:
    """A data-parallel run that exercises every way state changes hands: steps, K steps in
    one call, parameters replaced mid-run, a checkpoint-style read, more steps. Returns
    (every snapshot taken, whether the state was kept once per node at the end)."""
    optimizer: sg.optim.Optimizer = {
        "sgd": sg.optim.SGD(lr=0.05, momentum=0.9),
        "adam": sg.optim.Adam(lr=0.01, weight_decay=0.01),
        "adamw": sg.optim.AdamW(lr=0.01, weight_decay=0.01),
    }[opt]
    rng = np.random.default_rng(5)
    params = [sg.tensor(rng.normal(size=s) * 0.5, dtype) for s in [(2, 13), (13,), (13, 1), (1,)]]
    x, y = _data(dtype)
    with _env("SHAPEGRAD_SHM_SHARD", "1" if shard else "0"):
        trainer = sg.ScalarTrainer(
            _mse, params, mode="compiled", backend="c", optimizer=optimizer, data_parallel=comm
        )
        batches = sg.data.Batches(x, y, batch_size=24, seed=5, shard=comm)
        snapshots: list[Any] = []
        _run_steps(trainer, batches, 7)
        snapshots.append([p.numpy() for p in trainer.get_params()])
        bx, by = next(iter(batches))
        losses = trainer.step_many(np.stack([bx] * 3), np.stack([by] * 3))
        snapshots.append(np.asarray(losses))
        placed = nodestate.placed(_live_exe(trainer))
        trainer.set_params([p * 0.5 for p in trainer.get_params()])
        _run_steps(trainer, batches, 5)
        snapshots.append([p.numpy() for p in trainer.get_params()])
        snapshots.append([np.asarray(v) for v in sg.tree.flatten(trainer.optimizer_state())[0]])
    return snapshots, placed


def _flat(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, list | tuple):
        return [a for t in tree for a in _flat(t)]
    return [np.asarray(tree)]


def _unbound_after_bound(comm: Any, shard: bool) -> list[np.ndarray]:
    """Bound steps of a donated step, then an unbound call of the same executable (every
    rank copies its own state in: the state leaves the node's block), then bound again."""
    plan = types.SimpleNamespace(comm=comm)

    def step(params: Any, x: sg.Tensor, y: sg.Tensor) -> Any:
        loss, grads = sg.value_and_grad(_mse)(params, x, y)
        loss, grads = average_over_processes(plan, loss, grads)  # type: ignore[arg-type]
        return [w - 0.05 * g for w, g in zip(params, grads, strict=True)], loss

    params = [p.numpy() for p in _params("float32")]
    x, y = _data("float32", 24)
    x, y = (np.ascontiguousarray(a[comm.rank :: comm.size]) for a in (x, y))
    with _env("SHAPEGRAD_SHM_SHARD", "1" if shard else "0"):
        exe = sg.compile(step, backend="c", donate_argnums=0).lower(params, x, y).executable
        bound = exe.bind(params)
        for _ in range(3):
            bound.step(x, y)
        assert nodestate.placed(exe) == (shard and _bound_shared(comm))
        outs = exe([*bound.read_state(), x, y])
        assert not nodestate.placed(exe)
        bound.step(x, y)
        return [*_flat(outs), *bound.read_state()]


def _close_to_the_ulp(a: np.ndarray, b: np.ndarray, case: Any) -> None:
    """Equal but for the last bits: a sharded update loop runs bounds known only at run
    time, and the C flags let the compiler contract its arithmetic (a fused multiply-add)
    differently than in the loop of constant length: 1 ulp apart in float32 after a step
    of the plain SGD update. (Ranks are compared bit for bit.)"""
    eps = float(np.finfo(a.dtype).eps) if a.dtype.kind == "f" else 0.0
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= 16 * eps * max(1.0, float(np.abs(b).max()) if b.size else 1.0), (case, err)


def check_sharded_state(comm: D.Communicator) -> None:
    """State kept once per node, updated in shards (``backends/c/shmshard.py``): SGD with
    momentum, Adam with L2 decay, AdamW; float32 and float64; steps, K steps in one call,
    parameters replaced mid-run, more steps: ranks bit-equal and equal to the same run with
    a copy per rank (SHAPEGRAD_SHM_SHARD=0) but for the last bits, the state placed in the
    node's block exactly when segments are bound (not under SHAPEGRAD_FAKE_NODES). An
    unbound call of a bound executable takes the state back to a copy per rank, equal
    too. Ranks disagreeing on SHAPEGRAD_SHM_SHARD are refused when they compile."""
    shared = None
    for opt, dtype in [("sgd", "float64"), ("adam", "float32"), ("adamw", "float64")]:
        mine, placed = _train_sharded(comm, opt, dtype, shard=True)
        copies, not_placed = _train_sharded(comm, opt, dtype, shard=False)
        shared = _bound_shared(comm)
        assert placed == shared and not not_placed, (placed, shared, not_placed)
        for a, b in zip(_flat(mine), _flat(copies), strict=True):
            _close_to_the_ulp(a, b, (opt, dtype))
        for r, theirs in enumerate(comm.gather_objects(_flat(mine))):
            for a, b in zip(_flat(mine), theirs, strict=True):
                assert np.array_equal(a, b), f"{opt} {dtype}: rank {comm.rank} vs {r}"
    unbound = _unbound_after_bound(comm, shard=True)
    for a, b in zip(unbound, _unbound_after_bound(comm, shard=False), strict=True):
        _close_to_the_ulp(a, b, "unbound")
    for r, theirs in enumerate(comm.gather_objects(unbound)):
        for a, b in zip(unbound, theirs, strict=True):
            assert np.array_equal(a, b), f"unbound: rank {comm.rank} vs {r}"
    with _env("SHAPEGRAD_SHM_SHARD", "1" if comm.rank == 0 else "0"):
        try:
            _unbound_after_bound(comm, shard=comm.rank == 0)
        except D.RankMismatchError as exc:
            assert "kept once per node (SHAPEGRAD_SHM_SHARD)" in str(exc), str(exc)
        else:
            raise AssertionError("ranks with and without sharded state compiled the same step")
    if comm.rank == 0:
        print(f"sharded state: bound to shared memory {shared}, equal to a copy per rank")


def shared_timeout(comm: D.Communicator, reader: bool = False) -> None:
    """Rank 1 compiles the same all-reduce but never runs it: rank 0's shared-memory
    wait gives up after SHAPEGRAD_COLLECTIVE_TIMEOUT (+ margin) and the job ends. With
    ``reader``, the sum is read by a multiplication: it reduces at that reader."""
    if reader:
        f = sg.compile(lambda a: D.all_reduce(a + 1.0, "sum", comm) * 2.0, backend="c")
    else:
        f = sg.compile(lambda a: D.all_reduce(a, "sum", comm), backend="c")
    x = np.ones(1000, np.float32)
    f(x)  # once together
    comm.barrier()
    if comm.rank == 1:
        time.sleep(120)  # stuck, neither dead nor raising
    f(x)


def check_training_cuda(comm: D.Communicator, steps: int = 30) -> None:
    """Data parallel on GPUs (every rank may share one): the CUDA step averages gradients
    over MPI through host copies; N ranks match one process on the global batch and hold
    identical parameters."""
    for opt in ("sgd", "adam"):
        mine = _train(comm, "compiled", "cuda", opt, "float32", steps)
        everyone = comm.gather_objects(mine)
        for r, theirs in enumerate(everyone):
            for a, b in zip(mine, theirs, strict=True):
                assert np.array_equal(a, b), f"cuda params differ between rank {comm.rank} and {r}"
        if comm.rank == 0:
            single = _train(None, "compiled", "cuda", opt, "float32", steps)
            cpu = _train(None, "compiled", "c", opt, "float32", steps)
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
            err_cpu = max(float(np.abs(a - b).max()) for a, b in zip(mine, cpu, strict=True))
            # float32 sums in another order (half batches on each rank, cuBLAS vs OpenBLAS)
            assert err <= 1e-4 and err_cpu <= 1e-4, (opt, err, err_cpu)
            print(f"parity compiled/cuda {opt} float32: max |diff| {err:.2e} (vs C {err_cpu:.2e})")


def check_features(comm: D.Communicator) -> None:
    """float16 mixed precision with a schedule and K steps per native call (step_many), and
    float32 with gradient accumulation (2 micro-batches of each process's shard), work
    unchanged: N processes match one process on the global batch.

    (float16 and accumulation are not combined here: a smaller micro-batch scales each
    example's cotangent up, so the dynamic loss scale may skip a different number of
    steps on N processes than on one; that is the loss-scale rule, not data parallelism.)
    """

    def train(shard: Any, dtype: str | None, accumulate: int) -> list[np.ndarray]:
        trainer = sg.ScalarTrainer(
            _mse, _params("float32"), mode="compiled", backend="c",
            optimizer=sg.optim.Adam(lr=0.01), dtype=dtype, clip_norm=1.0,
            schedule=sg.schedules.cosine_with_warmup(0.01, 30, warmup_steps=5),
            data_parallel=shard if shard is not None else False, accumulate=accumulate,
        )  # fmt: skip
        x, y = _data("float32")
        batches = list(sg.data.Batches(x, y, batch_size=24, seed=5, shard=shard))
        xs = np.stack([b[0] for b in batches] * 3)
        ys = np.stack([b[1] for b in batches] * 3)
        losses = trainer.step_many(xs, ys)
        assert np.all(np.isfinite(losses))
        assert dtype is None or trainer.loss_scale > 1
        return [np.asarray(p.numpy()) for p in trainer.get_params()]

    for dtype, accumulate, tol in (("float16", 1, 1e-3), (None, 2, 1e-5)):
        mine = train(comm, dtype, accumulate)
        for theirs in comm.gather_objects(mine):
            assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
        if comm.rank == 0:
            single = train(None, dtype, accumulate)
            err = max(float(np.abs(a - b).max()) for a, b in zip(mine, single, strict=True))
            what = "float16 + schedule" if dtype else "float32 + accumulate=2"
            print(f"parity {what} + step_many: max |diff| {err:.2e}")
            assert err < tol, (dtype, accumulate, err)


def check_keys_and_state(comm: D.Communicator) -> None:
    """A loss with dropout (a per-step ``key``) that also returns updated non-trainable state
    (a running mean): parameters and state stay identical on every process, the state is
    the mean over the shards, and each shard draws its own dropout mask."""

    def loss(params: Any, x: sg.Tensor, y: sg.Tensor, *, key: sg.Tensor) -> Any:
        w, b, running = params
        keep = sg.random.bernoulli(key, 0.5, x.shape).astype(x.dtype)
        out = ((x * keep * 2.0) @ w).reshape(-1) + b
        new_running = running * 0.9 + x.mean(axis=0) * 0.1
        return ((out - y) * (out - y)).mean(), [w, b, new_running]

    params = [
        sg.tensor(np.full((2, 1), 0.1)),
        sg.tensor(np.zeros(1)),
        sg.tensor(np.zeros(2)),
    ]
    trainer = sg.ScalarTrainer(
        loss, params, mode="compiled", backend="c", requires_grad=[True, True, False],
        optimizer=sg.optim.SGD(lr=0.05), data_parallel=True, seed=1,
    )  # fmt: skip
    x, y = _data("float64")
    rows = []
    for bx, by in sg.data.Batches(x, y, batch_size=24, seed=5, shuffle=False, shard=comm):
        trainer.step(bx, by)
        rows.append(bx)
    mine = [np.asarray(t.numpy()) for t in trainer.get_params()]
    for theirs in comm.gather_objects(mine):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    expected = np.zeros(2)  # the running mean of the *global* batches
    for k in range(len(rows)):
        expected = expected * 0.9 + x[k * 24 : (k + 1) * 24].mean(axis=0) * 0.1
    assert np.allclose(mine[2], expected, atol=1e-12), (mine[2], expected)
    # different dropout masks per rank: the per-rank gradients before averaging differ
    # (checked through the keys: fold_in(key, rank) differs between ranks)
    base = sg.random.key(1)
    folded = comm.gather_objects(sg.random.fold_in(base, comm.rank).numpy().tolist())
    assert len({tuple(f) for f in folded}) == comm.size


def check_checkpoint(comm: D.Communicator, out: Path) -> None:
    """Rank 0 writes a checkpoint of a data-parallel run (the test resumes it in one process)."""
    trainer = sg.ScalarTrainer(
        _mse, _params("float64"), mode="compiled", backend="c",
        optimizer=sg.optim.Adam(lr=0.01), data_parallel=True,
    )  # fmt: skip
    x, y = _data("float64")
    batches = sg.data.Batches(x, y, batch_size=24, seed=5, shard=comm)
    for bx, by in batches:
        trainer.step(bx, by)
    path = trainer.save_checkpoint(out / "dp.ckpt")
    assert path.exists()  # on every rank, after the barrier
    if comm.rank == 0:
        np.savez(out / "dp_params.npz", *[p.numpy() for p in trainer.get_params()])
        state = trainer.optimizer_state()
        np.savez(out / "dp_adam_m.npz", *[m.numpy() for m in state["m"]])


def fault(comm: D.Communicator, out: Path, how: str) -> None:
    """Train, checkpoint at step 5, then rank 1 fails at step 10 (raise or SIGKILL)."""
    trainer = sg.ScalarTrainer(
        _mse, _params("float64"), mode="compiled", backend="c", data_parallel=True
    )
    x, y = _data("float64")
    step = 0
    for _ in range(100):
        for bx, by in sg.data.Batches(x, y, batch_size=24, seed=5, shard=comm):
            trainer.step(bx, by)
            step += 1
            if step == 5:
                trainer.save_checkpoint(out / "fault.ckpt")
            if step == 10 and comm.rank == 1:
                if how == "hang":  # neither dies nor raises: rank 0's watchdog ends the job
                    time.sleep(600)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("planted failure on rank 1 at step 10")


def main() -> None:
    task, out = sys.argv[1], Path(sys.argv[2])
    comm = D.world()
    assert comm.size == int(os.environ.get("PMI_SIZE", comm.size))
    if task == "all":
        check_collectives(comm)
        check_metrics(comm)
        check_gradients(comm)
        check_mismatch(comm)
        check_training(comm)
        check_buckets(comm)
        check_features(comm)
        check_keys_and_state(comm)
        check_checkpoint(comm, out)
    elif task == "cuda":
        check_training_cuda(comm)
    elif task == "shm":
        check_shared_allreduce(comm)
    elif task == "shm-reader":
        check_reader_sums(comm)
    elif task == "shm-shard":
        check_sharded_state(comm)
    elif task in ("shm-timeout", "shm-reader-timeout"):
        shared_timeout(comm, reader=task == "shm-reader-timeout")
    elif task in ("raise", "kill", "hang"):
        fault(comm, out, task)
    else:
        raise SystemExit(f"unknown task {task}")
    comm.barrier()
    if comm.rank == 0:
        (out / f"ok-{task}.txt").write_text("ok\n")


if __name__ == "__main__":
    main()
