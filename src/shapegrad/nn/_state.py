"""Updated module state (batch-norm running statistics) collected where it is computed.

A stateful layer returns its updated copy (modules are immutable) *and* records it in
the innermost active :func:`state_updates` collector, so a model need not thread the
copy back up through every enclosing module by hand. ``ScalarTrainer`` opens one around
the loss: a loss that returns only the scalar still updates every recorded module's
state (its non-trainable leaves), as PyTorch's in-place buffers do.

    >>> with sg.nn.state_updates() as updates:
    ...     y, _ = model.bn(x, training=True)      # the returned copy may be ignored
    >>> model = updates.apply(model)               # model.bn's running stats updated

Modules are matched by the identity of their tensors in the tree given to ``apply``,
so record only modules that are part of it: a module sliced inside an ``sg.scan``
body or built inside the loss has no leaves there, and ``apply`` says so (an error,
never a silent no-op). When one module records twice, the last update wins.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shapegrad import tree

__all__ = ["StateUpdates", "record_state", "state_updates"]

_ACTIVE: contextvars.ContextVar[tuple[StateUpdates, ...]] = contextvars.ContextVar(
    "shapegrad_state_updates", default=()
)


class StateUpdates:
    """Recorded ``(old module, updated module)`` pairs; :meth:`apply` puts them in a tree."""

    def __init__(self) -> None:
        self._updates: dict[int, tuple[Any, Any]] = {}

    def record(self, old: Any, new: Any) -> None:
        self._updates[id(old)] = (old, new)  # keyed by identity: modules are immutable

    def __len__(self) -> int:
        return len(self._updates)

    def apply(self, params: Any) -> Any:
        """``params`` with each recorded module's changed leaves replaced by the new ones."""
        replacements: dict[int, Any] = {}
        for old, new in self._updates.values():
            old_leaves, old_def = tree.flatten(old)
            new_leaves, new_def = tree.flatten(new)
            if old_def.signature() != new_def.signature():
                raise TypeError(
                    f"state_updates: the update of a {type(old).__name__} changed its structure"
                )
            for a, b in zip(old_leaves, new_leaves, strict=True):
                if a is not b:
                    replacements[id(a)] = b
        leaves, treedef = tree.flatten(params)
        found = {id(x) for x in leaves} & replacements.keys()
        if len(found) != len(replacements):
            kinds = sorted({type(old).__name__ for old, _ in self._updates.values()})
            raise ValueError(
                f"state_updates: {len(replacements) - len(found)} updated state tensor(s) of "
                f"{', '.join(kinds)} are not leaves of the parameters being updated; record "
                "only modules that are part of them (a module sliced inside sg.scan or built "
                "inside the loss cannot be updated this way: return (loss, new_params))"
            )
        return tree.unflatten(treedef, [replacements.get(id(x), x) for x in leaves])


@contextmanager
def state_updates() -> Iterator[StateUpdates]:
    """Collect the state updates that modules record while the block runs."""
    updates = StateUpdates()
    token = _ACTIVE.set((*_ACTIVE.get(), updates))
    try:
        yield updates
    finally:
        _ACTIVE.reset(token)


def record_state(old: Any, new: Any) -> None:
    """Record ``new`` as the updated ``old`` in the innermost collector (none: nothing)."""
    active = _ACTIVE.get()
    if active:
        active[-1].record(old, new)
