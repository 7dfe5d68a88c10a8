"""The pure functions of one training step, traced by ``sg.compile`` in compiled mode.

``train_step(plan, optimizer, params, opt_state, scaler, lr, inputs)`` does the
forward pass, the backward pass (only for trainable leaves), optional
gradient clipping, the learning-rate schedule, the optimizer update and the
float16 loss-scale bookkeeping, using Tensor operations only. ``StepPlan``
holds the static settings it closes over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shapegrad import tree
from shapegrad.autodiff import value_and_grad
from shapegrad.dtypes import DType, float16
from shapegrad.ops import prims as p
from shapegrad.tensor import Tensor
from shapegrad.train import mixed_precision as mp
from shapegrad.train.optim import Optimizer, OptState, clip_by_global_norm
from shapegrad.train.schedules import Schedule

LossFn = Callable[..., Tensor]


@dataclass(frozen=True)
class StepPlan:
    """The static part of a training step: everything the traced function closes over."""

    loss_fn: LossFn
    treedef: tree.TreeDef
    flags: tuple[bool, ...]
    master: DType
    compute: DType
    clip_norm: float | None
    schedule: Schedule | None
    scaling: mp.LossScalePolicy  # float16 only: the dynamic loss-scale rule

    @property
    def trainable(self) -> list[int]:
        return [i for i, f in enumerate(self.flags) if f]

    @property
    def fp16(self) -> bool:
        return self.compute == float16


# --- the pure step functions (traced by sg.compile in compiled mode) ----------------------


def _compute_params(plan: StepPlan, leaves: Sequence[Tensor]) -> Any:
    """Parameters as the loss sees them: float leaves cast to the compute dtype."""
    cast = [p.cast(x, plan.compute) if x.dtype.is_float else x for x in leaves]
    return tree.unflatten(plan.treedef, cast)


def loss_value(plan: StepPlan, params: Any, inputs: tuple[Any, ...]) -> Tensor:
    """The loss in the master dtype (a fp16 loss is upcast before scaling and reporting)."""
    leaves, _ = tree.flatten(params)
    value = plan.loss_fn(_compute_params(plan, leaves), *inputs)
    if not isinstance(value, Tensor) or value.size != 1:
        shown = getattr(value, "shape", type(value).__name__)
        raise TypeError(
            f"ScalarTrainer: the loss function must return a scalar Tensor, got {shown}"
        )
    return p.cast(p.reshape(value, ()), plan.master)


def loss_and_grads(
    plan: StepPlan, params: Any, inputs: tuple[Any, ...], scale: Tensor | None
) -> tuple[Tensor, list[Tensor]]:
    """Loss and the (unscaled) gradients of the trainable leaves, in the master dtype."""
    leaves, _ = tree.flatten(params)
    index = plan.trainable

    def objective(trainable: list[Tensor]) -> tuple[Tensor, Tensor]:
        merged = list(leaves)
        for k, i in enumerate(index):
            merged[i] = trainable[k]
        loss = loss_value(plan, tree.unflatten(plan.treedef, merged), inputs)
        return (loss * scale if scale is not None else loss), loss

    (_, loss), grads = value_and_grad(objective, has_aux=True)([leaves[i] for i in index])
    if scale is not None:
        grads = [g / p.cast(scale, g.dtype) for g in grads]
    return loss, list(grads)


def full_grads(plan: StepPlan, params: Any, trainable: Sequence[Tensor]) -> Any:
    """Gradients shaped like ``params``: the computed ones, zeros for frozen leaves."""
    leaves, _ = tree.flatten(params)
    out = [p.zeros_like(x) for x in leaves]
    for k, i in enumerate(plan.trainable):
        out[i] = trainable[k]
    return tree.unflatten(plan.treedef, out)


def train_step(
    plan: StepPlan,
    optimizer: Optimizer,
    params: Any,
    opt_state: OptState,
    scaler: dict[str, Tensor] | None,
    lr: Tensor | None,
    inputs: tuple[Any, ...],
) -> tuple[Tensor, Any, OptState, dict[str, Tensor] | None, Tensor]:
    """One update: ``(loss, new_params, new_opt_state, new_scaler_state, lr_used)``.

    The learning rate actually used comes back as an output so logging it costs nothing
    (no eager evaluation of the schedule outside the compiled step).
    """
    scale = scaler["scale"] if scaler is not None else None
    loss, grads = loss_and_grads(plan, params, inputs, scale)
    if plan.clip_norm is not None:
        grads = clip_by_global_norm(grads, plan.clip_norm)
    rate = lr
    if rate is None:
        if plan.schedule is None:
            raise ValueError("ScalarTrainer: no learning rate and no schedule")
        rate = plan.schedule(opt_state["step"], plan.master)
    new_params, new_state = optimizer.update(
        params, full_grads(plan, params, grads), opt_state, rate, requires_grad=plan.flags
    )
    if scaler is None:
        return loss, new_params, new_state, None, rate
    loss, new_params, new_state, new_scaler = plan.scaling.apply_or_skip(
        grads, (params, opt_state), (new_params, new_state), scaler, loss
    )
    return loss, new_params, new_state, new_scaler, rate


__all__ = ["LossFn", "StepPlan", "full_grads", "loss_and_grads", "loss_value", "train_step"]
