"""Scalar operands: a Python/NumPy scalar is a parameter of a binary op or ``where``.

Values against NumPy, gradients against float64 central differences with a random
cotangent, the weak-typing dtype rules, the eager tape form (one node, no constant
or broadcast), the graph IR form (a 0-d constant broadcast, as before) and eager
and compiled agreeing on values, dtypes and gradients.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.numpy_ref import NumpyExecutable
from shapegrad.dtypes import DTypeError, Int32OverflowError, as_dtype
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.tensor import Tensor

RNG = np.random.default_rng(7)

# (name, shapegrad op, NumPy op); each is applied as op(x, s) and op(s, x).
ARITHMETIC: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
    ("add", operator.add, np.add),
    ("sub", operator.sub, np.subtract),
    ("mul", operator.mul, np.multiply),
    ("div", operator.truediv, np.divide),
    ("maximum", sg.maximum, np.maximum),
    ("minimum", sg.minimum, np.minimum),
]
COMPARISONS: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
    ("lt", operator.lt, np.less),
    ("le", operator.le, np.less_equal),
    ("gt", operator.gt, np.greater),
    ("ge", operator.ge, np.greater_equal),
    ("eq", operator.eq, np.equal),
    ("ne", operator.ne, np.not_equal),
]
CMP_NAMES = {c[0] for c in COMPARISONS}


def _data(dtype: str, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    if dtype == "int32":
        return RNG.integers(-5, 6, shape).astype(np.int32)
    # away from 0 and from the scalars below so that div/pow/max ties stay smooth
    return (RNG.uniform(0.5, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)).astype(dtype)


# --- values and dtypes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,op,ref", ARITHMETIC + COMPARISONS, ids=lambda v: v if isinstance(v, str) else ""
)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("scalar", [1.25, 3, np.float64(-0.75)])
def test_float_tensor_with_scalar_matches_numpy(
    name: str, op: Callable[..., Any], ref: Callable[..., Any], dtype: str, scalar: Any
) -> None:
    a = _data(dtype)
    s = np.dtype(dtype).type(scalar)  # weak typing: the scalar takes the tensor's dtype
    for out, expected in (
        (op(sg.tensor(a), scalar), ref(a, s)),
        (op(scalar, sg.tensor(a)), ref(s, a)),
    ):
        assert out.dtype == (sg.bool_ if name in CMP_NAMES else as_dtype(dtype))
        assert out.shape == a.shape
        np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize(
    "name,op,ref", ARITHMETIC + COMPARISONS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_int_tensor_with_int_scalar_stays_int32(
    name: str, op: Callable[..., Any], ref: Callable[..., Any]
) -> None:
    a = _data("int32")
    a[a == 0] = 1
    for scalar in (3, np.int64(-2), True):
        s = np.int32(scalar)
        left, right = op(sg.tensor(a), scalar), op(scalar, sg.tensor(a))
        if name == "div":  # C semantics: truncation toward zero, as every backend
            expected_l = np.trunc(a / s).astype(np.int32)
            expected_r = np.trunc(s / a).astype(np.int32)
        else:
            expected_l, expected_r = ref(a, s), ref(s, a)
        is_cmp = name in CMP_NAMES
        assert left.dtype == right.dtype == (sg.bool_ if is_cmp else sg.int32)
        np.testing.assert_array_equal(left.numpy(), expected_l)
        np.testing.assert_array_equal(right.numpy(), expected_r)


def test_pow_with_scalar_exponent_and_scalar_base() -> None:
    a = np.abs(_data("float32")) + 0.1
    np.testing.assert_allclose((sg.tensor(a) ** 2.5).numpy(), a ** np.float32(2.5), rtol=1e-6)
    np.testing.assert_allclose((2.0 ** sg.tensor(a)).numpy(), np.float32(2.0) ** a, rtol=1e-6)
    assert (sg.tensor(a) ** 2.5).dtype == sg.float32


def test_dtype_rules_of_weak_scalars() -> None:
    f32, f16 = sg.tensor([1.0, 2.0]), sg.tensor([1.0, 2.0], dtype="float16")
    i32, b = sg.tensor([1, 2]), sg.tensor([True, False])
    assert (f32 * 0.1).dtype == sg.float32 and (f32 * np.float64(0.1)).dtype == sg.float32
    assert (f32 + 1).dtype == sg.float32 and (f16 * 3.5).dtype == sg.float16
    assert (i32 + 2).dtype == sg.int32 and (i32 * np.int64(3)).dtype == sg.int32
    assert (b == True).dtype == sg.bool_  # noqa: E712 (an elementwise comparison)
    np.testing.assert_array_equal((~b).numpy(), [False, True])
    # the float32 result is the float32 rounding of the scalar, as NumPy's float32 math
    np.testing.assert_array_equal((f32 * 0.1).numpy(), np.float32([1.0, 2.0]) * np.float32(0.1))
    with pytest.raises(DTypeError, match="cannot combine a float value with a int32 tensor"):
        i32 * 0.5
    with pytest.raises(DTypeError, match="float value"):
        np.float32(2.0) + i32
    with pytest.raises(Int32OverflowError, match="does not fit in int32"):
        i32 + 2**40


def test_bad_operands_keep_their_messages() -> None:
    x = sg.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="unsupported operand type str"):
        x + "a"  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"combine them with sg\.stack"):
        x + [x, x]  # type: ignore[operator]
    with pytest.raises(
        sg.ShapeError, match=r"add: cannot broadcast \[2\] and \[3\].*test_scalar_operands.py"
    ):
        x + np.ones(3, np.float32)
    with pytest.raises(DTypeError, match="where: condition must be bool"):
        sg.where(x, x, 0.0)


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_where_with_scalar_branches(which: str) -> None:
    a = _data("float64")
    cond = a > 0
    t = sg.tensor(a)
    if which == "a":
        out, expected = sg.where(sg.tensor(cond), 2.0, t), np.where(cond, 2.0, a)
    elif which == "b":
        out, expected = sg.where(sg.tensor(cond), t, -1), np.where(cond, a, -1.0)
    else:
        out, expected = (
            sg.where(sg.tensor(cond), 1.0, 0.5),
            np.where(cond, 1.0, 0.5).astype(np.float32),
        )
    assert out.dtype == (sg.float32 if which == "both" else sg.float64)
    np.testing.assert_array_equal(out.numpy(), expected)


# --- gradients against float64 finite differences -----------------------------------


def _check_vjp(f: Callable[[Tensor], Tensor], a: np.ndarray, eps: float = 1e-6) -> None:
    """sg.vjp of f at a with a random cotangent vs central differences of <ct, f(x)>."""
    out, pull = sg.vjp(f, sg.tensor(a))
    ct = RNG.standard_normal(out.shape)
    (grad,) = pull(sg.tensor(ct))
    numeric = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        hi, lo = a.copy(), a.copy()
        hi[i] += eps
        lo[i] -= eps
        numeric[i] = (
            np.sum(ct * f(sg.tensor(hi)).numpy()) - np.sum(ct * f(sg.tensor(lo)).numpy())
        ) / (2 * eps)
    np.testing.assert_allclose(grad.numpy(), numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,op,ref", ARITHMETIC, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("scalar", [0.7, -1.5, 2])
def test_scalar_operand_gradients(
    name: str, op: Callable[..., Any], ref: Callable[..., Any], scalar: Any
) -> None:
    a = _data("float64")
    _check_vjp(lambda x: op(x, scalar), a)
    _check_vjp(lambda x: op(scalar, x), a)


def test_pow_and_where_gradients() -> None:
    a = np.abs(_data("float64")) + 0.2
    _check_vjp(lambda x: x**2.5, a)
    _check_vjp(lambda x: 3.0**x, a)
    _check_vjp(lambda x: 0.5**x, a)
    signed = _data("float64")
    _check_vjp(lambda x: sg.where(x > 0, x * 3.0, 0.25), signed)
    _check_vjp(lambda x: sg.where(x > 0, -2.0, x * x), signed)
    _check_vjp(lambda x: sg.relu(x) * 2.0 - 1.0 / x, signed)


def test_negative_scalar_base_pow_has_zero_base_gradient_path() -> None:
    # (-2) ** x is NaN for non-integer x in NumPy; the gradient rule must not crash.
    x = sg.tensor([1.0, 2.0, 3.0], dtype="float64")
    g = sg.grad(lambda x: ((-2.0) ** x).sum())(x)
    assert g.shape == (3,) and g.dtype == sg.float64


# --- the tape and the graph ---------------------------------------------------------


def test_eager_tape_records_one_node_with_the_scalar() -> None:
    seen: list[Any] = []

    def f(x: Tensor) -> Tensor:
        y = 0.5 - x
        node = y._tape
        assert node is not None
        seen.append((node.prim, len(node.inputs), node.attrs))
        return (y * 2.0).sum()

    g = sg.grad(f)(sg.tensor([1.0, 2.0]))
    ((prim, n_inputs, attrs),) = seen
    assert prim is Prim.SUB and n_inputs == 1
    first, second = attrs["scalars"]
    assert second is None and type(first) is np.float32 and first == 0.5
    np.testing.assert_array_equal(g.numpy(), [-2.0, -2.0])


def _graph_of(fn: Callable[[Tensor], Tensor], shape: tuple[int, ...], dtype: sg.DType) -> Any:
    ops = GraphOps()
    x = ops.add_input("x", AVal(shape, dtype))
    return ops.to_graph([fn(x)])


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64, sg.int32])
def test_graph_spells_a_scalar_as_a_0d_constant_of_the_tensor_dtype(dtype: sg.DType) -> None:
    graph = _graph_of(lambda x: 3 - x, (4, 5), dtype)
    (out,) = graph.outputs
    assert out.prim is Prim.SUB and out.aval == AVal((4, 5), dtype)
    broadcast = out.inputs[0]
    assert broadcast.prim is Prim.BROADCAST and broadcast.attr["dims"] == ()
    (const,) = broadcast.inputs
    value = const.attr["value"]
    assert const.prim is Prim.CONSTANT and value.shape == () and value.dtype == dtype
    assert value.array.item() == 3
    a = _data(dtype.name, (4, 5))
    (result,) = NumpyExecutable(graph)([a])
    np.testing.assert_array_equal(result, (3 - sg.tensor(a)).numpy())


def test_graph_form_is_hash_consed_with_the_array_form() -> None:
    # x * 2.0 (a parameter) and x * <the same eager 0-d tensor> are one node in the IR
    ops = GraphOps()
    x = ops.add_input("x", AVal((3,), sg.float32))
    assert (x * 2.0)._payload is (x * sg.tensor(2.0))._payload


def test_compiled_and_eager_agree_on_scalar_ops() -> None:
    def loss(x: Tensor) -> Tensor:
        y = sg.where(x > 0.25, x * 1.5 + 0.5, 0.1 - x) / 2.0
        return (sg.maximum(y, 0.3) ** 2.0 + 2.0 ** sg.minimum(x, 1.0)).sum()

    a = _data("float32", (6,))
    value_e, grad_e = sg.value_and_grad(loss)(sg.tensor(a))
    value_c, grad_c = sg.compile(sg.value_and_grad(loss), backend="numpy")(sg.tensor(a))
    assert value_c.dtype == value_e.dtype == sg.float32 and grad_c.dtype == sg.float32
    np.testing.assert_allclose(value_c.numpy(), value_e.numpy(), rtol=1e-6)
    np.testing.assert_allclose(grad_c.numpy(), grad_e.numpy(), rtol=1e-6)


# --- floating-point state -------------------------------------------------------------


def test_eager_ops_do_not_warn_nor_change_numpy_error_state() -> None:
    before = np.geterr()
    x = sg.tensor([1e30, -1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = x * 1e30
        z = 1.0 / x
        w = sg.log(x)
        _, g = sg.value_and_grad(lambda t: (sg.exp(t * 100.0) / t).sum())(x)
    assert np.isinf(y.numpy()[0]) and np.isinf(z.numpy()[2]) and np.isnan(w.numpy()[1])
    assert g.shape == (3,)
    assert np.geterr() == before


def test_check_numerics_sees_scalar_ops() -> None:
    x = sg.tensor([1e30, 1.0])
    with sg.check_numerics(), pytest.raises(FloatingPointError, match="mul produced non-finite"):
        x * 1e30
