"""``ScalarTrainer(..., mode="compiled", backend="ane")``: the Neural Engine training design.

The ANE computes in fp16 only, so compiling ScalarTrainer's whole step (with
the optimizer inside) for it would be wrong. Instead this adapter hands the
loss to :class:`shapegrad.backends.ane.training.AneTrainer`: the parameters
are program inputs, forward + backward compile once, the fp32 master weights
and the optimizer stay on the host (or, with ``device_optimizer=True``, the
update is lowered into the program in fp32), and dynamic loss scaling skips
steps whose gradients overflow.

On Linux the program is built and saved, and running it (``step``,
``forward``) raises ``AneExecutionUnavailable`` saying Core ML execution
needs macOS: there is no fallback to another backend. Tests pass
``ane_runner=`` (the MIL NumPy evaluator) to execute the same program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shapegrad import tree
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train.optim import Optimizer

Array = npt.NDArray[Any]
RunnerFactory = Callable[[Any], Callable[[Any], Any]]


def _as_array(x: Any) -> Array:
    """A batch input as the program takes it: floats as float32, integers as int32."""
    array = np.asarray(x.numpy() if isinstance(x, Tensor) else x)
    if array.dtype.kind == "f":
        return array.astype(np.float32, copy=False)
    if array.dtype.kind in "iub":
        return array.astype(np.int32, copy=False)
    return array


class AneStep:
    """The ANE side of a ScalarTrainer: one :class:`AneTrainer`, built for one batch signature.

    Args:
        loss_fn: the trainer's ``loss_fn(params, *inputs)`` (params in the user's structure).
        leaves / treedef: the flattened float32 master parameters.
        optimizer: the trainer's optimizer (host update, or lowered with ``device_optimizer``).
        loss_scale / scale_window: initial scale and growth interval of the dynamic loss scale.
        device_optimizer: lower the update into the program.
        runner: executor factory for the lowered program (default: Core ML, macOS only).
        name: the package name.
    """

    def __init__(
        self,
        loss_fn: Callable[..., Tensor],
        leaves: Sequence[Tensor],
        treedef: tree.TreeDef,
        optimizer: Optimizer,
        loss_scale: float,
        scale_window: int,
        device_optimizer: bool = False,
        runner: RunnerFactory | None = None,
        name: str = "trainer_ane_step",
    ) -> None:
        self.treedef = treedef
        self.optimizer = optimizer
        self.device_optimizer = device_optimizer
        self.runner = runner
        self.name = name
        self.params: list[Array] = [np.asarray(x.numpy(), dtype=np.float32) for x in leaves]
        self._loss_fn = loss_fn
        self._scale = float(loss_scale)
        self._window = scale_window
        self.trainer: Any = None  # the AneTrainer, once the batch signature is known

    def _structured_loss(self, params: list[Tensor], *inputs: Any) -> Tensor:
        return self._loss_fn(tree.unflatten(self.treedef, list(params)), *inputs)

    def build(self, inputs: Sequence[Any]) -> Any:
        """Trace, lower, convert and save the step program for this batch signature."""
        from shapegrad.backends.ane.training import AneTrainer, LossScaler

        arrays = [_as_array(x) for x in inputs]
        if self.trainer is not None and self.trainer.input_avals == [
            (a.shape, a.dtype) for a in arrays
        ]:
            return self.trainer
        old = self.trainer
        scaler = old.scaler if old is not None else LossScaler(self._scale, self._window)
        scaler.scale = min(scaler.scale, scaler.max_scale)  # 2**16 is inf in fp16
        self.trainer = AneTrainer(
            self._structured_loss,
            self.params,
            arrays,
            self.optimizer,
            device_optimizer=self.device_optimizer,
            scaler=scaler,
            runner=self.runner,
            name=self.name,
        )
        if old is not None:  # a new batch shape: keep the optimizer's progress
            self.trainer.opt_state = old.opt_state
        return self.trainer

    def step(self, inputs: Sequence[Any], lr: float) -> float:
        """One update on a batch; returns the loss before it (skipped on overflow)."""
        trainer = self.build(inputs)
        loss = float(trainer.step(*[_as_array(x) for x in inputs], lr=lr))
        self.params = trainer.params
        return loss

    def forward(self, inputs: Sequence[Any]) -> float:
        """The loss at the current weights."""
        return float(self.build(inputs).loss(*[_as_array(x) for x in inputs]))

    def set_params(self, leaves: Sequence[Tensor]) -> None:
        """Install new master weights (shapes already checked by the trainer)."""
        self.params = [np.asarray(x.numpy(), dtype=np.float32) for x in leaves]
        if self.trainer is not None:
            self.trainer.params = list(self.params)

    def get_leaves(self) -> list[Tensor]:
        """The master weights as fresh eager tensors."""
        return [tensor(p.copy()) for p in self.params]

    @property
    def loss_scale(self) -> float:
        return float(self.trainer.scaler.scale) if self.trainer is not None else self._scale

    @property
    def skipped_steps(self) -> int:
        return int(self.trainer.scaler.skipped) if self.trainer is not None else 0


def check_ane_settings(
    flags: Sequence[bool], clip_norm: float | None, dtype: Any, leaves: Sequence[Tensor]
) -> None:
    """Reject ScalarTrainer settings the ANE design does not implement (clearly, up front)."""
    if not all(flags):
        raise NotImplementedError(
            "ScalarTrainer(backend='ane'): frozen parameters (requires_grad=False) are not "
            "supported; use backend='c'"
        )
    if clip_norm is not None:
        raise NotImplementedError(
            "ScalarTrainer(backend='ane'): clip_norm is not supported; use backend='c'"
        )
    if dtype is not None and str(dtype) not in ("float16", "float32"):
        raise TypeError(f"ScalarTrainer(backend='ane'): dtype must be float16/float32, got {dtype}")
    for k, x in enumerate(leaves):
        if x.dtype.name not in ("float16", "float32"):
            raise TypeError(
                f"ScalarTrainer(backend='ane'): parameter {k} is {x.aval}; the ane backend "
                "trains float32 master weights"
            )


__all__ = ["AneStep", "check_ane_settings"]
