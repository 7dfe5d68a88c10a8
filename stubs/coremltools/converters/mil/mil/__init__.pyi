from collections.abc import Callable
from typing import Any, TypeVar

from coremltools.converters.mil.mil import types as types

_F = TypeVar("_F", bound=Callable[..., Any])

class Var:
    name: str
    shape: tuple[int, ...]
    dtype: type
    val: Any
    op: Any
    rank: int

class Function:
    inputs: dict[str, Var]
    outputs: list[Var]
    operations: list[Any]

class Program:
    functions: dict[str, Function]
    def __init__(self) -> None: ...

class _BuilderMeta(type):
    # Ops are class attributes added at import (`mb.add(x=..., y=...)`), one per MIL op.
    def __getattr__(cls, name: str) -> Callable[..., Var]: ...

class Builder(metaclass=_BuilderMeta):
    @staticmethod
    def program(
        input_specs: list[Any] | None = None,
        opset_version: Any = None,
        function_name: str = "main",
    ) -> Callable[[_F], Program]: ...
    @staticmethod
    def TensorSpec(shape: tuple[int, ...], dtype: type | None = None) -> Any: ...

def __getattr__(name: str) -> Any: ...
