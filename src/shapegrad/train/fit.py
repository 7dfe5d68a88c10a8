"""The ``ScalarTrainer.fit`` loop: epochs over batches, callbacks, a tqdm progress bar."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shapegrad.train.trainer import ScalarTrainer


class StopTraining(Exception):
    """Raise from a ``fit`` callback to end training after the current step."""


@dataclass(frozen=True)
class StepInfo:
    """What a callback sees after each step."""

    epoch: int
    step: int  # global step count after this step
    loss: float
    lr: float
    examples_per_second: float


@dataclass
class History:
    """Per-step losses and learning rates, per-epoch mean losses."""

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _batch_size(batch: tuple[Any, ...]) -> int:
    for x in batch:
        shape = getattr(x, "shape", None)
        if shape:
            return int(shape[0])
    return 1


def _as_tuple(batch: Any) -> tuple[Any, ...]:
    return tuple(batch) if isinstance(batch, tuple | list) else (batch,)


def _epoch_batches(
    batches: Iterable[Any] | Callable[[int], Iterable[Any]], epoch: int
) -> Iterable[Any]:
    return batches(epoch) if callable(batches) else batches


def _total_steps(
    batches: Iterable[Any] | Callable[[int], Iterable[Any]], epochs: int
) -> int | None:
    return len(batches) * epochs if isinstance(batches, Sized) and not callable(batches) else None


def run_fit(
    trainer: ScalarTrainer,
    batches: Iterable[Any] | Callable[[int], Iterable[Any]],
    epochs: int,
    callbacks: Sequence[Callable[[ScalarTrainer, StepInfo], Any]],
    progress: bool,
) -> History:
    """Implementation of :meth:`ScalarTrainer.fit` (see there)."""
    if epochs < 1:
        raise ValueError(f"fit: epochs must be >= 1, got {epochs}")
    if epochs > 1 and not callable(batches) and iter(batches) is batches:
        raise TypeError(
            "fit: `batches` is a one-shot iterator but epochs > 1; pass a re-iterable "
            "(a list or sg.data.Batches) or a function epoch -> batches"
        )
    from tqdm.auto import tqdm

    history = History()
    bar = tqdm(total=_total_steps(batches, epochs), disable=not progress, unit="step", leave=True)
    start = time.perf_counter()
    losses: list[float] = []
    try:
        for epoch in range(epochs):
            losses = []
            for raw in _epoch_batches(batches, epoch):
                batch = _as_tuple(raw)
                lr = trainer.current_lr()
                t0 = time.perf_counter()
                loss = trainer.step(*batch)
                rate = _batch_size(batch) / max(time.perf_counter() - t0, 1e-9)
                losses.append(loss)
                history.loss.append(loss)
                history.lr.append(lr)
                bar.update(1)
                bar.set_postfix(
                    epoch=epoch + 1, loss=f"{loss:.4f}", ex_s=f"{rate:,.0f}", refresh=False
                )
                info = StepInfo(epoch, trainer.global_step, loss, lr, rate)
                for callback in callbacks:
                    callback(trainer, info)
            history.epoch_loss.append(sum(losses) / max(len(losses), 1))
    except StopTraining:
        if losses:
            history.epoch_loss.append(sum(losses) / len(losses))
    finally:
        bar.close()
        history.seconds = time.perf_counter() - start
    return history


__all__ = ["History", "StepInfo", "StopTraining", "run_fit"]
