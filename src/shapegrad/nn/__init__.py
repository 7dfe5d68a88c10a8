"""Neural-network helpers: initializers (:mod:`shapegrad.nn.init`) and layers as pure functions."""

from shapegrad.nn import init
from shapegrad.nn.layers import linear, mlp

__all__ = ["init", "linear", "mlp"]
