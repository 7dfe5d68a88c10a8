"""Layers as pure functions over tensors and ParamLists (no hidden state).

Weights follow PyTorch's layout: a linear weight is ``[out, in]``.

Example:
    >>> class MLP(sg.ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"],
    ...                        Float[Tensor, "2 h"], Float[Tensor, "2"]]):
    ...     names = ("w1", "b1", "w2", "b2")
    >>> params = MLP.init(sg.nn.init.kaiming, seed=0, h=16)
    >>> logits = sg.nn.mlp(params, x)            # x: [batch, 2] -> [batch, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxtyping import Float

from shapegrad import functional as F
from shapegrad.nn._module import Module
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["Linear", "linear", "mlp"]


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x @ w.T + b`` for ``x: [..., in]``, ``w: [out, in]``, ``b: [out]``.

    Example:
        >>> sg.nn.linear(sg.tensor([[1.0, 2.0]]), sg.tensor([[3.0, 4.0]])).tolist()
        [[11.0]]
    """
    if w.ndim != 2 or not x.ndim or x.shape[-1] != w.shape[1]:
        raise ShapeError(
            "linear",
            f"input {fmt(x.shape)} needs a weight [out, {x.shape[-1] if x.ndim else '?'}], "
            f"got {fmt(w.shape)}",
        )
    y = F.matmul(x, w.T)
    if b is None:
        return y
    if b.shape != (w.shape[0],):
        raise ShapeError("linear", f"bias {fmt(b.shape)} should be [{w.shape[0]}]")
    return y + b


def mlp(
    params: Sequence[Tensor],
    x: Tensor,
    activation: Callable[[Tensor], Tensor] = F.relu,
) -> Tensor:
    """A multi-layer perceptron over ``params = (w1, b1, w2, b2, ...)``.

    ``activation`` is applied between layers, not after the last one.
    """
    if len(params) % 2 or not params:
        raise ValueError(f"mlp: params must be (weight, bias) pairs, got {len(params)} tensors")
    h = x
    layers = len(params) // 2
    for i in range(layers):
        h = linear(h, params[2 * i], params[2 * i + 1])
        if i + 1 < layers:
            h = activation(h)
    return h


class Linear(Module):
    """``x @ w.T + b`` as a module: ``w: [d_out, d_in]`` (std 1/sqrt(d_in)), ``b: [d_out]`` (zeros).

    Example:
        >>> layer = sg.nn.Linear.init(d_in=784, d_out=10)
        >>> layer(x).shape                     # x: [b, 784]
        (b, 10)
    """

    w: Float[Tensor, "d_out d_in"]
    b: Float[Tensor, " d_out"]

    def __call__(self, x: Tensor) -> Tensor:
        return linear(x, self.w, self.b)
