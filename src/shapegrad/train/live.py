"""A compiled training step bound to its persistent state (the C backend's fast path).

``sg.compile(train_step, donate_argnums=...)`` marks parameters, optimizer
state and loss-scale state as *aliased*: their updated values overwrite the
inputs. A backend whose executable offers ``bind(state)`` (the C backend)
then keeps that state in its own buffers, so each call passes only the batch
(and the learning rate) and returns only the loss; ``run_steps`` runs K
steps in one native call.

While a :class:`LiveStep` is active, the executable's buffers are the truth;
the trainer reads them back (``read``) before anything else looks at or
replaces the parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shapegrad import tree
from shapegrad.dtypes import to_numpy
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor

Array = npt.NDArray[Any]


class LiveStep:
    """One bound training step. Build it with :func:`bind_step` (returns None when the
    backend has no bound calling convention, so the caller keeps the plain path)."""

    def __init__(
        self, key: Any, bound: Any, state_def: tree.TreeDef, batch_dtypes: Sequence[np.dtype[Any]]
    ) -> None:
        self.key = key
        self.bound = bound
        self.state_def = state_def
        self.batch_dtypes = list(batch_dtypes)
        self.dirty = False  # True when the buffers hold steps the trainer has not read back
        self.last_lr = float("nan")  # the learning rate the latest step used

    def _arrays(self, batch: Sequence[Any]) -> list[Array]:
        out = []
        for x, d in zip(batch, self.batch_dtypes, strict=True):
            # Not np.ascontiguousarray: it turns a 0-d learning rate into shape [1].
            a = to_numpy(x.numpy() if isinstance(x, Tensor) else x, d, what="ScalarTrainer")
            out.append(a if a.flags.c_contiguous else a.copy(order="C"))
        return out

    def step(self, batch: Sequence[Any]) -> float:
        """Run one step on the non-state inputs; returns the loss (``last_lr`` is updated)."""
        loss, lr = self.bound(*self._arrays(batch))
        self.dirty = True
        self.last_lr = float(lr)
        return float(loss)

    def run_steps(self, stacked: Sequence[Any]) -> Array:
        """Run ``K`` steps on inputs stacked ``[K, ...]``; returns the K losses (a copy)."""
        losses, lrs = self.bound.run_steps(*self._arrays(stacked))
        self.dirty = True
        if len(lrs):
            self.last_lr = float(lrs[-1])
        return np.array(losses, copy=True)

    def read(self) -> Any:
        """The current state tree ``(params, opt_state, scaler)`` as fresh eager tensors."""
        return tree.unflatten(self.state_def, [tensor(a) for a in self.bound.state])

    def read_leaf(self, index: int) -> Array:
        """One state array (a copy), by its flat index in the state tree."""
        return np.array(self.bound.state[index], copy=True)


def bind_step(compiled: Any, key: Any, args: tuple[Any, ...], n_state_args: int) -> LiveStep | None:
    """Bind ``compiled`` (called with ``args``; the first ``n_state_args`` are donated state).

    Returns None when the executable cannot be bound (e.g. the NumPy backend) or the
    lowering did not alias every state leaf, in which case plain calls are used.
    """
    lowered = compiled.lower(*args)
    exe = lowered.executable
    if not hasattr(exe, "bind"):
        return None
    state_leaves, state_def = tree.flatten(tuple(args[:n_state_args]))
    if list(getattr(exe, "state_inputs", [])) != list(range(len(state_leaves))):
        return None
    if len(getattr(exe, "free_outputs", ())) != 2:  # only the loss and the lr come back
        return None
    arrays = [np.asarray(x.numpy() if isinstance(x, Tensor) else x) for x in state_leaves]
    batch_dtypes = [lowered.graph.inputs[i].aval.dtype.numpy for i in exe.batch_inputs]
    return LiveStep(key, exe.bind(arrays), state_def, batch_dtypes)


__all__ = ["LiveStep", "bind_step"]
