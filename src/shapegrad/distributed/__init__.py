"""Running one program on several processes: communicators and collectives.

The engine is MPI through ``mpi4py`` (``pip install 'shapegrad[mpi]'`` installs both
and an MPI library); start a job with ``mpiexec -n 2 python train.py``. Collectives
(:func:`all_reduce`, :func:`all_gather`, :func:`reduce_scatter`, :func:`broadcast`)
are primitives: eager, compiled (the C backend calls MPI inside the same native call
as the rest of the step) and differentiable. ``ScalarTrainer(..., data_parallel=True)``
builds data-parallel training on them.

Example:
    >>> comm = sg.distributed.world()
    >>> mean_loss = sg.distributed.all_reduce(loss, "mean")
"""

from shapegrad.distributed._collectives import (
    all_gather,
    all_reduce,
    broadcast,
    reduce_metric,
    reduce_scatter,
)
from shapegrad.distributed._comm import (
    Communicator,
    DistributedError,
    LocalCommunicator,
    NativeMPI,
    RankMismatchError,
    check_same,
)
from shapegrad.distributed._mpi import (
    MPICommunicator,
    Watchdog,
    install_abort_on_error,
    is_main,
    launched_size,
    rank,
    size,
    watch,
    world,
)

__all__ = [
    "Communicator",
    "DistributedError",
    "LocalCommunicator",
    "MPICommunicator",
    "NativeMPI",
    "RankMismatchError",
    "Watchdog",
    "all_gather",
    "all_reduce",
    "broadcast",
    "check_same",
    "install_abort_on_error",
    "is_main",
    "launched_size",
    "rank",
    "reduce_metric",
    "reduce_scatter",
    "size",
    "watch",
    "world",
]
