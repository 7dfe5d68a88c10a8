"""Data-parallel step time: shapegrad on MPI vs PyTorch DDP (gloo), on this machine.

Workload: the MLP 784-512-512-10, softmax cross-entropy, plain SGD, float32, global
batch 256. Configurations (both use the machine's 2 cores):

* 1 rank x 2 threads: one process, the whole batch, ``SHAPEGRAD_NUM_THREADS=2``;
* 2 ranks x 1 thread: ``mpiexec -n 2``, 128 rows per rank, gradients averaged inside the
  compiled step (one native call per step): all-reduced in buckets (``train/step.py``
  ``BUCKET_BYTES``), each exchange started as soon as its last gradient is written and
  waited for just before the update reads it (``compiler/overlap.py``). Three rows:
  "AR shm", the default, exchanges through memory shared by the ranks of the node, each
  gradient summed over the ranks where the update loads it (``backends/c/shmplan.py``
  ``ReaderSum``; ``AR mpi`` if ``SHAPEGRAD_ALLREDUCE=mpi`` is set); "AR shm chunked",
  the same step compiled with ``SHAPEGRAD_SHM_READER=0`` (the chunked shared-memory
  exchange: copy in, reduce a chunk, copy out, then the update); and "AR mpi", the same
  step over a duplicate of the world communicator with ``allreduce="mpi"``
  (``MPI_Iallreduce``/``MPI_Test``/``MPI_Wait``), all interleaved in the same launch.

One interleaved run: ``--rounds`` rounds, each launching every configuration once
(shapegrad 1 rank, shapegrad 2 ranks, PyTorch 1 rank, PyTorch DDP 2 ranks), so a change
of load hits all of them alike. Within a 2-rank launch, steps of the data-parallel
trainer alternate with steps of the same model on the same 128-row shard *without* any
exchange (both ranks busy, as in the real step): the **all-reduce share** is
``(step - step without all-reduce) / step``, from medians of the alternating steps
(and, last column, from their 25th percentiles: on a shared machine the median also
counts the time slices a rank waits for its peer). The
same for PyTorch (DDP vs the bare model). The run prints the CPU model, its vector
width, the core count and the load average before and after, and whether shapegrad's
2 ranks beat PyTorch DDP's in every round. For shapegrad 2 ranks, **in-step timers** too:
the same step compiled with ``profile=True``; the time per step in the kernels that start
and wait for the exchanges, and its share of the time in all kernels.

"AR copies" is the default step compiled with ``SHAPEGRAD_SHM_SHARD=0``: every rank
keeps its own copy of the parameters and updates all of it, instead of one copy per node
that each rank updates a chunk of (``backends/c/shmshard.py``). ``--scaling 2,4,8``
instead launches each rank count once per round (weak scaling, 128 rows per rank, one
thread per rank) and times the two against the step without exchange: a copy per rank
reads every other rank's whole gradient, a chunk only its share of each.

``--bucket-sweep`` instead times, interleaved in one 2-rank launch, the step with
several bucket sizes, with blocking exchanges (the ``overlap_collectives`` stage off) and
without the ``MPI_Test`` calls between kernels: the measurement behind ``BUCKET_BYTES``
and ``PROGRESS_MIN_WORK``.

Run: ``python benchmarks/data_parallel.py [--steps 40] [--rounds 3]
[--background-load N]`` (needs ``pip install -e '.[mpi]'``); ``--background-load N``
keeps N busy processes running during the rounds (the step under a loaded machine).

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
call MPI_Iallreduce, so we inherit that). With weak scaling (256 rows per machine, a
~3-5 ms step on one 2-core box) the all-reduce is ~10% of the step, and overlapping it
with the backward pass (the buckets above: the last layer's gradients are exchanged
while the first layer's are computed) hides the part that has computation left to hide
behind. With strong scaling (a fixed global batch 256 over 512 machines = 0.5 row each)
compute vanishes and the 0.5 ms all-reduce sets the step time: grow the batch with N,
or shard the model instead. The script prints these predictions from the same formula
(``alpha_beta``).
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


def _interleaved(steps: dict[str, Any], count: int, barrier: Any = None) -> dict[str, float]:
    """Median seconds of each step function, run alternately (``count`` rounds after 5
    warm-up rounds), every step after a barrier so the ranks start together."""
    return {
        name: statistics.median(ts) if ts else 0.0
        for name, ts in _times(steps, count, barrier).items()
    }


def _p25(times: list[float]) -> float:
    """The 25th percentile: the step's time when the other jobs of the machine leave it be."""
    return sorted(times)[len(times) // 4] if times else 0.0


def _times(steps: dict[str, Any], count: int, barrier: Any = None) -> dict[str, list[float]]:
    """Seconds of each step of each function (see ``_interleaved``)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for n in range(count + 5):
        for name, step in steps.items():
            if barrier is not None:
                barrier()
            t0 = time.perf_counter()
            step()
            if n >= 5:
                times[name].append(time.perf_counter() - t0)
    return times


def _mlp(params: list[Any], x: Any, y: Any) -> Any:
    import shapegrad as sg
    from shapegrad import functional as F

    h = x
    for i in range(0, len(params) - 2, 2):
        h = sg.relu(h @ params[i] + params[i + 1])
    return F.cross_entropy(h @ params[-2] + params[-1], y)


def run_shapegrad(steps: int, sweep: bool = False) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import shapegrad as sg
    from shapegrad import distributed as D

    comm = D.world()
    rng = np.random.default_rng(1)
    params = [sg.tensor(rng.normal(size=s).astype(np.float32) * 0.05) for s in SHAPES]
    x, y = _data(comm.rank, comm.size)
    barrier = comm.barrier if comm.size > 1 else None
    result: dict[str, Any] = {
        "ranks": comm.size,
        "threads": os.environ.get("SHAPEGRAD_NUM_THREADS"),
    }
    if sweep:
        result["sweep_ms"] = _bucket_sweep(params, x, y, steps, barrier)
        return result
    dp = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c", data_parallel=comm.size > 1)
    if comm.size == 1:
        result["step_ms"] = 1e3 * _interleaved({"dp": lambda: dp.step(x, y)}, steps)["dp"]
        return result
    # the same step exchanging through MPI's all-reduce (allreduce="mpi"), interleaved
    assert isinstance(comm, D.MPICommunicator)
    over_mpi = D.MPICommunicator(comm.comm.Dup(), key="world-mpi", allreduce="mpi")
    dp_mpi = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c", data_parallel=over_mpi)
    alone = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c")
    # the chunked shared-memory exchange (SHAPEGRAD_SHM_READER=0 while it compiles), and
    # the reader sum with a copy of the parameters per rank (SHAPEGRAD_SHM_SHARD=0)
    chunked = _compiled_with(_mlp, params, x, y, "SHAPEGRAD_SHM_READER")
    copies = _compiled_with(_mlp, params, x, y, "SHAPEGRAD_SHM_SHARD")
    times = _times(
        {
            "dp": lambda: dp.step(x, y),
            "chunked": lambda: chunked.step(x, y),
            "copies": lambda: copies.step(x, y),
            "mpi": lambda: dp_mpi.step(x, y),
            "alone": lambda: alone.step(x, y),
        },
        steps,
        barrier,
    )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    low = {name: _p25(ts) for name, ts in times.items()}
    result["step_ms"], result["step_without_allreduce_ms"] = 1e3 * med["dp"], 1e3 * med["alone"]
    result["p25_ms"] = (1e3 * low["dp"], 1e3 * low["alone"])
    for variant in ("chunked", "copies"):
        result[variant] = {
            "step_ms": 1e3 * med[variant],
            "step_without_allreduce_ms": 1e3 * med["alone"],
            "p25_ms": (1e3 * low[variant], 1e3 * low["alone"]),
        }
    grads = [np.ones(s, np.float32) for s in SHAPES]
    reduce = sg.compile(lambda gs: [D.all_reduce(g, "mean") for g in gs], backend="c")
    reduce_mpi = sg.compile(lambda gs: [D.all_reduce(g, "mean", over_mpi) for g in gs], backend="c")
    ar = _interleaved({"r": lambda: reduce(grads), "m": lambda: reduce_mpi(grads)}, steps, barrier)
    result["allreduce_ms"] = 1e3 * ar["r"]
    result["exposed_ms"], result["kernels_ms"] = _exposed_exchange(comm, x, y, steps, barrier)
    exposed, kernels = _exposed_exchange(over_mpi, x, y, steps, barrier)
    result["transport"] = comm.allreduce
    result["over_mpi"] = {
        "step_ms": 1e3 * med["mpi"],
        "step_without_allreduce_ms": 1e3 * med["alone"],
        "p25_ms": (1e3 * low["mpi"], 1e3 * low["alone"]),
        "allreduce_ms": 1e3 * ar["m"],
        "exposed_ms": exposed,
        "kernels_ms": kernels,
    }
    return result


def run_scaling(steps: int) -> dict[str, Any]:
    """One rank of a ``--scaling`` launch: weak scaling (128 rows per rank), the default
    step (state once per node, updated in shards) against the same step with a copy of
    the state per rank (``SHAPEGRAD_SHM_SHARD=0``) and the step without exchange,
    interleaved; medians and 25th percentiles in ms."""
    sys.path.insert(0, str(ROOT / "src"))
    import shapegrad as sg
    from shapegrad import distributed as D

    comm = D.world()
    rng = np.random.default_rng(1)
    params = [sg.tensor(rng.normal(size=s).astype(np.float32) * 0.05) for s in SHAPES]
    data = np.random.default_rng(100 + comm.rank)
    x = data.random((128, 784), dtype=np.float32)
    y = data.integers(0, 10, 128).astype(np.int32)
    shards = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c", data_parallel=True)
    copies = _compiled_with(_mlp, params, x, y, "SHAPEGRAD_SHM_SHARD")
    alone = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c")
    times = _times(
        {
            "shards": lambda: shards.step(x, y),
            "copies": lambda: copies.step(x, y),
            "alone": lambda: alone.step(x, y),
        },
        steps,
        comm.barrier,
    )
    return {
        "ranks": comm.size,
        "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "p25_ms": {k: 1e3 * _p25(v) for k, v in times.items()},
    }


def _compiled_with(model: Any, params: list[Any], x: Any, y: Any, variable: str) -> Any:
    """A data-parallel trainer whose step was compiled (its first step) with ``variable=0``."""
    import shapegrad as sg

    trainer = sg.ScalarTrainer(model, params, mode="compiled", backend="c", data_parallel=True)
    saved = os.environ.get(variable)
    os.environ[variable] = "0"
    try:
        trainer.step(x, y)
    finally:
        if saved is None:
            del os.environ[variable]
        else:
            os.environ[variable] = saved
    return trainer


def _exposed_exchange(
    comm: Any, x: np.ndarray, y: np.ndarray, steps: int, barrier: Any
) -> tuple[float, float]:
    """Timers inside the step: the same data-parallel SGD step compiled with
    ``profile=True``; (ms per step in the kernels that start and wait for the exchanges,
    ms per step in all kernels), rank 0's timers."""
    import types

    import shapegrad as sg
    from shapegrad.train.step import average_over_processes

    plan = types.SimpleNamespace(comm=comm)

    def step(params: list[Any], x: Any, y: Any) -> Any:
        loss, grads = sg.value_and_grad(_mlp)(params, x, y)
        loss, grads = average_over_processes(plan, loss, grads)  # type: ignore[arg-type]
        return loss, [w - 0.01 * g for w, g in zip(params, grads, strict=True)]

    rng = np.random.default_rng(1)
    params = [(rng.normal(size=s) * 0.05).astype(np.float32) for s in SHAPES]
    exe = sg.compile(step, backend="c", profile=True).lower(params, x, y).executable
    args = [*params, x, y]
    _interleaved({"warm": lambda: exe(args)}, 0, barrier)
    before = {name: t for name, _, t in exe.profile()}
    _interleaved({"timed": lambda: exe(args)}, steps, barrier)
    spent = {name: (t - before.get(name, 0.0)) / (steps + 5) for name, _, t in exe.profile()}
    exchange = sum(t for name, t in spent.items() if name.endswith(("_start", "_wait")))
    return 1e3 * exchange, 1e3 * sum(spent.values())


def _bucket_sweep(
    params: list[Any], x: np.ndarray, y: np.ndarray, steps: int, barrier: Any
) -> dict[str, float]:
    """Step medians per bucket size (and blocking), interleaved in one launch."""
    import shapegrad as sg
    from shapegrad.compiler import overlap as overlap_stage
    from shapegrad.compiler import pipeline
    from shapegrad.train import step as train_step

    stages, saved = list(pipeline.LOOP_PIPELINE), train_step.BUCKET_BYTES
    progress = overlap_stage.PROGRESS_MIN_WORK
    # for this MLP, 256 KiB and 1 MiB make the same buckets, and 4 MiB makes one bucket
    sizes = {"1 bucket": 1 << 40, "1 MiB": 1 << 20, "per gradient": 1}
    configs = [("blocking, 1 bucket", 1 << 40, False), ("blocking, 1 MiB", 1 << 20, False)]
    configs += [(f"overlapped, {name}", size, True) for name, size in sizes.items()]
    configs += [("overlapped, 1 MiB, no MPI_Test", 1 << 20, True)]
    funcs: dict[str, Any] = {}
    try:
        for name, size, overlap in configs:
            train_step.BUCKET_BYTES = size
            overlap_stage.PROGRESS_MIN_WORK = 1 << 62 if "no MPI_Test" in name else progress
            keep = [s for s in stages if overlap or s.name != "overlap_collectives"]
            pipeline.LOOP_PIPELINE[:] = keep
            trainer = sg.ScalarTrainer(
                _mlp, params, mode="compiled", backend="c", data_parallel=True
            )
            trainer.step(x, y)  # traced and compiled now, under these settings
            funcs[name] = lambda t=trainer: t.step(x, y)
    finally:
        pipeline.LOOP_PIPELINE[:] = stages
        train_step.BUCKET_BYTES = saved
        overlap_stage.PROGRESS_MIN_WORK = progress
    alone = sg.ScalarTrainer(_mlp, params, mode="compiled", backend="c")
    funcs["no all-reduce"] = lambda: alone.step(x, y)
    return {k: 1e3 * v for k, v in _interleaved(funcs, steps, barrier).items()}


def run_torch(steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    size = int(os.environ.get("PMI_SIZE", "1"))
    rank = int(os.environ.get("PMI_RANK", "0"))
    torch.set_num_threads(int(os.environ.get("SHAPEGRAD_NUM_THREADS", "1")))

    def mlp() -> Any:
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
        )  # fmt: skip

    xa, ya = _data(rank, size)
    x, y = torch.from_numpy(xa), torch.from_numpy(ya).long()

    def stepper(model: Any) -> Any:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    if size == 1:
        med = _interleaved({"dp": stepper(mlp())}, steps)
        return {"ranks": 1, "step_ms": 1e3 * med["dp"]}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size))
    dist.init_process_group("gloo", init_method="env://")
    ddp = torch.nn.parallel.DistributedDataParallel(mlp())
    med = _interleaved({"dp": stepper(ddp), "alone": stepper(mlp())}, steps, dist.barrier)
    grads = [torch.ones(s) for s in SHAPES]

    def reduce() -> None:
        for g in grads:
            dist.all_reduce(g)

    ar = _interleaved({"r": reduce}, steps, dist.barrier)["r"]
    dist.barrier()
    return {
        "ranks": size,
        "step_ms": 1e3 * med["dp"],
        "step_without_allreduce_ms": 1e3 * med["alone"],
        "allreduce_ms": 1e3 * ar,
    }


