"""Mini-batches over NumPy arrays: reshuffled every epoch, with a fixed batch shape.

Compiled training steps are specialised to one input shape, so by default a
short last batch is dropped (``last="drop"``) or topped up (``last="pad"``);
``last="keep"`` yields it as is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shapegrad.random import check_seed

LastBatch = Literal["drop", "pad", "keep"]
Batch = tuple[npt.NDArray[Any], ...]


class Batches:
    """An iterable of mini-batches; each ``iter()`` is one epoch with a fresh shuffle.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so two
    ``Batches`` with the same seed yield the same sequence, and a resumed run
    can continue at any epoch with ``start_epoch``.

    Args:
        *arrays: arrays with the same first dimension (e.g. inputs and labels).
        batch_size: rows per batch.
        shuffle: reshuffle the rows at the start of every epoch.
        seed: seed of the shuffles.
        last: what to do with a final batch shorter than ``batch_size``:
            ``"drop"`` it, ``"pad"`` it by wrapping around to the first rows of
            the same epoch (every padded row is a real sample, so no mask is
            needed; those samples count twice in that epoch), or ``"keep"`` it short.
        start_epoch: the epoch number of the first ``iter()``.
        shard: data parallel: a :class:`~shapegrad.distributed.Communicator` (or a
            ``(rank, size)`` pair). ``batch_size`` stays the *global* batch: every process
            computes the same shuffled global batches from the shared ``seed`` and yields
            its own contiguous block of ``batch_size // size`` rows of each, so shards
            are disjoint, every process runs the same number of steps, and training on
            ``size`` processes sees exactly the batches one process would.
    Example:
        >>> x = np.arange(10).reshape(5, 2)
        >>> [b[0][:, 0].tolist() for b in Batches(x, batch_size=2, shuffle=False, last="pad")]
        [[0, 2], [4, 6], [8, 0]]
    """

    def __init__(
        self,
        *arrays: npt.ArrayLike,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        last: LastBatch = "drop",
        start_epoch: int = 0,
        shard: Any = None,
    ) -> None:
        if not arrays:
            raise ValueError("Batches: give at least one array")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ValueError(f"Batches: arrays disagree in their first dimension: {shapes}")
        if batch_size < 1:
            raise ValueError(f"Batches: batch_size must be >= 1, got {batch_size}")
        if last not in ("drop", "pad", "keep"):
            raise ValueError(f"Batches: last must be 'drop', 'pad' or 'keep', got {last!r}")
        self.n = lengths.pop()
        if last == "drop" and self.n < batch_size:
            raise ValueError(
                f"Batches: batch_size {batch_size} exceeds the {self.n} rows and last='drop' "
                "would yield nothing; lower batch_size or use last='pad'"
            )
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = check_seed(seed, "Batches")
        self.last: LastBatch = last
        if (
            isinstance(start_epoch, bool)
            or not isinstance(start_epoch, int | np.integer)
            or start_epoch < 0
        ):
            raise ValueError(f"Batches: start_epoch must be an int >= 0, got {start_epoch!r}")
        self.epoch = int(start_epoch)
        self.rank, self.size = _shard(shard)
        if batch_size % self.size:
            raise ValueError(
                f"Batches: the global batch_size {batch_size} does not split evenly over "
                f"{self.size} processes; use a multiple of {self.size}"
            )

    def __len__(self) -> int:
        """Number of batches per epoch."""
        full, rest = divmod(self.n, self.batch_size)
        return full + (1 if rest and self.last != "drop" else 0)

    def order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The row order of ``epoch`` (a permutation of ``range(n)``)."""
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        # one independent stream per (seed, epoch): epochs don't depend on how many ran before
        return np.random.default_rng((self.seed, epoch)).permutation(self.n).astype(np.int64)

    def epoch_indices(self, epoch: int) -> list[npt.NDArray[np.int64]]:
        """Row indices of each batch of ``epoch``."""
        order = self.order(epoch)
        batches = []
        for start in range(0, self.n, self.batch_size):
            rows = order[start : start + self.batch_size]
            if len(rows) < self.batch_size:
                if self.last == "drop":
                    break
                if self.last == "pad":
                    # cycle the epoch's order: padding may need more than n rows when n < batch
                    missing = self.batch_size - len(rows)
                    rows = np.concatenate([rows, np.resize(order, missing)])
            batches.append(rows)
        return batches

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        self.epoch += 1
        per = self.batch_size // self.size
        for rows in self.epoch_indices(epoch):
            if self.size > 1 and len(rows) == self.batch_size:  # this process's block
                rows = rows[self.rank * per : (self.rank + 1) * per]
            elif self.size > 1:
                rows = _split(rows, self.rank, self.size)
            yield tuple(a[rows] for a in self.arrays)


def _split(rows: npt.NDArray[np.int64], rank: int, size: int) -> npt.NDArray[np.int64]:
    """Block ``rank`` of a short last batch (``last="keep"``): sizes differ by at most one."""
    return np.array_split(rows, size)[rank]


def _shard(shard: Any) -> tuple[int, int]:
    """(rank, size) of ``shard``: None, a ``(rank, size)`` pair or a communicator."""
    if shard is None:
        return 0, 1
    if isinstance(shard, tuple):
        rank, size = (int(v) for v in shard)
    else:
        rank, size = int(shard.rank), int(shard.size)
    if not 0 <= rank < size:
        raise ValueError(f"Batches: shard rank {rank} is not in [0, {size})")
    return rank, size
