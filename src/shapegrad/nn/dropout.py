"""``Dropout``: the functional :func:`shapegrad.dropout` as a layer with its probability.

A module holds no random state: each call takes an explicit key (``sg.random.key`` /
``fold_in``; a traced key in compiled code gives a new mask per step without retracing).

Example:
    >>> drop = sg.nn.Dropout(p=0.1)
    >>> y = drop(x, sg.random.fold_in(key, step))        # training
    >>> drop(x, key, training=False) is x                # evaluation: the identity
    True
"""

from __future__ import annotations

from shapegrad._creation import dropout
from shapegrad.nn._module import Module
from shapegrad.tensor import Tensor

__all__ = ["Dropout"]


class Dropout(Module):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``."""

    p: float = 0.5

    def __init__(self, p: float = 0.5) -> None:
        if not isinstance(p, int | float) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        super().__init__(p=float(p))

    def __call__(self, x: Tensor, key: int | Tensor, training: bool = True) -> Tensor:
        """``key``: an ``sg.random.key`` (or a Python int seed, baked into a compiled graph)."""
        return dropout(x, self.p, key, training=training)
