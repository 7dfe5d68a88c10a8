"""Data-parallel step time: shapegrad on MPI vs PyTorch DDP (gloo), on this machine.

Workload: the MLP 784-512-512-10, softmax cross-entropy, plain SGD, float32, global
batch 256. Configurations (both use the machine's 2 cores):

* 1 rank x 2 threads: one process, the whole batch, ``SHAPEGRAD_NUM_THREADS=2``;
* 2 ranks x 1 thread: ``mpiexec -n 2``, 128 rows per rank, gradients averaged by an
  all-reduce inside the compiled step (one native call per step).

For each we report the median step time; for 2 ranks also the all-reduce alone (the
gradients' all-reduce compiled on its own, timed on both ranks at once) and the step
of the same program without the all-reduce (both ranks busy, as in the real step), so
the all-reduce share is visible. PyTorch runs the same model with
``DistributedDataParallel`` over gloo (``torch.distributed`` on CPU), launched by the
same ``mpiexec``, when torch is importable.

Run: ``python benchmarks/data_parallel.py [--steps 40]`` (needs ``pip install -e '.[mpi]'``).

The plan for more machines: the alpha-beta cost model
------------------------------------------------------
A ring all-reduce of S bytes over N processes sends 2(N-1) messages of S/N bytes in
sequence per process (reduce-scatter, then all-gather):

    T_ring(N) = 2 (N-1) alpha + 2 (N-1)/N * S / beta        (+ the local additions)

with alpha the per-message latency and beta the link bandwidth. The gradients of this
MLP are 669,706 float32 values, S = 2.68 MB per step (the issue's "1.1 MB" undercounts
them). On a 100 Gb/s network (beta = 12.5 GB/s) with alpha = 5 us (TCP-like; ~1-2 us
with RDMA), S / beta = 0.214 ms and:

    N      latency 2(N-1)alpha   bandwidth 2(N-1)/N S/beta   T_ring
    8          0.07 ms              0.375 ms                  0.45 ms
    64         0.63 ms              0.422 ms                  1.05 ms
    512        5.11 ms              0.428 ms                  5.54 ms

The bandwidth term saturates at 2 S / beta = 0.43 ms; the latency term grows linearly
and dominates from N ~ 50. Past that, a recursive halving/doubling (Rabenseifner)
all-reduce, T = 2 log2(N) alpha + 2 (N-1)/N S / beta, costs 0.09 + 0.43 = 0.52 ms at
N = 512 (MPICH and Open MPI switch algorithms by message size and N themselves; we
call MPI_Allreduce, so we inherit that). With weak scaling (256 rows per machine, a
~3-5 ms step on one 2-core box) the all-reduce is ~10% of the step, and overlapping it
with the backward pass (all-reducing layer by layer as gradients appear, which our
single compiled step makes possible by scheduling the collective right after each
gradient's last write) would hide most of it. With strong scaling (a fixed global
batch 256 over 512 machines = 0.5 row each) compute vanishes and the 0.5 ms
all-reduce sets the step time: grow the batch with N, or shard the model instead.
The script prints these predictions from the same formula (``alpha_beta``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
GLOBAL_BATCH = 256


def alpha_beta(
    n: int, nbytes: float, alpha: float = 5e-6, beta: float = 12.5e9
) -> dict[str, float]:
    """Predicted seconds of a ring and of a halving/doubling all-reduce of ``nbytes``."""
    bandwidth = 2 * (n - 1) / n * nbytes / beta
    return {
        "latency_ring": 2 * (n - 1) * alpha,
        "bandwidth": bandwidth,
        "ring": 2 * (n - 1) * alpha + bandwidth,
        "halving_doubling": 2 * np.log2(n) * alpha + bandwidth,
    }


def _data(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((GLOBAL_BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, GLOBAL_BATCH).astype(np.int32)
    per = GLOBAL_BATCH // size
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def _median_step(step: Any, steps: int, barrier: Any = None) -> float:
    for _ in range(5):
        step()
    times = []
    for _ in range(steps):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_shapegrad(steps: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import shapegrad as sg
    from shapegrad import distributed as D
    from shapegrad import functional as F

    comm = D.world()

    def loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        h = x
        for i in range(0, len(params) - 2, 2):
            h = sg.relu(h @ params[i] + params[i + 1])
        return F.cross_entropy(h @ params[-2] + params[-1], y)

    rng = np.random.default_rng(1)
    params = [sg.tensor(rng.normal(size=s).astype(np.float32) * 0.05) for s in SHAPES]
    x, y = _data(comm.rank, comm.size)
    barrier = comm.barrier if comm.size > 1 else None
    result: dict[str, Any] = {
        "ranks": comm.size,
        "threads": os.environ.get("SHAPEGRAD_NUM_THREADS"),
    }
    dp = sg.ScalarTrainer(loss, params, mode="compiled", backend="c", data_parallel=comm.size > 1)
    result["step_ms"] = 1e3 * _median_step(lambda: dp.step(x, y), steps, barrier)
    if comm.size > 1:
        alone = sg.ScalarTrainer(loss, params, mode="compiled", backend="c")
        result["step_without_allreduce_ms"] = 1e3 * _median_step(
            lambda: alone.step(x, y), steps, barrier
        )
        grads = [np.ones(s, np.float32) for s in SHAPES]
        reduce = sg.compile(lambda gs: [D.all_reduce(g, "mean") for g in gs], backend="c")
        result["allreduce_ms"] = 1e3 * _median_step(lambda: reduce(grads), steps, barrier)
    return result


def run_torch(steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    size = int(os.environ.get("PMI_SIZE", "1"))
    rank = int(os.environ.get("PMI_RANK", "0"))
    torch.set_num_threads(int(os.environ.get("SHAPEGRAD_NUM_THREADS", "1")))
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
    )  # fmt: skip
    barrier = None
    if size > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("gloo", init_method="env://")
        model = torch.nn.parallel.DistributedDataParallel(model)
        barrier = dist.barrier
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xa, ya = _data(rank, size)
    x, y = torch.from_numpy(xa), torch.from_numpy(ya).long()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    result: dict[str, Any] = {"ranks": size, "step_ms": 1e3 * _median_step(step, steps, barrier)}
    if size > 1:
        grads = [torch.ones(s) for s in SHAPES]

        def reduce() -> None:
            for g in grads:
                dist.all_reduce(g)

        result["allreduce_ms"] = 1e3 * _median_step(reduce, steps, barrier)
        # Every rank done before the group goes, and DDP's reducer (its gloo work threads)
        # gone before it: a reducer torn down at exit after the group ended the process
        # with std::terminate ("terminate called without an active exception", exit 9).
        dist.barrier()
        del model, opt
        dist.destroy_process_group()
    return result


def _launch(role: str, ranks: int, threads: int, steps: int) -> dict[str, Any]:
    env = dict(os.environ, SHAPEGRAD_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    with socket.socket() as s:  # a free port for gloo's rendezvous
        s.bind(("127.0.0.1", 0))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    cmd = [sys.executable, __file__, "--role", role, "--steps", str(steps)]
    if ranks > 1:
        mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{role} x{ranks} failed:\n{out.stdout}\n{out.stderr}")
    return dict(json.loads(lines[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--role", choices=("shapegrad", "torch"))
    args = parser.parse_args()
    if args.role is not None:
        result = run_shapegrad(args.steps) if args.role == "shapegrad" else run_torch(args.steps)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            print(json.dumps(result))
        return
    roles = ["shapegrad"]
    try:
        import torch  # noqa: F401

        roles.append("torch")
    except ImportError:
        print("(torch not importable: PyTorch DDP rows skipped)")
    print(
        f"MLP 784-512-512-10, global batch {GLOBAL_BATCH}, SGD, float32; median of {args.steps} steps"
    )
    print(f"{'':24}{'step ms':>10}{'all-reduce ms':>15}{'step w/o AR ms':>16}")
    for role in roles:
        for ranks, threads in ((1, 2), (2, 1)):
            r = _launch(role, ranks, threads, args.steps)
            ar = f"{r['allreduce_ms']:.3f}" if "allreduce_ms" in r else "-"
            alone = (
                f"{r['step_without_allreduce_ms']:.3f}" if "step_without_allreduce_ms" in r else "-"
            )
            print(
                f"{role + f' {ranks} rank x {threads} thr':24}{r['step_ms']:>10.3f}{ar:>15}{alone:>16}"
            )
    nbytes = 4 * sum(int(np.prod(s)) for s in SHAPES)
    print(f"\nalpha-beta predictions for {nbytes / 1e6:.2f} MB at 100 Gb/s, alpha = 5 us:")
    for n in (8, 64, 512):
        p = alpha_beta(n, nbytes)
        print(
            f"  N={n:<4} ring {1e3 * p['ring']:.2f} ms (latency {1e3 * p['latency_ring']:.2f}, "
            f"bandwidth {1e3 * p['bandwidth']:.3f}); halving/doubling {1e3 * p['halving_doubling']:.2f} ms"
        )


if __name__ == "__main__":
    main()