def _launch(role: str, ranks: int, threads: int, steps: int, sweep: bool = False) -> dict[str, Any]:
    env = dict(os.environ, SHAPEGRAD_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    with socket.socket() as s:  # a free port for gloo's rendezvous
        s.bind(("127.0.0.1", 0))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    cmd = [sys.executable, __file__, "--role", role, "--steps", str(steps)]
    cmd += ["--bucket-sweep"] if sweep else []
    if ranks > 1:
        mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(
            f"{role} x{ranks} failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}"
        )
    return dict(json.loads(lines[0]))


def machine() -> str:
    """CPU model, vector width, cores and load average (the figures' conditions)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    width = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model} ({width}), {os.cpu_count()} cores, load average {load}"


def _row(name: str, r: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        return f"{r[key]:.3f}" if key in r else "-"

    share = exposed = low = "-"
    if "step_without_allreduce_ms" in r:
        share = f"{100 * (r['step_ms'] - r['step_without_allreduce_ms']) / r['step_ms']:.1f}%"
    if "p25_ms" in r:
        step, alone = r["p25_ms"]
        low = f"{step:.3f}/{alone:.3f} {100 * (step - alone) / step:.1f}%"
    if "exposed_ms" in r:
        exposed = f"{r['exposed_ms']:.3f} ({100 * r['exposed_ms'] / r['kernels_ms']:.0f}%)"
    return (
        f"{name:26}{ms('step_ms'):>10}{ms('step_without_allreduce_ms'):>16}{share:>10}"
        f"{ms('allreduce_ms'):>13}{exposed:>18}{low:>24}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-sweep", action="store_true")
    parser.add_argument("--role", choices=("shapegrad", "torch", "scaling"))
    parser.add_argument(
        "--scaling", metavar="N,N,...",
        help="instead: ranks x 1 thread for each N, weak scaling (128 rows per rank), state "
        "once per node vs a copy per rank (needs N cores)",
    )  # fmt: skip
    parser.add_argument(
        "--background-load", type=int, default=0, metavar="N",
        help="run N busy processes (one spinning loop each) during the rounds",
    )  # fmt: skip
    args = parser.parse_args()
    if args.role is not None:
        if args.role == "shapegrad":
            result = run_shapegrad(args.steps, args.bucket_sweep)
        elif args.role == "scaling":
            result = run_scaling(args.steps)
        else:
            result = run_torch(args.steps)
        if int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0") == 0:
            print(json.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()
        if args.role == "torch":
            # Skip interpreter teardown: gloo's and DDP's threads destroyed at exit end the
            # process with std::terminate ("terminate called without an active exception",
            # exit 9) in both ranks' teardown order races; every rank is past its last
            # collective (the barrier above) and its result is printed.
            os._exit(0)
        return
    print(f"machine: {machine()}")
    if args.scaling:
        _scaling(args)
        return
    if args.bucket_sweep:
        r = _launch("shapegrad", 2, 1, args.steps, sweep=True)
        print(f"shapegrad 2 ranks x 1 thread, step ms (median of {args.steps}, interleaved):")
        for name, value in r["sweep_ms"].items():
            print(f"  {name:22}{value:8.3f}")
        print(f"machine after: {machine()}")
        return
    roles = ["shapegrad"]
    try:
        import torch  # noqa: F401

        roles.append("torch")
    except ImportError:
        print("(torch not importable: PyTorch rows skipped)")
    print(
        f"MLP 784-512-512-10, global batch {GLOBAL_BATCH}, SGD, float32; median of {args.steps}"
        f" steps per launch, {args.rounds} interleaved rounds"
    )
    header = (
        f"{'':26}{'step ms':>10}{'w/o all-red ms':>16}{'AR share':>10}{'AR alone ms':>13}"
        f"{'in-step wait ms':>18}{'p25 step/w/o, share':>24}"
    )
    wins = []
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(args.background_load)
    ]
    if busy:
        print(f"background load: {len(busy)} busy processes during the rounds")
    try:
        _rounds(args, roles, header, wins)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    if wins:
        verdict = "in every round" if all(wins) else f"in {sum(wins)} of {len(wins)} rounds"
        print(f"shapegrad 2 ranks faster than PyTorch DDP (gloo) 2 ranks {verdict}")
    print(f"machine after: {machine()}")
    nbytes = 4 * sum(int(np.prod(s)) for s in SHAPES)
    print(f"\nalpha-beta predictions for {nbytes / 1e6:.2f} MB at 100 Gb/s, alpha = 5 us:")
    for n in (8, 64, 512):
        p = alpha_beta(n, nbytes)
        print(
            f"  N={n:<4} ring {1e3 * p['ring']:.2f} ms (latency {1e3 * p['latency_ring']:.2f}, "
            f"bandwidth {1e3 * p['bandwidth']:.3f}); halving/doubling {1e3 * p['halving_doubling']:.2f} ms"
        )


def _scaling(args: argparse.Namespace) -> None:
    """``--scaling``: per rank count, every round, the step with the state once per node
    (updated in shards) and with a copy per rank, and each one's share over the step
    without exchange."""
    counts = [int(n) for n in args.scaling.split(",")]
    print(f"MLP 784-512-512-10, 128 rows per rank, SGD, 1 thread per rank; median of "
          f"{args.steps} steps, {args.rounds} rounds")  # fmt: skip
    print(f"{'ranks':>5}{'shards ms':>11}{'copies ms':>11}{'alone ms':>10}"
          f"{'shards share':>14}{'copies share':>14}{'p25 shares':>16}")  # fmt: skip
    for _ in range(args.rounds):
        for n in counts:
            r = _launch("scaling", n, 1, args.steps)
            med, low = r["median_ms"], r["p25_ms"]

            def share(t: dict[str, float], k: str) -> float:
                return 100 * (t[k] - t["alone"]) / t[k]

            print(
                f"{n:>5}{med['shards']:>11.3f}{med['copies']:>11.3f}{med['alone']:>10.3f}"
                f"{share(med, 'shards'):>13.1f}%{share(med, 'copies'):>13.1f}%"
                f"{share(low, 'shards'):>8.1f}/{share(low, 'copies'):.1f}%",
                flush=True,
            )
    print(f"machine after: {machine()}")


def _rounds(args: argparse.Namespace, roles: list[str], header: str, wins: list[bool]) -> None:
    """The interleaved rounds: every configuration launched once per round."""
    for n in range(args.rounds):
        print(f"round {n + 1}:\n{header}")
        results: dict[tuple[str, int], dict[str, Any]] = {}
        for role in roles:
            for ranks, threads in ((1, 2), (2, 1)):
                r = _launch(role, ranks, threads, args.steps)
                results[role, ranks] = r
                label = "PyTorch DDP" if role == "torch" and ranks > 1 else role
                if "transport" in r:  # shapegrad 2 ranks: shared memory, then MPI's all-reduce
                    print(_row(f"{label} {ranks}x{threads} AR {r['transport']}", r), flush=True)
                    if r["transport"] == "shm":
                        print(_row(f"{label} {ranks}x{threads} AR chunked", r["chunked"]))
                        print(_row(f"{label} {ranks}x{threads} AR copies", r["copies"]))
                    print(_row(f"{label} {ranks}x{threads} AR mpi", r["over_mpi"]), flush=True)
                    continue
                print(_row(f"{label} {ranks} rank x {threads} thr", r), flush=True)
        if "torch" in roles:
            ours, theirs = results["shapegrad", 2]["step_ms"], results["torch", 2]["step_ms"]
            wins.append(ours < theirs)
            print(f"  shapegrad 2 ranks / PyTorch DDP 2 ranks: {ours / theirs:.2f}x the time")


if __name__ == "__main__":
    main()
