"""The eight tensor element types and the promotion rule.

shapegrad does not promote silently between tensors: ``a + b`` with
``a.dtype != b.dtype`` is a :class:`DTypeError` (int32 with int64 included); cast
explicitly with ``x.astype(sg.float64)``. Python scalars are *weak*: ``x * 2`` takes the
dtype of ``x`` (and must fit it). Comparisons return ``bool``.

Integers: ``int32`` is the default (Python ints, NumPy int64 arrays passed without a
dtype, indices, labels); it never wraps silently where a value enters (a constant, an
index, a sum: :class:`Int32OverflowError`). ``int64`` is asked for by name
(``sg.tensor(a, dtype=sg.int64)``, ``x.long()``, ``sg.arange(..., dtype=sg.int64)``,
``argmax(..., dtype=sg.int64)``): indices and counts beyond 2**31; its arithmetic and
sums wrap at 2**64 like NumPy's and PyTorch's (no overflow check: a check would need
wider arithmetic than the sum itself, and the range is out of reach of counts and
indices). ``uint8`` is images and byte masks (NumPy uint8 arrays keep it): casts,
comparisons, max/min and elementwise arithmetic, which wraps modulo 256 like NumPy's and
PyTorch's; ``sum``/``cumsum`` refuse it (a total would wrap at 256: cast first).

``bfloat16`` (8 exponent bits like float32, 8 significand bits) is stored as 16 bits and
computed in float32 everywhere, each op's result rounded to bfloat16 (to nearest, ties to
even): eager through ``ml_dtypes``' NumPy type, compiled C and CUDA by converting at each
load and store (sums and products accumulate in float32); CUDA's products run on tensor
cores with float32 accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt

from shapegrad.shapes import describe_caller


@dataclass(frozen=True)
class DType:
    """An element type: its name and NumPy equivalent (renderers spell it in their language)."""

    name: str
    numpy: np.dtype[np.generic]
    is_float: bool

    # DTypes are singletons compared on every op: identity first, the name decides
    # (a copy made by pickle or deepcopy still equals the original).
    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, DType) and self.name == other.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"sg.{self.name}"

    def __str__(self) -> str:
        return self.name


float32: Final = DType("float32", np.dtype(np.float32), True)
float16: Final = DType("float16", np.dtype(np.float16), True)
float64: Final = DType("float64", np.dtype(np.float64), True)
bfloat16: Final = DType("bfloat16", np.dtype(ml_dtypes.bfloat16), True)
int32: Final = DType("int32", np.dtype(np.int32), False)
bool_: Final = DType("bool", np.dtype(np.bool_), False)
int64: Final = DType("int64", np.dtype(np.int64), False)
uint8: Final = DType("uint8", np.dtype(np.uint8), False)

ALL_DTYPES: Final = (float32, float16, float64, bfloat16, int32, bool_, int64, uint8)
INTEGER_DTYPES: Final = (int32, int64, uint8)
_BY_NAME: Final = {d.name: d for d in ALL_DTYPES} | {"bool_": bool_, "float": float32}


class DTypeError(TypeError):
    """Two operands of one op disagree in element type, or a dtype is unsupported."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}{describe_caller()}")


DTypeLike = DType | str | type | np.dtype[np.generic]


