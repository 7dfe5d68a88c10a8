"""Collectives, data-parallel training, sharded batches, checkpoints and faults.

In-process tests use the one-process communicator or a scripted fake one; the MPI
tests launch ``tests/distributed_worker.py`` under ``mpiexec -n 2`` and ``-n 3``
(skipped, with the reason, where mpi4py or mpiexec is missing: ``pip install -e
'.[mpi]'`` provides both).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import distributed as D
from shapegrad.dtypes import DTypeError
from shapegrad.shapes import ShapeError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"


# --- shape rules and the one-process communicator ----------------------------------------------


class FakeComm(D.LocalCommunicator):
    """A communicator of ``size`` processes for shape rules and mismatch messages only."""

    def __init__(self, size: int, gathered: list[list[Any]] | None = None) -> None:
        self.size = size
        self.key = f"fake{size}"
        self.gathered = list(gathered or [])

    def gather_objects(self, obj: Any) -> list[Any]:
        return self.gathered.pop(0)  # what the other processes would have sent


def test_shape_rules() -> None:
    comm = FakeComm(4)
    x = sg.tensor(np.zeros((8, 3), np.float32))
    from shapegrad.ops.graph import GraphOps  # a trace gives shapes without running MPI
    from shapegrad.ops.protocol import AVal

    g = GraphOps().add_input("x", AVal((8, 3), sg.float32))
    assert D.all_gather(g, comm).shape == (32, 3)
    assert D.reduce_scatter(g, comm).shape == (2, 3)
    assert D.all_reduce(g, "mean", comm).shape == (8, 3)
    assert D.broadcast(g, 3, comm).shape == (8, 3)
    odd = GraphOps().add_input("y", AVal((6, 3), sg.float32))
    with pytest.raises(ShapeError, match="does not split into 4 equal blocks"):
        D.reduce_scatter(odd, comm)
    with pytest.raises(DTypeError, match="'mean' needs a floating-point"):
        D.all_reduce(sg.tensor(np.ones(3, np.int32)), "mean", comm)
    with pytest.raises(DTypeError, match="numeric"):
        D.all_reduce(sg.tensor(np.ones(3, bool)), "sum", comm)
    with pytest.raises(ValueError, match="op must be one of"):
        D.all_reduce(x, "prod", comm)
    with pytest.raises(ValueError, match="root 5 is not a rank"):
        D.broadcast(x, 5, comm)
    with pytest.raises(ShapeError, match="leading axis"):
        D.all_gather(sg.tensor(np.float32(1.0)), comm)


@pytest.mark.parametrize("backend", ["eager", "numpy", "c"])
def test_one_process_collectives_are_identities_with_gradients(backend: str) -> None:
    comm = D.LocalCommunicator()
    x = sg.tensor(np.arange(6.0).reshape(3, 2))

    def f(t: sg.Tensor) -> sg.Tensor:
        y = D.all_reduce(t, "mean", comm) + D.broadcast(t, 0, comm)
        return (D.reduce_scatter(D.all_gather(y, comm), comm) * t).sum()

    g = sg.grad(f)
    run = g if backend == "eager" else sg.compile(g, backend=backend)
    np.testing.assert_allclose(run(x).numpy(), 4 * x.numpy())  # d/dt of 2 t·t


def test_mismatch_message_names_the_ranks() -> None:
    # first the digests, then (only on a mismatch) the descriptions
    comm = FakeComm(3, gathered=[[1, 1, 2], ["(2, 4)", "(2, 4)", "(3, 4)"]])
    with pytest.raises(D.RankMismatchError) as info:
        D.check_same(comm, "the batch", "(2, 4)")
    assert str(info.value) == (
        "the batch differs between processes (they must all be equal):\n"
        "  ranks 0, 1: (2, 4)\n"
        "  rank 2: (3, 4)"
    )
    D.check_same(FakeComm(3, gathered=[[5, 5, 5]]), "the batch", "x")  # agreeing: no error


def test_world_without_a_launcher_is_one_process() -> None:
    if D.launched_size() > 1:
        pytest.skip("running under mpiexec")
    comm = D.world()
    assert (comm.rank, comm.size, D.is_main()) == (0, 1, True)


# --- Batches sharding -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, 3])
def test_batches_shards_are_disjoint_blocks_of_the_global_batches(size: int) -> None:
    x = np.arange(50)
    whole = sg.data.Batches(x, batch_size=12, seed=3)
    shards = [sg.data.Batches(x, batch_size=12, seed=3, shard=(r, size)) for r in range(size)]
    for _epoch in range(3):  # reshuffled every epoch, identically on every rank
        globals_ = [b[0] for b in whole]
        parts = [[b[0] for b in s] for s in shards]
        assert all(len(p) == len(globals_) for p in parts)  # same number of steps everywhere
        for k, batch in enumerate(globals_):
            joined = np.concatenate([p[k] for p in parts])
            np.testing.assert_array_equal(joined, batch)  # disjoint, in rank order
    with pytest.raises(ValueError, match="does not split evenly over 5"):
        sg.data.Batches(x, batch_size=12, shard=(0, 5))


# --- gradient accumulation -------------------------------------------------------------------


def _mse(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w, b = params
    out = (sg.tanh(x @ w) + b).reshape(-1)
    return ((out - y) * (out - y)).mean()


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_accumulate_equals_the_whole_batch(mode: str) -> None:
    rng = np.random.default_rng(0)
    params = [sg.tensor(rng.normal(size=(3, 1))), sg.tensor(rng.normal(size=(1,)))]
    x, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    results = []
    for k in (1, 4):
        t = sg.ScalarTrainer(
            _mse, params, mode=mode, backend="c", optimizer=sg.optim.Adam(lr=0.05),
            clip_norm=0.5, accumulate=k,
        )  # fmt: skip
        losses = [t.step(x, y) for _ in range(20)]
        results.append((losses, [p.numpy() for p in t.get_params()]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-12)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    bad = sg.ScalarTrainer(_mse, params, mode=mode, backend="c", accumulate=5)
    with pytest.raises(ValueError, match=r"accumulate=5\): input 0 has 12 rows"):
        bad.step(x, y)


def test_data_parallel_over_one_process_is_plain_training() -> None:
    rng = np.random.default_rng(1)
    params = [sg.tensor(rng.normal(size=(3, 1))), sg.tensor(rng.normal(size=(1,)))]
    x, y = rng.normal(size=(8, 3)), rng.normal(size=8)
    a = sg.ScalarTrainer(_mse, params, mode="compiled", data_parallel=D.LocalCommunicator())
    b = sg.ScalarTrainer(_mse, params, mode="compiled")
    assert [a.step(x, y) for _ in range(5)] == [b.step(x, y) for _ in range(5)]
    with pytest.raises(TypeError, match="data_parallel must be"):
        sg.ScalarTrainer(_mse, params, data_parallel="yes")  # type: ignore[arg-type]


# --- under mpiexec ----------------------------------------------------------------------------


def _mpiexec() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install -e '.[mpi]')")
    found = shutil.which("mpiexec") or shutil.which(
        "mpiexec", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpi]' installs MPICH's)")
    return found


def launch(
    n: int, task: str, out: Path, timeout: float = 300, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["SHAPEGRAD_NUM_THREADS"] = "1"  # N processes on a small machine: no oversubscription
    cmd = [_mpiexec(), "-n", str(n), sys.executable, str(WORKER), task, str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mpi2")
    run = launch(2, "all", out)
    assert run.returncode == 0 and (out / "ok-all.txt").exists(), run.stdout + run.stderr
    return out


def test_two_ranks_collectives_gradients_mismatch_and_training(two_ranks: Path) -> None:
    """Every collective (values, every dtype; gradients vs finite differences) in eager,
    numpy and C; mismatched shapes named by rank; 50 data-parallel steps == one process on
    the global batch (SGD momentum and Adam, clipping on; float64 1e-10, float32 1e-5)."""
    assert (two_ranks / "ok-all.txt").read_text() == "ok\n"


def test_two_ranks_share_one_gpu_data_parallel(tmp_path: Path) -> None:
    """ScalarTrainer(backend="cuda", data_parallel=True) under mpiexec -n 2 on one GPU:
    gradients averaged over MPI (host staging) inside the step; both ranks end with equal
    parameters, equal to one process on the global batch (SGD momentum and Adam)."""
    from modes import _cuda_unavailable

    reason = _cuda_unavailable()
    if reason is not None:
        pytest.skip(reason)
    run = launch(2, "cuda", tmp_path)
    assert run.returncode == 0 and (tmp_path / "ok-cuda.txt").exists(), run.stdout + run.stderr
    assert run.stdout.count("parity compiled/cuda") == 2, run.stdout


@pytest.mark.slow  # 28 s on 2 cores (3 ranks oversubscribe them); the 2-rank run is default
def test_three_ranks(tmp_path: Path) -> None:
    run = launch(3, "all", tmp_path)
    assert run.returncode == 0 and (tmp_path / "ok-all.txt").exists(), run.stdout + run.stderr
    assert run.stdout.count("parity") == 10


def test_two_rank_checkpoint_resumes_in_one_process(two_ranks: Path) -> None:
    params = np.load(two_ranks / "dp_params.npz")
    moments = np.load(two_ranks / "dp_adam_m.npz")
    rng = np.random.default_rng(99)
    fresh = [sg.tensor(rng.normal(size=p.shape)) for p in params.values()]
    import distributed_worker as worker

    trainer = sg.ScalarTrainer(worker._mse, fresh, optimizer=sg.optim.Adam(lr=0.01))
    ckpt = trainer.load_checkpoint(two_ranks / "dp.ckpt")
    assert ckpt.metadata["user"]["processes"] == 2
    for got, want in zip(trainer.get_params(), params.values(), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(trainer.optimizer_state()["m"], moments.values(), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("how", ["raise", "kill", "hang"])
def test_a_failing_rank_ends_the_job(how: str, tmp_path: Path) -> None:
    """Raising (MPI_Abort from the excepthook), killed (the launcher), stuck (rank 0's
    watchdog, SHAPEGRAD_COLLECTIVE_TIMEOUT): the job ends with a clear error within 60 s,
    and the checkpoint written before the failure loads."""
    start = time.perf_counter()
    run = launch(2, how, tmp_path, timeout=60, SHAPEGRAD_COLLECTIVE_TIMEOUT="5")
    elapsed = time.perf_counter() - start
    assert run.returncode != 0 and elapsed < 60
    text = run.stdout + run.stderr
    if how == "raise":
        assert "[rank 1/2]" in text and "planted failure on rank 1" in text
        assert "aborting all 2 processes" in text
    elif how == "kill":
        assert "signal 9" in text or "Killed" in text, text
    else:
        expected = "[rank 0/2] shapegrad: ScalarTrainer.step waited more than 5 s"
        assert expected in text, (run.returncode, elapsed, text)
    import distributed_worker as worker

    trainer = sg.ScalarTrainer(worker._mse, worker._params("float64"))
    assert trainer.load_checkpoint(tmp_path / "fault.ckpt").step == 5


def _launch_shm(
    n: int, task: str, nodes: str | None, out: Path
) -> subprocess.CompletedProcess[str]:
    """``task`` on ``n`` ranks with the shared-memory all-reduce (the ranks made to look
    like ``nodes`` nodes when given); asserts it succeeded."""
    extra = {"SHAPEGRAD_ALLREDUCE": "shm"}
    if nodes is not None:
        extra["SHAPEGRAD_FAKE_NODES"] = nodes
    run = launch(n, task, out, **extra)
    assert run.returncode == 0 and (out / f"ok-{task}.txt").exists(), run.stdout + run.stderr
    return run


@pytest.mark.parametrize("n, nodes", [(2, None), (3, None), (3, "2")])
def test_shared_memory_all_reduce(n: int, nodes: str | None, tmp_path: Path) -> None:
    """The generated C's shared-memory all-reduce (sum and max of float32/float64/int32,
    sizes 1 to 100003 in one program, overlapped buckets and a blocking exchange): ranks
    bit-equal, equal to the rank-order sum, to MPI's all-reduce (exactly with 2 ranks)
    and to one process. With the ranks made to look like 2 nodes (SHAPEGRAD_FAKE_NODES),
    no segment is bound and the same programs fall back to MPI, with the same results."""
    _launch_shm(n, "shm", nodes, tmp_path)


@pytest.mark.parametrize(
    "n, nodes",
    # 3 ranks on one node: 19 s on 2 cores, slow (3 ranks' shared memory stays in the default
    # suite through test_shared_memory_all_reduce and test_state_kept_once_per_node)
    [(2, None), pytest.param(3, None, marks=pytest.mark.slow), (3, "2")],
)
def test_gradients_summed_at_the_reader(n: int, nodes: str | None, tmp_path: Path) -> None:
    """Gradients summed where the update loads them (``shmplan.ReaderSum``): SGD, Adam, AdamW,
    float32/float64, odd sizes, several buckets; ranks bit-equal, equal to the chunked
    path to the last bit, to MPI's all-reduce and to one process; under
    SHAPEGRAD_FAKE_NODES (no segment) the same programs fall back to MPI."""
    run = _launch_shm(n, "shm-reader", nodes, tmp_path)
    assert run.stdout.count("reader sums (") == 8, run.stdout


@pytest.mark.parametrize("n, nodes", [(2, None), (3, None), (3, "2")])
def test_state_kept_once_per_node(n: int, nodes: str | None, tmp_path: Path) -> None:
    """Parameters and optimizer moments kept once per node, each rank updating its chunk
    (``backends/c/shmshard.py``): SGD momentum, Adam, AdamW, float32/float64, K steps in
    one call, parameters replaced mid-run; ranks bit-equal and equal to a copy per rank;
    an unbound call takes the state back to a copy per rank; under SHAPEGRAD_FAKE_NODES
    nothing is shared and the same programs update every element on every rank."""
    run = _launch_shm(n, "shm-shard", nodes, tmp_path)
    assert f"bound to shared memory {nodes is None}" in run.stdout, run.stdout


@pytest.mark.parametrize("task", ["shm-timeout", "shm-reader-timeout"])
def test_shared_memory_wait_times_out_with_a_clear_error(task: str, tmp_path: Path) -> None:
    """A rank that never arrives: the other's shared-memory wait (in a compiled call that
    no watchdog watches) gives up after SHAPEGRAD_COLLECTIVE_TIMEOUT plus the margin,
    names the missing rank, and the job ends instead of hanging (the chunked exchange,
    and one reduced at its reader)."""
    start = time.perf_counter()
    run = launch(
        2, task, tmp_path, timeout=90, SHAPEGRAD_ALLREDUCE="shm",
        SHAPEGRAD_COLLECTIVE_TIMEOUT="2",
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    text = run.stdout + run.stderr
    assert run.returncode != 0 and elapsed < 60, (run.returncode, elapsed, text)
    assert "[rank 0/2] shapegrad: a shared-memory all-reduce (1000 elements) waited" in text, text
    assert "for rank(s) 1 to arrive" in text, text
    assert "shared-memory wait timed out (SHAPEGRAD_COLLECTIVE_TIMEOUT" in text, text
    assert "aborting all 2 processes" in text, text


def test_cli_data_parallel_digits_matches_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    """``mpiexec -n 2 shapegrad demo digits --data-parallel`` reaches the accuracy of one
    process with the same global batch (only rank 0 prints)."""
    pytest.importorskip("sklearn", reason="the digits demo needs scikit-learn")
    flags = ["demo", "digits", "--epochs", "8", "--no-progress", "--no-color"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["SHAPEGRAD_NUM_THREADS"] = "1"
    cmd = [_mpiexec(), "-n", "2", sys.executable, "-m", "shapegrad.cli", *flags, "--data-parallel"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    from shapegrad.cli import main

    assert main(flags) == 0
    single = capsys.readouterr().out

    def accuracy(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("test accuracy")]

    assert len(accuracy(run.stdout)) == 1  # rank 0 alone reports
    assert accuracy(run.stdout) == accuracy(single)
