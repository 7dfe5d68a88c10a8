"""One call of a shapegrad op as the rules see it: arguments by name or position."""

from __future__ import annotations

from dataclasses import dataclass

from mypy.nodes import Expression
from mypy.types import Type

from .algebra import Operand
from .carrier import tuple_items
from .env import Env
from .literals import label

# NumPy spellings of the library's formals and the PyTorch aliases it also accepts.
TORCH_SPELLINGS = {"axis": "dim", "keepdims": "keepdim"}


@dataclass
class Call:
    """Arguments of a function or Tensor-method call, grouped per formal parameter.

    For a method, ``self_operand`` is the tensor the method is called on.
    """

    env: Env
    formals: list[str | None]
    args: list[list[Expression]]
    arg_types: list[list[Type]]
    self_operand: Operand | None = None
    self_label: str = ""

    def _slot(self, name: str, position: int) -> int | None:
        if name in self.formals:
            return self.formals.index(name)
        return position if position < len(self.formals) else None

    def expr(self, name: str, position: int) -> Expression | None:
        """The expression passed for a formal (by its name, else its position); for
        ``axis``/``keepdims``, the PyTorch spelling (``dim``/``keepdim``) when that formal
        took the argument instead."""
        slot = self._slot(name, position)
        if slot is not None and self.args[slot]:
            return self.args[slot][0]
        alias = TORCH_SPELLINGS.get(name)
        if alias is not None and alias in self.formals:
            given = self.args[self.formals.index(alias)]
            return given[0] if given else None
        return None

    def given(self, name: str, position: int) -> bool:
        return self.expr(name, position) is not None

    def operand(self, name: str, position: int) -> Operand | None:
        """The shaped tensor (or Python scalar) passed for a formal; None if unknown/absent."""
        slot = self._slot(name, position)
        if slot is None or not self.args[slot]:
            return None
        return self.env.operand(self.args[slot][0], self.arg_types[slot][0])

    def operands(self, name: str, position: int) -> list[Operand | None]:
        """All arguments matched to a ``*args`` formal."""
        slot = self._slot(name, position)
        if slot is None:
            return []
        return [
            self.env.operand(e, t)
            for e, t in zip(self.args[slot], self.arg_types[slot], strict=True)
        ]

    def all_exprs(self, name: str, position: int) -> list[Expression]:
        slot = self._slot(name, position)
        return [] if slot is None else list(self.args[slot])

    def tuple_operands(self, name: str, position: int) -> list[Operand | None] | None:
        """The tensors of a tuple/ParamList argument, item by item (``params[0]``, ...)."""
        slot = self._slot(name, position)
        if slot is None or not self.args[slot]:
            return None
        expr = self.args[slot][0]
        items = tuple_items(self.env.flow_type(expr, self.arg_types[slot][0]))
        if items is None:
            return None
        base = label(expr) or name
        return [_relabel(self.env.operand(None, t), f"{base}[{i}]") for i, t in enumerate(items)]


def _relabel(operand: Operand | None, text: str) -> Operand | None:
    return None if operand is None else Operand(text, operand.shape, operand.scalar)
