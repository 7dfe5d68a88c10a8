"""Collectives on tensors (like JAX's ``psum``): primitives, so they run eagerly, trace into
compiled graphs and differentiate through the one VJP rule set (``ops/vjp.py``)."""

from __future__ import annotations

from shapegrad.distributed._comm import Communicator
from shapegrad.distributed._mpi import world
from shapegrad.ops import prims as p
from shapegrad.tensor import Tensor


def all_reduce(x: Tensor, op: str = "sum", comm: Communicator | None = None) -> Tensor:
    """Elementwise sum, mean or max of ``x`` over the processes of ``comm``.

    Args:
        x: the same shape and dtype on every process (checked: a mismatch raises
            ``RankMismatchError`` naming the ranks).
        op: ``"sum"``, ``"mean"`` (floats) or ``"max"`` (on bool: logical or).
        comm: default :func:`world`.
    Returns:
        The reduced tensor, identical on every process. Its gradient with respect to
        ``x`` sums the cotangents of every process (``"mean"`` averages them).
    Example:
        >>> total = sg.distributed.all_reduce(loss, "mean")
    """
    return p.all_reduce(x, comm if comm is not None else world(), op)


def all_gather(x: Tensor, comm: Communicator | None = None) -> Tensor:
    """Every process's ``x`` concatenated along the leading axis, in rank order.

    Example:
        >>> sg.distributed.all_gather(sg.tensor([rank]))   # [0, 1, ..., size-1]
    """
    return p.all_gather(x, comm if comm is not None else world())


def reduce_scatter(x: Tensor, comm: Communicator | None = None) -> Tensor:
    """The sum of ``x`` over processes, split along the leading axis into ``size`` blocks;
    this process keeps block ``rank`` (the transpose of :func:`all_gather`)."""
    return p.reduce_scatter(x, comm if comm is not None else world())


def broadcast(x: Tensor, root: int = 0, comm: Communicator | None = None) -> Tensor:
    """``root``'s ``x`` on every process; the gradient flows back to ``root`` only.

    Example:
        >>> w = sg.distributed.broadcast(w, root=0)   # identical initial weights
    """
    return p.broadcast_from(x, comm if comm is not None else world(), root)


def reduce_metric(value: float, op: str = "mean", comm: Communicator | None = None) -> float:
    """A Python number (a metric: loss, accuracy, a count) reduced over the processes:
    ``"mean"``, ``"sum"`` or ``"max"``; the same result on every process.

    Example:
        >>> acc = sg.distributed.reduce_metric(correct / total)   # before rank 0 prints it
    """
    import numpy as np

    group = comm if comm is not None else world()
    return float(group.all_reduce(np.asarray(float(value)), op))
