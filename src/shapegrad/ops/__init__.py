"""Primitives, their interpreters and their VJP rules."""

from shapegrad.ops.protocol import AVal, Prim

# ``Ops`` (the interpreter protocol) lives beside Tensor: ``shapegrad.tensor.Ops``.
__all__ = ["AVal", "Prim"]
