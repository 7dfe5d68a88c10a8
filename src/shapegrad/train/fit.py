"""The ``ScalarTrainer.fit`` loop: epochs over batches, callbacks, a tqdm progress bar."""

from __future__ import annotations

import math
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


class _Throughput:
    """Examples per second over windows of about ``interval`` seconds."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.rate = 0.0
        self._count = 0
        self._since = time.perf_counter()
        self._first = True

    def add(self, examples: int) -> bool:
        """Count ``examples``; True when a new rate was computed (time to refresh a display)."""
        self._count += examples
        now = time.perf_counter()
        elapsed = now - self._since
        if not (self._first or elapsed >= self.interval):
            return False
        self.rate = self._count / max(elapsed, 1e-9)
        self._count, self._since, self._first = 0, now, False
        return True


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
    if getattr(trainer, "mode", "") == "compiled":
        # The first step compiles (tenths of a second to seconds): say so, and keep it out of
        # the rate and the ETA, which would otherwise extrapolate the compile time.
        bar.set_description_str("compiling…")
    meter = _Throughput()
    start = time.perf_counter()
    losses: list[float] = []
    steady = _Steady()
    epoch, loss = 0, math.nan
    try:
        for epoch in range(epochs):
            losses = []
            for raw in _epoch_batches(batches, epoch):
                batch = _as_tuple(raw)
                loss = trainer.step(*batch)
                lr = trainer.last_lr  # reported by the step itself: no extra schedule evaluation
                losses.append(loss)
                history.loss.append(loss)
                history.lr.append(lr)
                examples = _batch_size(batch)
                if steady.add(examples):  # the first step (compile included) just ended
                    _restart_clock(bar)
                else:
                    bar.update(1)
                if meter.add(examples):  # refresh the text a few times a second only
                    bar.set_postfix(
                        epoch=epoch + 1,
                        loss=f"{loss:.4f}",
                        ex_s=f"{meter.rate:,.0f}",
                        refresh=False,
                    )
                info = StepInfo(epoch, trainer.global_step, loss, lr, meter.rate)
                for callback in callbacks:
                    callback(trainer, info)
            history.epoch_loss.append(sum(losses) / max(len(losses), 1))
    except StopTraining:
        if losses:
            history.epoch_loss.append(sum(losses) / len(losses))
    finally:
        if history.loss:  # the final state: last epoch, last loss, mean rate after compiling
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{loss:.4f}", ex_s=f"{steady.rate():,.0f}", refresh=False
            )
        bar.close()
        history.seconds = time.perf_counter() - start
    return history


class _Steady:
    """Examples per second after the first step (which may include compilation)."""

    def __init__(self) -> None:
        self.steps = 0
        self.examples = 0
        self.since = 0.0
        self.first_examples = 0
        self.first_seconds = 0.0
        self._start = time.perf_counter()

    def add(self, examples: int) -> bool:
        """Count one step; True for the first step."""
        self.steps += 1
        if self.steps == 1:
            self.since = time.perf_counter()
            self.first_examples, self.first_seconds = examples, self.since - self._start
            return True
        self.examples += examples
        return False

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.since
        if self.steps <= 1 or elapsed <= 0:  # one step only: all we have is its time
            return self.first_examples / max(self.first_seconds, 1e-9)
        return self.examples / elapsed


def _restart_clock(bar: Any) -> None:
    """Show the first step as done and start tqdm's clock (rate, ETA) from now."""
    if getattr(bar, "disable", True):
        return
    bar.set_description_str("", refresh=False)
    bar.reset(total=bar.total)  # n = 0, the clock and the smoothed rate restart now
    bar.n = bar.last_print_n = bar.initial = 1  # tqdm's rate counts n - initial
    bar.refresh()


__all__ = ["History", "StepInfo", "StopTraining", "run_fit"]
