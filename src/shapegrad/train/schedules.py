"""Learning-rate schedules: pure functions from a step counter tensor to a learning-rate tensor.

Each schedule is a small frozen dataclass whose ``__call__`` is written
against Tensor, so it runs eagerly and is traced into a compiled training
step (the step counter is part of the optimizer state, so the learning rate
changes between calls without retracing). ``step`` counts the updates already
applied: the first update uses ``schedule(0)``.

Example:
    >>> sched = sg.schedules.CosineWithWarmup(lr=0.1, total_steps=1000, warmup_steps=100)
    >>> sched.value(0), sched.value(100)
    (0.001, 0.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shapegrad.dtypes import DTypeLike, as_dtype, float32, float64, int32
from shapegrad.functional import cos, maximum, minimum, where
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train import _checks


class Schedule(Protocol):
    """Anything mapping a step counter (int32 0-d tensor) to a 0-d learning-rate tensor."""

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor: ...


def _float_step(step: Tensor | int, dtype: DTypeLike) -> Tensor:
    if not isinstance(step, Tensor):
        step = tensor(np.int32(step))
    return p.cast(step, as_dtype(dtype))


class _Base:
    """Shared helpers: ``value(step)`` evaluates the schedule eagerly for plots/logs."""

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor:
        raise NotImplementedError

    def value(self, step: int) -> float:
        """The learning rate at ``step`` as a Python float (eager)."""
        return float(self(tensor(np.int32(step)), "float64"))

    def values(self, steps: int) -> list[float]:
        """The learning rates of the first ``steps`` updates."""
        return [self.value(k) for k in range(steps)]


@dataclass(frozen=True)
class Constant(_Base):
    """The same learning rate at every step."""

    lr: float

    def __post_init__(self) -> None:
        _checks.real("Constant", "lr", self.lr, 0.0)

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor:
        s = _float_step(step, dtype)
        return s * 0.0 + self.lr


@dataclass(frozen=True)
class LinearDecay(_Base):
    """From ``lr`` at step 0 linearly to ``final_lr`` at ``total_steps``, then constant."""

    lr: float
    total_steps: int
    final_lr: float = 0.0

    def __post_init__(self) -> None:
        _checks.real("LinearDecay", "lr", self.lr, 0.0)
        _checks.real("LinearDecay", "final_lr", self.final_lr, 0.0)
        _checks.whole("LinearDecay", "total_steps", self.total_steps, 1)

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor:
        fraction = minimum(_float_step(step, dtype) / float(self.total_steps), 1.0)
        return self.lr + (self.final_lr - self.lr) * fraction


@dataclass(frozen=True)
class CosineWithWarmup(_Base):
    """Linear warm-up over ``warmup_steps`` (from lr/warmup to lr), then half a cosine
    from ``lr`` down to ``final_lr`` at ``total_steps`` (constant afterwards)."""

    lr: float
    total_steps: int
    warmup_steps: int = 0
    final_lr: float = 0.0

    def __post_init__(self) -> None:
        _checks.real("CosineWithWarmup", "lr", self.lr, 0.0)
        _checks.real("CosineWithWarmup", "final_lr", self.final_lr, 0.0)
        _checks.whole("CosineWithWarmup", "total_steps", self.total_steps, 1)
        _checks.whole("CosineWithWarmup", "warmup_steps", self.warmup_steps, 0)
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError(
                f"CosineWithWarmup: need 0 <= warmup_steps < total_steps, got "
                f"warmup_steps={self.warmup_steps}, total_steps={self.total_steps}"
            )

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor:
        s = _float_step(step, dtype)
        span = float(self.total_steps - self.warmup_steps)
        progress = minimum(maximum(s - float(self.warmup_steps), 0.0) / span, 1.0)
        cosine = self.final_lr + 0.5 * (self.lr - self.final_lr) * (cos(progress * math.pi) + 1.0)
        if not self.warmup_steps:
            return cosine
        warm = self.lr * (s + 1.0) / float(self.warmup_steps)
        return where(s < float(self.warmup_steps), warm, cosine)


@dataclass(frozen=True)
class StepDecay(_Base):
    """``lr * gamma ** (step // step_size)``: multiply by ``gamma`` every ``step_size`` steps."""

    lr: float
    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        _checks.real("StepDecay", "lr", self.lr, 0.0)
        _checks.real("StepDecay", "gamma", self.gamma, 0.0, low_open=True)
        _checks.whole("StepDecay", "step_size", self.step_size, 1)

    def __call__(self, step: Tensor, dtype: DTypeLike = float32) -> Tensor:
        if not isinstance(step, Tensor):
            step = tensor(np.int32(step))
        # Integer division without a floor primitive: the count is >= 0, and a float->int32
        # cast truncates toward zero, which is floor here. Float64 keeps it exact.
        whole = p.cast(p.cast(step, float64) / float(self.step_size), int32)
        return self.lr * self.gamma ** p.cast(whole, as_dtype(dtype))


def constant(lr: float) -> Constant:
    """A constant schedule (see :class:`Constant`)."""
    return Constant(lr)


def linear_decay(lr: float, total_steps: int, final_lr: float = 0.0) -> LinearDecay:
    """A linear decay schedule (see :class:`LinearDecay`)."""
    return LinearDecay(lr, total_steps, final_lr)


def cosine_with_warmup(
    lr: float, total_steps: int, warmup_steps: int = 0, final_lr: float = 0.0
) -> CosineWithWarmup:
    """A cosine schedule with linear warm-up (see :class:`CosineWithWarmup`)."""
    return CosineWithWarmup(lr, total_steps, warmup_steps, final_lr)


def step_decay(lr: float, step_size: int, gamma: float = 0.1) -> StepDecay:
    """A step decay schedule (see :class:`StepDecay`)."""
    return StepDecay(lr, step_size, gamma)


def describe(schedule: Any) -> str:
    """A short human-readable description (used by progress bars and checkpoints)."""
    return repr(schedule)


__all__ = [
    "Constant",
    "CosineWithWarmup",
    "LinearDecay",
    "Schedule",
    "StepDecay",
    "constant",
    "cosine_with_warmup",
    "describe",
    "linear_decay",
    "step_decay",
]
