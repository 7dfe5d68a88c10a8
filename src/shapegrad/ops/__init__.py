"""Primitives, their interpreters and their VJP rules."""

from shapegrad.ops.protocol import AVal, Ops, Prim

__all__ = ["AVal", "Ops", "Prim"]
