"""Shape helpers shared by every interpreter: broadcasting, axis normalisation and ShapeError.

Errors raised here name the op, the shapes involved, the dimension that
disagrees and the user's source line (the first stack frame outside
shapegrad and the runtime type-checking libraries).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

Shape = tuple[int, ...]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIPPED_LIBRARIES = (
    "jaxtyping",
    "beartype",
    "typeguard",
    f"{os.sep}typing.py",
    "contextlib.py",
    "functools.py",
)


def caller_location() -> str | None:
    """``file:line`` of the innermost frame that belongs to user code, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        inside_package = os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)
        skipped = any(lib in filename for lib in _SKIPPED_LIBRARIES) or filename.startswith(
            "<frozen"
        )
        if not inside_package and not skipped:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def describe_caller() -> str:
    """`` (at file:line)`` for error messages, or an empty string."""
    location = caller_location()
    return f" (at {location})" if location else ""


class ShapeError(ValueError):
    """Operand shapes are incompatible. The message names op, shapes, dim and call site."""

    def __init__(self, op: str, detail: str) -> None:
        self.op = op
        self.detail = detail
        self.location = caller_location()
        where = f" (at {self.location})" if self.location else ""
        super().__init__(f"{op}: {detail}{where}")


def fmt(shape: Sequence[int]) -> str:
    """Render a shape as ``[2, 3]`` (``[]`` for a scalar)."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    """NumPy broadcasting of ``shapes``; a disagreement raises ShapeError naming the dim."""
    rank = max((len(s) for s in shapes), default=0)
    result: list[int] = []
    for axis in range(rank):
        size = 1
        for s in shapes:
            offset = axis - (rank - len(s))
            if offset < 0:
                continue
            d = s[offset]
            if d == 1:
                continue
            if size not in (1, d):
                shown = " and ".join(fmt(x) for x in shapes)
                raise ShapeError(
                    op,
                    f"cannot broadcast {shown}: dimension {axis - rank} is {size} vs {d}",
                )
            size = d
        result.append(size)
    return tuple(result)


def normalize_axis(op: str, axis: int, rank: int) -> int:
    """Map a possibly negative axis into ``range(rank)``."""
    if not -rank <= axis < max(rank, 1) or (rank == 0 and axis not in (0, -1)):
        raise ShapeError(op, f"axis {axis} is out of range for a rank-{rank} tensor")
    return axis % rank if rank else 0


def normalize_axes(op: str, axis: int | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Axes to reduce over: all axes for None, sorted and de-duplicated otherwise."""
    if axis is None:
        return tuple(range(rank))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    normalized = sorted({normalize_axis(op, a, rank) for a in axes})
    if len(normalized) != len(axes):
        raise ShapeError(op, f"repeated axis in {axes}")
    return tuple(normalized)


def size_of(shape: Sequence[int]) -> int:
    """Number of elements of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


def resolve_reshape(op: str, old: Shape, new: Sequence[int]) -> Shape:
    """Fill in a single ``-1`` and check that the element counts agree."""
    new = tuple(int(d) for d in new)
    unknown = [i for i, d in enumerate(new) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in new):
        raise ShapeError(op, f"invalid target shape {fmt(new)}: at most one -1 and no negatives")
    total = size_of(old)
    if unknown:
        known = size_of([d for d in new if d != -1])
        if known == 0 or total % known:
            raise ShapeError(op, f"cannot reshape {fmt(old)} ({total} elements) into {fmt(new)}")
        new = tuple(total // known if d == -1 else d for d in new)
    if size_of(new) != total:
        raise ShapeError(
            op,
            f"cannot reshape {fmt(old)} ({total} elements) into {fmt(new)} ({size_of(new)} elements)",
        )
    return new
