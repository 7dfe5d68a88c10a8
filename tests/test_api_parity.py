"""NumPy/PyTorch habits (issue 14): each reproduced crash or silent error is now handled."""

from __future__ import annotations

import numpy as np
import pytest

import shapegrad as sg

A = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)


def test_ellipsis_index() -> None:
    np.testing.assert_array_equal(sg.tensor(A)[..., 0].numpy(), A[..., 0])


@pytest.mark.parametrize("axes", [((0, 2, 1),), (0, 2, 1), ([2, 0, 1],), ()])
def test_transpose_takes_a_tuple_or_varargs(axes: tuple) -> None:
    expected = A.transpose(*axes) if axes else A.T
    np.testing.assert_array_equal(sg.tensor(A).transpose(*axes).numpy(), expected)


def test_permute_and_transpose_errors_name_the_problem() -> None:
    with pytest.raises(sg.ShapeError, match="not a permutation"):
        sg.tensor(A).transpose(0, 0, 1)
    np.testing.assert_array_equal(sg.tensor(A).permute((2, 1, 0)).numpy(), A.transpose(2, 1, 0))


def test_squeeze_expand_dims_unsqueeze_cat_clip() -> None:
    x = sg.tensor(A[None, :, :1])
    assert x.squeeze().shape == (2, 4)
    assert x.squeeze(0).shape == (2, 1, 4)
    with pytest.raises(sg.ShapeError, match="cannot squeeze axis 1 of size 2"):
        x.squeeze(1)
    assert sg.expand_dims(sg.tensor(A), (0, 2)).shape == (1, 2, 1, 3, 4)
    assert sg.tensor(A).unsqueeze(-1).shape == (2, 3, 4, 1)
    np.testing.assert_array_equal(sg.cat([sg.tensor(A), sg.tensor(A)], 2).numpy(), np.concatenate([A, A], 2))
    np.testing.assert_array_equal(sg.tensor(A).clip(3, 9).numpy(), np.clip(A, 3, 9))
    np.testing.assert_array_equal(sg.clip(sg.tensor(A), None, 5).numpy(), np.clip(A, None, 5))


def test_python_lists_in_a_compiled_step() -> None:
    w = sg.tensor(np.ones((2, 3), np.float32))
    step = sg.compile(lambda w, x, y: sg.cross_entropy(sg.matmul(x, w), y), backend="numpy")
    value = step(w, [[1.0, 2.0], [0.5, 0.5]], [0, 2])
    assert value.item() == pytest.approx(np.log(3.0))


def test_float_labels_are_a_dtype_error_naming_class_indices() -> None:
    logits = sg.tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(sg.DTypeError, match="labels must be integer class indices"):
        sg.cross_entropy(logits, sg.tensor(np.array([0.0, 1.0, 2.0], np.float32)))


def test_adam_with_params_first_explains_functional_optimizers() -> None:
    params = [sg.ones(3)]
    with pytest.raises(TypeError, match=r"functional optimizer.*Adam\(lr=1e-3\).*opt.init\(params\)"):
        sg.optim.Adam(params, lr=1e-3)
    with pytest.raises(TypeError, match="functional optimizer"):
        sg.optim.SGD(params)  # used to build an optimizer whose lr was the parameter list
    with pytest.raises(TypeError, match="lr must be a number"):
        sg.optim.AdamW(lr="0.1")  # type: ignore[arg-type]


@pytest.mark.parametrize("opt", [sg.optim.SGD(lr=0.1), sg.optim.Adam(lr=0.1), sg.optim.AdamW(lr=0.1)])
def test_optimizers_reject_misshapen_gradients(opt: sg.optim.Optimizer) -> None:
    class P(sg.ParamList[sg.Float[sg.Tensor, "8 2"]]):
        names = ("w1",)

    params = P([np.ones((8, 2), np.float32)])
    state = opt.init(params)
    with pytest.raises(sg.ShapeError, match=r"gradient of parameter 'w1' has shape \[2\] but the parameter is \[8, 2\]"):
        opt.update(params, [sg.tensor(np.ones(2, np.float32))], state)
