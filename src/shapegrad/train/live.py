"""A compiled training step bound to its persistent state (the bound strategy's engine).

``sg.compile(train_step, donate_argnums=...)`` marks parameters, optimizer
state and loss-scale state as *aliased*: their updated values overwrite the
inputs. A backend whose executables keep state (``Backend.binds_state``,
:class:`~shapegrad.backends.base.BoundExecutable`) then holds that state in
its own buffers, so each call passes only the batch (and the learning rate)
and returns only the loss and the learning rate used; ``run_steps`` runs K
steps in one native call.

While a :class:`LiveStep` is active, the executable's buffers are the truth;
the trainer reads them back (``read``) before anything else looks at or
replaces the parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shapegrad import tree
from shapegrad.backends.base import BoundExecutable, StateLayout
from shapegrad.dtypes import to_numpy
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor

if TYPE_CHECKING:
    from shapegrad.jit import Compiled

Array = npt.NDArray[Any]
Signature = tuple[tuple[tuple[int, ...], Any, bool], ...]


def signature_of(inputs: Sequence[Any]) -> Signature:
    """Shape, dtype and contiguity of each batch input: the key of a binding's fast path."""
    return tuple(map(_sig, inputs))


def _sig(x: Any) -> tuple[tuple[int, ...], Any, bool]:
    if type(x) is np.ndarray:
        return (x.shape, x.dtype, x.flags.c_contiguous)
    if isinstance(x, Tensor):
        return (x.shape, x.dtype, False)  # always converted: .numpy() then the graph dtype
    array = np.asarray(x)
    return (array.shape, array.dtype, False)  # lists and scalars: always converted


class LiveStep:
    """One bound training step for one optimizer, learning-rate kind and batch signature.

    Args:
        opt_key: the optimizer's ``config_key()``.
        scheduled: True when the step takes no learning rate (the schedule gives it).
        signature: :func:`signature_of` the batch inputs it was bound for.
        bound: the bound executable (its free outputs are the loss and the lr used).
        state_def: the tree of ``(params, opt_state, scaler)`` its state flattens.
        batch_dtypes: the graph's dtype of each batch input (after the lr when given).
        rate_dtype: the learning rate's dtype (the master dtype).
    """

    def __init__(
        self,
        opt_key: Any,
        scheduled: bool,
        signature: Signature,
        bound: BoundExecutable,
        state_def: tree.TreeDef,
        batch_dtypes: Sequence[np.dtype[Any]],
        rate_dtype: np.dtype[Any],
    ) -> None:
        self.opt_key = opt_key
        self.scheduled = scheduled
        self.signature = signature
        self.bound = bound
        self.state_def = state_def
        self._run = bound.step
        data_dtypes = list(batch_dtypes) if scheduled else list(batch_dtypes)[1:]
        self.data_dtypes = data_dtypes
        # Inputs that are not already a C-contiguous array of the graph's dtype: converted.
        self._convert = [
            (k, d)
            for k, ((_, dtype, contiguous), d) in enumerate(
                zip(signature, data_dtypes, strict=True)
            )
            if not (contiguous and dtype == d)
        ]
        self._rate = np.zeros((), rate_dtype)  # refilled in place: the step sees one array
        self.dirty = False  # True when the buffers hold steps the trainer has not read back
        self.last_lr = float("nan")  # the learning rate the latest step used

    def accepts(self, opt_key: Any, scheduled: bool, inputs: Sequence[Any]) -> bool:
        """Whether this binding runs a step of ``opt_key`` with this lr kind on ``inputs``."""
        return (
            scheduled is self.scheduled
            and opt_key == self.opt_key
            and signature_of(inputs) == self.signature
        )

    def _batch(self, inputs: Sequence[Any]) -> list[Any]:
        batch = list(inputs)
        for k, dtype in self._convert:
            x = batch[k]
            # Not np.ascontiguousarray: it turns a 0-d input into shape [1].
            a = to_numpy(x.numpy() if isinstance(x, Tensor) else x, dtype, what="ScalarTrainer")
            batch[k] = a if a.flags.c_contiguous else a.copy(order="C")
        return batch

    def step(self, inputs: Sequence[Any], lr: float | None) -> float:
        """Run one step; returns the loss (``last_lr`` is updated)."""
        batch = self._batch(inputs) if self._convert else inputs
        self.dirty = True  # before the call: a failing step may have changed the state
        if lr is None:
            loss, rate = self._run(*batch)
        else:
            self._rate[()] = lr
            loss, rate = self._run(self._rate, *batch)
        self.last_lr = float(rate)
        return float(loss)

    def run_steps(self, stacked: Sequence[Any], lr: float | None) -> Array:
        """Run ``K`` steps on inputs stacked ``[K, ...]``; returns the K losses (a copy)."""
        arrays = []
        for x, dtype in zip(stacked, self.data_dtypes, strict=True):
            a = to_numpy(x.numpy() if isinstance(x, Tensor) else x, dtype, what="ScalarTrainer")
            arrays.append(a if a.flags.c_contiguous else a.copy(order="C"))
        count = arrays[0].shape[0]
        rates = [] if lr is None else [np.full(count, lr, self._rate.dtype)]
        self.dirty = True  # before the call: the steps before a failing one are applied
        losses, lrs = self.bound.run_steps(*rates, *arrays)
        if len(lrs):
            self.last_lr = float(lrs[-1])
        return np.array(losses, copy=True)

    def read(self) -> Any:
        """The current state tree ``(params, opt_state, scaler)`` as fresh eager tensors."""
        return tree.unflatten(self.state_def, [tensor(a) for a in self.bound.state])

    def read_leaf(self, index: int) -> Array:
        """One state array (a copy), by its flat index in the state tree."""
        return np.array(self.bound.state[index], copy=True)


def bind_step(
    compiled: Compiled,
    args: tuple[Any, ...],
    n_state_args: int,
    opt_key: Any,
    signature: Signature,
) -> LiveStep:
    """Bind ``compiled`` (called with ``args``; the first ``n_state_args`` are donated state).

    Raises:
        RuntimeError: the backend returned no binding, or the lowered step does not have
            the layout of a training step (every state leaf aliased; loss and lr out).
    """
    lowered = compiled.lower(*args)
    layout = StateLayout.of(lowered.executable.graph)  # no passes on a keyed-cache hit
    state_leaves, state_def = tree.flatten(tuple(args[:n_state_args]))
    if layout.state_inputs != tuple(range(len(state_leaves))) or len(layout.free_outputs) != 2:
        raise RuntimeError(
            f"ScalarTrainer: the compiled step has state inputs {layout.state_inputs} and "
            f"free outputs {layout.free_outputs}; expected the {len(state_leaves)} state "
            "leaves first and exactly the loss and the learning rate out"
        )
    arrays = [np.asarray(x.numpy() if isinstance(x, Tensor) else x) for x in state_leaves]
    bound = lowered.executable.bind(arrays)
    if bound is None:
        raise RuntimeError(f"backend {compiled.backend!r} says it binds state but bind() gave None")
    inputs = lowered.executable.graph.inputs
    batch_dtypes = [inputs[i].aval.dtype.numpy for i in layout.batch_inputs]
    scheduled = args[n_state_args] is None
    rate_dtype = batch_dtypes[0] if not scheduled else np.dtype(np.float32)
    return LiveStep(opt_key, scheduled, signature, bound, state_def, batch_dtypes, rate_dtype)


__all__ = ["LiveStep", "Signature", "bind_step", "signature_of"]