def as_dtype(value: DTypeLike) -> DType:
    """Normalise ``sg.float32``, ``"float32"``, ``np.float32`` or ``np.dtype`` to a :class:`DType`."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        if value in _BY_NAME:
            return _BY_NAME[value]
        raise DTypeError(f"unknown dtype {value!r}; expected one of {sorted(_BY_NAME)}")
    np_dtype = np.dtype(value)
    if np_dtype == np.dtype(np.bool_):
        return bool_
    for d in ALL_DTYPES:
        if d.numpy == np_dtype:
            return d
    raise DTypeError(
        f"unsupported dtype {np_dtype}; shapegrad supports {[d.name for d in ALL_DTYPES]}"
    )


def dtype_of_array(array: npt.NDArray[np.generic]) -> DType:
    """The shapegrad dtype of a NumPy array: uint8 stays uint8; other integers (int64
    included, as for Python ints) map to int32, checked to fit; ask for int64 by name."""
    kind = array.dtype.kind
    if kind == "u" and array.dtype.itemsize == 1:
        return uint8
    if kind == "i" or kind == "u":
        return int32
    if kind == "f" and array.dtype.itemsize == 8:
        return float64
    return as_dtype(array.dtype)


def infer_dtype(value: object) -> DType:
    """Dtype for ``sg.tensor(value)``: NumPy arrays keep theirs (int64 -> int32);
    Python floats and lists of them become float32, ints int32, bools bool."""
    if isinstance(value, np.ndarray | np.generic):
        return dtype_of_array(np.asarray(value))
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return float32
    return dtype_of_array(array)


_INT32: Final = np.dtype(np.int32)
# Value ranges of the integer dtypes, by NumPy dtype (what ``check_fits`` guards).
INTEGER_RANGES: Final[dict[np.dtype[Any], tuple[int, int]]] = {
    np.dtype(d.numpy): (int(np.iinfo(d.numpy).min), int(np.iinfo(d.numpy).max))  # type: ignore[type-var]
    for d in INTEGER_DTYPES
}


class IntegerOverflowError(OverflowError, IndexError):
    """An integer does not fit the integer dtype it is converted to (it would wrap).

    Both an OverflowError and an IndexError: converting it would silently wrap, and
    for an index or label that would read another row (2**32 + 1 -> 1).
    """


class Int32OverflowError(IntegerOverflowError):
    """An integer (an index, a label) does not fit in int32, shapegrad's default integer
    type (ask for ``sg.int64`` by name for bigger ones)."""


def int32_overflow(array: npt.NDArray[np.generic]) -> int | None:
    """The first value of integer ``array`` outside the int32 range, or None."""
    return _overflow(array, _INT32)


def _overflow(array: npt.NDArray[np.generic], dtype: np.dtype[np.generic]) -> int | None:
    """The first value of integer ``array`` outside ``dtype``'s range, or None."""
    if array.dtype.kind == "O" and array.size:  # Python ints beyond int64
        lo, hi = INTEGER_RANGES[dtype]
        ints = [v for v in array.flat if isinstance(v, int) and not lo <= v <= hi]
        return int(ints[0]) if ints else None
    if array.dtype.kind not in "iu" or array.size == 0 or np.can_cast(array.dtype, dtype):
        return None
    lo, hi = INTEGER_RANGES[dtype]
    values: Any = array
    bad = values > hi if array.dtype.kind == "u" else (values < lo) | (values > hi)
    return int(values[bad].flat[0]) if bad.any() else None


def check_fits(value: object, dtype: np.dtype[np.generic], what: str = "") -> None:
    """Raise :class:`IntegerOverflowError` (:class:`Int32OverflowError` for int32) when
    converting ``value`` to the integer ``dtype`` would wrap."""
    if dtype not in INTEGER_RANGES:
        return
    if isinstance(value, int) and not isinstance(value, bool):
        lo, hi = INTEGER_RANGES[dtype]
        bad: int | None = None if lo <= value <= hi else value
    else:
        source = value if isinstance(value, np.ndarray) else np.asarray(value)
        if source.dtype == dtype or source.dtype.kind not in "iuO":  # the common case
            return
        bad = _overflow(source, dtype)
    if bad is not None:
        lo, hi = INTEGER_RANGES[dtype]
        error = Int32OverflowError if dtype == _INT32 else IntegerOverflowError
        hint = "; use sg.int64 for bigger integers" if dtype == _INT32 else ""
        raise error(
            f"{what or 'tensor'}: integer {bad} does not fit in {dtype} ({lo}..{hi}); it would "
            f"wrap around{hint}{describe_caller()}"
        )


def to_numpy(
    value: object, dtype: np.dtype[np.generic], copy: bool = False, what: str = ""
) -> npt.NDArray[np.generic]:
    """``np.asarray(value, dtype)`` (a copy when ``copy``) that refuses to wrap integers.

    Raises:
        IntegerOverflowError: an integer does not fit ``dtype`` (the message names ``what``).
    """
    check_fits(value, dtype, what)
    return np.array(value, dtype=dtype, copy=True) if copy else np.asarray(value, dtype=dtype)
