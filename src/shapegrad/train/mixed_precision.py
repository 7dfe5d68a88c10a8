"""Dynamic loss scaling for float16 training, written against Tensor (so it compiles).

The state is three 0-d tensors: ``scale`` (float32, starts at 2**15),
``good`` (int32, finite steps in a row) and ``skipped`` (int32, steps
thrown away). After each backward pass:

* all gradients finite: the update is applied; after ``window`` finite steps
  in a row the scale doubles;
* any gradient Inf/NaN (the scaled float16 backward overflowed): the update is
  *not* applied (parameters and optimizer state keep their old values), the
  scale halves and ``skipped`` counts it.

The decision is a ``where`` on a boolean scalar, so it runs in the compiled
step without any Python control flow on traced values.

:class:`LossScalePolicy` is the ONE statement of this rule (scale bounds,
growth window, skip-on-overflow). The compiled float16 step traces it; the
Neural Engine trainer (:mod:`shapegrad.train.ane`), whose update runs on the
host, evaluates the very same function eagerly on 0-d tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad.dtypes import int32
from shapegrad.functional import where
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train import _checks
from shapegrad.train.optim import is_finite_all

ScalerState = dict[str, Tensor]

MIN_SCALE = 1.0  # never scale the loss below 1: that would only lose float16 range


def init_state(scale: float = 2.0**15) -> ScalerState:
    """A fresh loss-scale state.

    Args:
        scale: the initial loss scale (a power of two keeps scaling exact).
    Returns:
        ``{"scale": float32, "good": int32, "skipped": int32}`` eager 0-d tensors.
    """
    if not scale >= MIN_SCALE:
        raise ValueError(f"loss scale must be >= {MIN_SCALE}, got {scale}")
    return {
        "scale": tensor(np.float32(scale)),
        "good": tensor(np.int32(0)),
        "skipped": tensor(np.int32(0)),
    }


@dataclass(frozen=True)
class LossScalePolicy:
    """Dynamic loss scaling: halve on overflow (and skip the step), double after a run of
    ``window`` finite steps, never leaving ``[min_scale, max_scale]``.

    Attributes:
        window: finite steps in a row before the scale doubles.
        min_scale: the scale never halves below this (1.0: below it only loses range).
        max_scale: the scale never doubles above this (``inf``: unbounded; a program that
            casts the scale to float16 needs ``2**15``, as ``2**16`` is inf there).
    """

    window: int = 2000
    min_scale: float = MIN_SCALE
    max_scale: float = math.inf

    def __post_init__(self) -> None:
        _checks.whole("LossScalePolicy", "window", self.window, 1)
        _checks.real("LossScalePolicy", "min_scale", self.min_scale, 0.0, low_open=True)
        if not self.max_scale >= self.min_scale:  # inf is allowed (unbounded), NaN is not
            raise ValueError(
                f"LossScalePolicy: max_scale must be >= min_scale ({self.min_scale}) or inf, "
                f"got {self.max_scale}"
            )

    def next_state(self, finite: Tensor, state: ScalerState) -> ScalerState:
        """The scale/counters after a step whose gradients were ``finite`` (bool 0-d tensor).

        Written against Tensor: traced inside a compiled step, or run eagerly on the host.
        """
        scale, good, skipped = state["scale"], state["good"], state["skipped"]
        streak = good + 1
        grow = streak >= self.window
        grown = where(grow, scale * 2.0, scale)
        if self.max_scale < math.inf:  # a trace-time decision: no op when unbounded
            top = p.full((), self.max_scale, scale.dtype, like=scale)
            grown = where(grown > top, top, grown)
        floor = p.full((), self.min_scale, scale.dtype, like=scale)
        shrunk = where(scale * 0.5 < floor, floor, scale * 0.5)
        zero = p.zeros_like(good)
        return {
            "scale": where(finite, grown, shrunk),
            "good": where(finite, where(grow, zero, streak), zero),
            "skipped": skipped + (1 - p.cast(finite, int32)),
        }

    def apply_or_skip(
        self,
        grads: Sequence[Tensor],
        old: tuple[Any, Any],
        new: tuple[Any, Any],
        state: ScalerState,
        loss: Tensor,
    ) -> tuple[Tensor, Any, Any, ScalerState]:
        """Keep ``new`` (params, opt_state) when ``grads`` are finite, else ``old``.

        Returns:
            ``(loss, params, opt_state, new_scaler_state)``.
        """
        finite = is_finite_all(grads)
        params = select_tree(finite, new[0], old[0])
        opt_state = select_tree(finite, new[1], old[1])
        return loss, params, opt_state, self.next_state(finite, state)


def next_state(finite: Tensor, state: ScalerState, window: int) -> ScalerState:
    """``LossScalePolicy(window).next_state(finite, state)``."""
    return LossScalePolicy(window).next_state(finite, state)


def select_tree(condition: Tensor, new: Any, old: Any) -> Any:
    """Leaf-wise ``where(condition, new, old)`` over two trees of the same structure."""
    new_leaves, treedef = tree.flatten(new)
    old_leaves, _ = tree.flatten(old)
    chosen = [
        a if a is b else where(condition, a, b) for a, b in zip(new_leaves, old_leaves, strict=True)
    ]
    return tree.unflatten(treedef, chosen)


def apply_or_skip(
    grads: Sequence[Tensor],
    old: tuple[Any, Any],
    new: tuple[Any, Any],
    state: ScalerState,
    loss: Tensor,
    window: int,
) -> tuple[Tensor, Any, Any, ScalerState]:
    """``LossScalePolicy(window).apply_or_skip(grads, old, new, state, loss)``."""
    return LossScalePolicy(window).apply_or_skip(grads, old, new, state, loss)


__all__ = [
    "MIN_SCALE",
    "LossScalePolicy",
    "ScalerState",
    "apply_or_skip",
    "init_state",
    "next_state",
    "select_tree",
]
