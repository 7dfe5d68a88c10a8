"""A run's recipe in its checkpoints: resume only what the same settings would continue.

A *recipe* is a JSON-able dict of whatever determines a run's numbers beyond the
parameters: optimizer and learning rate, schedule, batch size, seed, model, data. Saved
with ``trainer.save_checkpoint(path, {"recipe": recipe})`` and compared by
:func:`resume`, it stops a checkpoint from silently continuing under other settings
(an AdamW run resumed under Adam, another batch size that miscounts the epochs).

Example:
    >>> trainer.save_checkpoint("run.npz", {"recipe": {"batch_size": 64, "seed": 0}})
    >>> resume(trainer, "run.npz", {"batch_size": 32, "seed": 0})
    RecipeMismatch: run.npz was written with another recipe: batch_size 64 (this run: 32) ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shapegrad.io import CheckpointError, load_checkpoint
from shapegrad.train.trainer import ScalarTrainer


class RecipeMismatch(CheckpointError):
    """A checkpoint written with another recipe, resumed without an override."""


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` restored.

    Attributes:
        step: the checkpoint's step (now the trainer's ``global_step``).
        differences: the recipe differences that were overridden (empty: none).
        fresh_optimizer: the checkpoint's optimizer name when its state was *not* restored
            (another optimizer type, overridden), else None.
        notes: the checkpoint's user metadata (``recipe``, ``optimizer``...).
    """

    step: int
    differences: list[str]
    fresh_optimizer: str | None
    notes: dict[str, Any]


def recipe_differences(
    saved: Any, now: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> list[str]:
    """``["batch_size 50 (this run: 64)", ...]``: where ``saved`` differs from ``now``
    (``labels`` renames keys for people, e.g. ``{"batch_size": "--batch-size"}``)."""
    if not isinstance(saved, dict):
        return ["it records no recipe"]
    names = labels or {}
    return [
        f"{names.get(key, key)} {saved.get(key, 'unrecorded')} (this run: {value})"
        for key, value in now.items()
        if saved.get(key) != value
    ]


def resume(
    trainer: ScalarTrainer,
    path: str | Path,
    recipe: Mapping[str, Any],
    *,
    override: bool = False,
    labels: Mapping[str, str] | None = None,
    how_to_override: str = "pass override=True to resume it anyway",
) -> Resumed:
    """Restore ``path`` into ``trainer`` if its recorded recipe equals ``recipe``.

    With the same optimizer type the whole state is restored through
    ``trainer.load_checkpoint`` (optimizer state, loss scale, random keys, validated);
    with another one (only under ``override``) the parameters and the step, and the
    optimizer starts from a fresh state.

    Raises:
        RecipeMismatch: the recipes differ (or the checkpoint has none) and ``override``
            is False; one line naming each difference and ``how_to_override``.
        CheckpointError: the file is unreadable or holds other parameters.
    """
    first = load_checkpoint(path, trainer.get_params())  # parameters and metadata only
    notes = dict(first.metadata.get("user", {}))
    differences = recipe_differences(notes.get("recipe"), recipe, labels)
    if differences and not override:
        raise RecipeMismatch(
            f"{path} was written with another recipe: {'; '.join(differences)}. Run with the "
            f"checkpoint's settings, or {how_to_override}"
        )
    saved_optimizer = notes.get("optimizer")
    if saved_optimizer == type(trainer.optimizer).__name__:
        trainer.load_checkpoint(path)
        return Resumed(first.step, differences, None, notes)
    trainer.set_params(first.params)  # another optimizer's state would not fit this one
    trainer.reset_optimizer_state()
    trainer.global_step = first.step
    return Resumed(first.step, differences, str(saved_optimizer or "unrecorded"), notes)


__all__ = ["RecipeMismatch", "Resumed", "recipe_differences", "resume"]
