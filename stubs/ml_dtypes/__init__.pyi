# The part of ml_dtypes shapegrad uses (its own annotations leave finfo untyped).
from typing import Any

bfloat16: type[Any]

class finfo:
    bits: int
    eps: Any
    max: Any
    min: Any
    tiny: Any
    def __init__(self, dtype: Any) -> None: ...

def __getattr__(name: str) -> Any: ...
