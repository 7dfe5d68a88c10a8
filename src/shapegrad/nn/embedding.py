"""``Embedding``: a lookup table of ``v`` rows of size ``d`` (``torch.nn.Embedding(v, d)``).

Example:
    >>> emb = sg.nn.Embedding.init(seed=0, v=65, d=32)
    >>> emb(sg.tensor([[1, 2, 3]], dtype="int32")).shape
    (1, 3, 32)
"""

from __future__ import annotations

from typing import Any

from jaxtyping import Float

from shapegrad import functional as F
from shapegrad.nn import init
from shapegrad.nn._module import Module, field
from shapegrad.tensor import Tensor

__all__ = ["Embedding"]


class Embedding(Module):
    """Rows of ``weight [v, d]`` for integer ids of any shape: ``ids.shape + [d]``.

    The table is drawn from N(0, 1), as PyTorch's is; ids outside ``[0, v)`` are an
    error (eagerly; an IndexError from compiled code).
    """

    weight: Float[Tensor, "v d"] = field(init=init.normal(1.0))

    def __call__(self, ids: Any) -> Tensor:
        return F.embedding(self.weight, ids)
