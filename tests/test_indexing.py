"""NumPy indexing (issue 14): random index expressions against NumPy, eager and compiled,
values and gradients (the gradient reference scatters the cotangent with np.add.at)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shapegrad as sg
from modes import _c_unavailable

SETTINGS = settings(max_examples=120, deadline=None)


@st.composite
def index_cases(draw: Any) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """A shape and a valid NumPy index: ints, slices (any step), None, one '...', int arrays."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    items: list[Any] = []
    axis = 0
    used_ellipsis = False
    array_shape = draw(st.sampled_from([(2,), (1,), (2, 1), (3,)]))
    while axis < len(shape):
        size = shape[axis]
        # After '...' the remaining items must index exactly the trailing axes: no early stop.
        kinds = ["int", "slice", "slice", "none", "array"] + ([] if used_ellipsis else ["ellipsis", "stop"])
        kind = draw(st.sampled_from(kinds))
        if kind == "stop":
            break
        if kind == "none":
            items.append(None)
            continue
        if kind == "ellipsis":
            if used_ellipsis:
                continue
            used_ellipsis = True
            items.append(Ellipsis)
            axis = len(shape) - draw(st.integers(0, len(shape) - axis))
            continue
        if kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-size - 1, size + 1))
            step = draw(st.one_of(st.none(), st.sampled_from([-3, -2, -1, 1, 2, 3])))
            items.append(slice(draw(bound), draw(bound), step))
        else:
            values = draw(st.lists(st.integers(-size, size - 1), min_size=int(np.prod(array_shape)),
                                   max_size=int(np.prod(array_shape))))
            items.append(np.asarray(values).reshape(array_shape))
        axis += 1
    return shape, tuple(items)


def _reference(shape: tuple[int, ...], index: tuple[Any, ...], ct_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a = np.random.default_rng(0).normal(size=shape)
    out = a[index]
    ct = np.random.default_rng(ct_seed).normal(size=out.shape)
    ids = np.arange(a.size).reshape(shape)[index]
    grad = np.zeros(a.size)
    np.add.at(grad, ids.ravel(), ct.ravel())
    return a, out, ct, grad.reshape(shape)


def _objective(index: tuple[Any, ...]) -> Any:
    return lambda x, ct: (x[index] * ct).sum()


@SETTINGS
@given(index_cases())
def test_eager_index_values_and_grads_match_numpy(case: tuple[tuple[int, ...], tuple[Any, ...]]) -> None:
    shape, index = case
    a, out, ct, grad = _reference(shape, index, 1)
    x = sg.tensor(a)
    np.testing.assert_array_equal(x[index].numpy(), out)
    np.testing.assert_allclose(sg.grad(_objective(index))(x, sg.tensor(ct)).numpy(), grad, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(index_cases())
def test_compiled_index_values_and_grads_match_numpy(case: tuple[tuple[int, ...], tuple[Any, ...]]) -> None:
    shape, index = case
    a, out, ct, grad = _reference(shape, index, 2)
    run = sg.compile(lambda x, c: (x[index], sg.grad(_objective(index))(x, c)), backend="numpy")
    value, g = run(sg.tensor(a), sg.tensor(ct))
    np.testing.assert_array_equal(value.numpy(), out)
    np.testing.assert_allclose(g.numpy(), grad, rtol=1e-12, atol=1e-12)


C_CASES = [
    ((2, 3, 4), (Ellipsis, slice(None, None, -1), 0)),
    ((4, 3), (None, slice(3, 0, -2), [2, -1])),
    ((3, 2, 4), ([0, 2, 2], slice(None), [1, -1, 0])),
    ((2, 3, 4), (slice(None), [[1], [0]], [0, 2])),
    ((5,), (slice(-1, None, -2),)),
]


@pytest.mark.skipif(_c_unavailable() is not None, reason=_c_unavailable() or "")
@pytest.mark.parametrize("case", C_CASES, ids=[str(i) for i in range(len(C_CASES))])
def test_c_index_values_and_grads_match_numpy(case: tuple[tuple[int, ...], tuple[Any, ...]]) -> None:
    shape, index = case
    a, out, ct, grad = _reference(shape, index, 3)
    run = sg.compile(lambda x, c: (x[index], sg.grad(_objective(index))(x, c)), backend="c")
    value, g = run(sg.tensor(a), sg.tensor(ct))
    np.testing.assert_array_equal(value.numpy(), out)
    np.testing.assert_allclose(g.numpy(), grad, rtol=1e-12, atol=1e-12)


def test_traced_index_tensor_is_an_input_not_a_constant() -> None:
    table = sg.tensor(np.arange(12.0).reshape(4, 3))
    pick = sg.compile(lambda t, i: t[i, ::-1], backend="numpy")
    np.testing.assert_array_equal(pick(table, np.array([3, -4], np.int32)).numpy(), table.numpy()[[3, -4], ::-1])
    np.testing.assert_array_equal(pick(table, np.array([1, 1], np.int32)).numpy(), table.numpy()[[1, 1], ::-1])
    assert pick.trace_count == 1


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [
        ((0, 0, 0), sg.ShapeError, r"too many indices \(3\)"),
        ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
        ((5,), IndexError, "index 5 is out of bounds for axis 0 with size 2"),
        (([0, 3],), IndexError, r"out of range \[-2, 2\)"),
        ((np.array([True, False]),), TypeError, "boolean mask"),
        ((1.5,), TypeError, "unsupported index 1.5"),
        (([0.5],), TypeError, "index arrays must be integers"),
    ],
)
def test_bad_indices_are_clear_errors(index: tuple[Any, ...], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        sg.tensor(np.ones((2, 3)))[index]
