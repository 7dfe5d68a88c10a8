"""Normalisation layers as typed modules: LayerNorm, BatchNorm, GroupNorm.

Each has a gain ``weight`` (initialised to one) and a ``bias`` (zero) over the
channel dim ``c``; BatchNorm also has ``running_mean``/``running_var`` state
fields (non-trainable: optimizers leave them alone, checkpoints save them).
Name the channel dim from an enclosing module with ``field(dims={"c": "h"})``.

BatchNorm is pure: ``y, bn = bn(x, training=True)`` returns the module with its
running statistics updated (eval mode returns ``self``). The update is also recorded in
the active ``sg.nn.state_updates()`` collector, which ScalarTrainer opens around the
loss: there ``y, _ = self.bn(x, training=True)`` is enough, the trainer keeps the new
statistics (no ``replace`` up through the enclosing modules).

Example:
    >>> bn = sg.nn.BatchNorm.init(c=16)
    >>> y, bn = bn(x, training=True)        # x: [N, 16, H, W]
    >>> y_eval, _ = bn(x, training=False)
"""

from __future__ import annotations

from jaxtyping import Float

from shapegrad import functional as F
from shapegrad._norms import batch_norm, group_norm
from shapegrad.nn import init
from shapegrad.nn._module import Module, field
from shapegrad.tensor import Tensor

__all__ = ["BatchNorm", "GroupNorm", "LayerNorm"]


class LayerNorm(Module):
    """Layer normalisation over the last axis (size ``c``)."""

    weight: Float[Tensor, " c"] = field(role="gain")
    bias: Float[Tensor, " c"] = field(role="bias")
    eps: float = 1e-5

    def __call__(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, eps=self.eps)


class BatchNorm(Module):
    """Batch normalisation over ``[N, c, *spatial]`` (``BatchNorm1d/2d/3d`` in one)."""

    weight: Float[Tensor, " c"] = field(role="gain")
    bias: Float[Tensor, " c"] = field(role="bias")
    running_mean: Float[Tensor, " c"] = field(role="state", init=init.zeros)
    running_var: Float[Tensor, " c"] = field(role="state", init=init.ones)
    momentum: float = 0.1
    eps: float = 1e-5

    def __call__(self, x: Tensor, training: bool) -> tuple[Tensor, BatchNorm]:
        """``(y, updated module)``; in eval mode the module is returned unchanged."""
        y, mean, var = batch_norm(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            training=training,
            momentum=self.momentum,
            eps=self.eps,
        )
        if not training:
            return y, self
        return y, self.with_state(running_mean=mean, running_var=var)


class GroupNorm(Module):
    """Group normalisation over ``[N, c, *spatial]`` with ``groups`` groups.

    Set the group count by subclassing (``class GN8(GroupNorm): groups: int = 8``)
    or with ``.replace(groups=...)``.
    """

    weight: Float[Tensor, " c"] = field(role="gain")
    bias: Float[Tensor, " c"] = field(role="bias")
    groups: int = 1
    eps: float = 1e-5

    def __call__(self, x: Tensor) -> Tensor:
        return group_norm(x, self.groups, self.weight, self.bias, eps=self.eps)
