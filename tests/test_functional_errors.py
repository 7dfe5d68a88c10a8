"""Bad input to the public ops: errors name the op, the shapes, the dim and the caller's line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg


def z(*shape: int) -> sg.Tensor:
    return sg.zeros(shape)


SHAPE_ERRORS: list[tuple[str, Callable[[], Any], str]] = [
    ("conv2d channels", lambda: sg.conv2d(z(8, 3, 28, 28), z(16, 1, 3, 3)),
     "conv2d: input channels disagree: x is [8, 3, 28, 28], w is [16, 1, 3, 3] (3 != 1)"),
    ("conv2d rank", lambda: sg.conv2d(z(3, 28, 28), z(16, 3, 3, 3)), "conv2d: input must be [N, C, H, W], got [3, 28, 28]"),
    ("conv2d weight rank", lambda: sg.conv2d(z(1, 3, 8, 8), z(16, 3, 3)), "conv2d: weight must be [O, C, kh, kw]"),
    ("conv2d bias", lambda: sg.conv2d(z(1, 3, 8, 8), z(4, 3, 3, 3), z(3)), "conv2d: bias must be [4] for weight [4, 3, 3, 3], got [3]"),
    ("conv2d kernel too big", lambda: sg.conv2d(z(1, 1, 2, 2), z(1, 1, 3, 3)), "conv2d: kernel [3, 3] is larger than the padded input [2, 2]"),
    ("max_pool2d rank", lambda: sg.max_pool2d(z(4, 4), 2), "max_pool2d: input must be [N, C, H, W], got [4, 4]"),
    ("avg_pool2d too big", lambda: sg.avg_pool2d(z(1, 1, 2, 2), 5), "avg_pool2d: kernel [5, 5] is larger than the padded input [2, 2]"),
    ("einsum operands", lambda: sg.einsum("ij,jk", z(2, 3)), "einsum: spec 'ij,jk' names 2 operands, got 1"),
    ("einsum rank", lambda: sg.einsum("ij", z(2, 3, 4)), "einsum: operand 0 has shape [2, 3, 4] (rank 3) but 'ij' names 2 axes"),
    ("einsum sizes", lambda: sg.einsum("ij,jk", z(2, 3), z(4, 5)), "einsum: index 'j' is 3 in one operand and 4 in another ([2, 3] and [4, 5])"),
    ("einsum diagonal", lambda: sg.einsum("ii", z(2, 3)), "einsum: repeated index 'i' has sizes 2 and 3"),
    ("einsum letters", lambda: sg.einsum("i1", z(2, 3)), "einsum: invalid subscripts 'i1'"),
    ("einsum output", lambda: sg.einsum("ij->k", z(2, 3)), "einsum: output 'k' must name distinct letters"),
    ("einsum ellipsis out", lambda: sg.einsum("...i->i", z(2, 3)), "einsum: output 'i' must contain '...'"),
    ("matmul", lambda: z(2, 3) @ z(4, 5), "matmul: inner dimensions disagree: [2, 3] @ [4, 5] (3 != 4)"),
    ("concat rank", lambda: sg.concat([z(2, 3), z(3)]), "concat: all inputs need rank 2, got [2, 3], [3]"),
    ("concat dims", lambda: sg.concat([z(2, 3), z(2, 4)], axis=0), "concat: shapes [2, 3], [2, 4] differ outside axis 0"),
    ("concat axis", lambda: sg.concat([z(2, 3), z(2, 3)], axis=2), "concat: axis 2 is out of range for a rank-2 tensor"),
    ("stack", lambda: sg.stack([z(2, 3), z(3, 2)]), "stack: all inputs need the same shape, got [2, 3], [3, 2]"),
    ("pad pairs", lambda: sg.pad(z(2, 3, 4), ((1, 1), (2, 2))), "pad: pad_width ((1, 1), (2, 2)) needs 3 (before, after) pairs"),
    ("pad negative", lambda: sg.pad(z(2, 3), -1), "pad: negative pad_width -1 for [2, 3]"),
    ("slice axis", lambda: sg.slice(z(2, 3), 0, 1, axis=3), "slice: axis 3 is out of range"),
    ("embedding", lambda: sg.embedding(z(2, 3, 4), [0]), "embedding: table must be [V, D], got [2, 3, 4]"),
    ("cross_entropy labels", lambda: sg.cross_entropy(z(4, 3), sg.tensor([0, 1, 2])), "cross_entropy: integer labels must be [4] for logits [4, 3], got [3]"),
    ("cross_entropy targets", lambda: sg.cross_entropy(z(4, 3), z(4, 2)), "cross_entropy: float targets must match logits: [4, 2] vs [4, 3]"),
    ("cross_entropy logits", lambda: sg.cross_entropy(z(4), sg.tensor([0])), "cross_entropy: logits must be [b, c], got [4]"),
    ("mse", lambda: sg.mse(z(4, 1), z(4)), "mse: pred [4, 1] and target [4] differ"),
    ("hinge", lambda: sg.hinge(z(4), z(5)), "hinge: scores [4] and labels [5] differ"),
    ("layer_norm", lambda: sg.layer_norm(z(2, 8), z(4)), "layer_norm: weight must be [8] for x [2, 8] over axes (1,), got [4]"),
    ("zeros", lambda: sg.zeros((2, -1)), "zeros: negative dimension in shape [2, -1]"),
    ("add", lambda: z(2, 3) + z(3, 2), "add: cannot broadcast [2, 3] and [3, 2]: dimension -2 is 2 vs 3"),
]  # fmt: skip


@pytest.mark.parametrize("name, thunk, message", SHAPE_ERRORS, ids=[e[0] for e in SHAPE_ERRORS])
def test_shape_error_names_op_shapes_and_caller(
    name: str, thunk: Callable[[], Any], message: str
) -> None:
    with pytest.raises(sg.ShapeError) as info:
        thunk()
    text = str(info.value)
    assert message in text, text
    assert "test_functional_errors.py:" in text, f"no caller location in: {text}"


OTHER_ERRORS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("take dtype", lambda: sg.take(z(3), sg.tensor([0.0])), sg.DTypeError, "take: indices must be int32, got float32"),
    ("take range", lambda: sg.take(z(3), [3]), IndexError, r"gather: index out of range \[-3, 3\)"),
    ("cross_entropy range", lambda: sg.cross_entropy(z(2, 3), sg.tensor([0, 3])), IndexError, r"labels must lie in \[0, 3\)"),
    ("cross_entropy dtype", lambda: sg.cross_entropy(z(2, 3), sg.tensor([True, False])), sg.DTypeError, "labels must be int32 or float, got bool"),
    ("einsum dtypes", lambda: sg.einsum("i,i", z(2), sg.zeros(2, "float64")), sg.DTypeError, "einsum: operands must share one dtype"),
    ("dropout p", lambda: sg.dropout(z(3), 1.5, seed=0), ValueError, r"dropout: probability must be in \[0, 1\], got 1.5"),
    ("arange step", lambda: sg.arange(0, 3, 0), ValueError, "arange: step must not be zero"),
    ("pad mode", lambda: sg.pad(z(3), 1, mode="reflect"), ValueError, "only mode='constant'"),
    ("pool padding", lambda: sg.max_pool2d(z(1, 1, 4, 4), 2, padding=2), ValueError, r"padding \(2, 2\) must be at most half the kernel"),
    ("conv stride", lambda: sg.conv2d(z(1, 1, 4, 4), z(1, 1, 2, 2), stride=0), ValueError, "conv2d: stride must be an int >= 1"),
    ("conv2d dtypes", lambda: sg.conv2d(z(1, 1, 4, 4), sg.zeros((1, 1, 2, 2), "float64")), sg.DTypeError, "conv2d: x is float32 but w is float64"),
    ("matmul dtypes", lambda: z(2, 3) @ sg.zeros((3, 2), "float64"), sg.DTypeError, "matmul: operands are float32 and float64"),
    ("slice step", lambda: sg.slice(z(4), 0, 4, 0), ValueError, "slice: step must be positive"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, thunk, kind, pattern", OTHER_ERRORS, ids=[e[0] for e in OTHER_ERRORS]
)
def test_other_errors_are_clear(
    name: str, thunk: Callable[[], Any], kind: type[Exception], pattern: str
) -> None:
    with pytest.raises(kind, match=pattern):
        thunk()


@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("bad", [3, 5, -1, -3, -4, 2**31 - 1, -(2**31)])
def test_compiled_cross_entropy_out_of_range_label_raises_like_eager(
    backend: str, bad: int
) -> None:
    """Compiled code raises the eager IndexError (through the error-flag contract), not NaN."""
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    logits = np.zeros((2, 3), np.float32)
    fn = sg.compile(sg.value_and_grad(lambda x, y: sg.cross_entropy(x, y)), backend=backend)
    with pytest.raises(IndexError, match=r"cross_entropy: labels must lie in \[0, 3\)"):
        fn(logits, np.array([1, bad], np.int32))
    value, _ = fn(logits, np.array([1, 2], np.int32))
    assert value.item() == pytest.approx(np.log(3.0))
