"""The graph interpreter: hash-consing, constant lifting, trace errors, graph autodiff."""

from __future__ import annotations

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.numpy_ref import NumpyExecutable
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.tensor import Tensor


def inputs(*shapes: tuple[int, ...], dtype: sg.DType = sg.float64) -> tuple[GraphOps, list[Tensor]]:
    ops = GraphOps()
    return ops, [ops.add_input(f"x{i}", AVal(s, dtype)) for i, s in enumerate(shapes)]


def test_structurally_equal_ops_are_one_node() -> None:
    _, (x,) = inputs((3,))
    a = sg.exp(x * 2.0)
    b = sg.exp(x * 2.0)
    assert a._payload is b._payload
    assert (x + 1.0)._payload is not (x + 2.0)._payload


def test_two_inputs_of_equal_type_stay_distinct() -> None:
    _, (x, y) = inputs((3,), (3,))
    assert x._payload is not y._payload
    assert sg.exp(x)._payload is not sg.exp(y)._payload


def test_traced_tensor_has_type_and_repr() -> None:
    _, (x,) = inputs((2, 5))
    y = (x @ x.T).sum(axis=0)
    assert y.shape == (2,) and y.dtype == sg.float64 and y.is_traced
    assert "traced float64[2]" in repr(y)


def test_eager_capture_becomes_a_constant() -> None:
    ops, (x,) = inputs((2, 3))
    w = sg.tensor(np.arange(6.0).reshape(2, 3))
    graph = ops.to_graph([x * w])
    constants = [n for n in graph.nodes() if n.prim is Prim.CONSTANT]
    assert len(constants) == 1
    np.testing.assert_array_equal(constants[0].attr["value"].array, w.numpy())


def test_eager_scalar_broadcast_is_lifted_as_scalar_plus_broadcast() -> None:
    ops, (x,) = inputs((256, 256))
    graph = ops.to_graph([x + sg.tensor(1.5, dtype="float64")])
    constants = [n for n in graph.nodes() if n.prim is Prim.CONSTANT]
    assert [c.attr["value"].array.size for c in constants] == [1]
    (out,) = NumpyExecutable(graph)([np.zeros((256, 256))])
    assert np.all(out == 1.5)


def test_shape_errors_happen_at_trace_time() -> None:
    _, (x, y) = inputs((3, 4), (5, 4))
    with pytest.raises(sg.ShapeError, match=r"\[3, 4\].*\[5, 4\]"):
        x + y


@pytest.mark.parametrize(
    ("use", "what"),
    [
        (lambda t: bool(t.sum() > 0), "bool"),
        (lambda t: float(t.sum()), "float"),
        (lambda t: t.numpy(), ".numpy()"),
        (lambda t: t.sum().item(), ".item()"),
        (lambda t: np.asarray(t), "np.asarray"),
    ],
)
def test_concrete_access_on_traced_values_raises_trace_error(use: object, what: str) -> None:
    _, (x,) = inputs((3,))
    with pytest.raises(sg.TraceError, match=r"sg\.compile") as info:
        use(x)  # type: ignore[operator]
    assert what in str(info.value)


def test_mixing_two_traces_is_an_error() -> None:
    _, (x,) = inputs((3,))
    _, (y,) = inputs((3,))
    with pytest.raises(ValueError, match="two different traces"):
        x + y


def _loss(w: Tensor, b: Tensor, x: Tensor) -> Tensor:
    h = sg.tanh(x @ w + b)
    return (sg.log_softmax(h, axis=-1) * h).sum() + sg.stop_gradient(h).max()


def test_graph_autodiff_matches_the_eager_tape() -> None:
    rng = np.random.default_rng(0)
    w, b, x = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((5, 4))
    value, (gw, gb) = sg.value_and_grad(_loss, argnums=(0, 1))(*map(sg.tensor, (w, b, x)))

    ops, (tw, tb, tx) = inputs((4, 3), (3,), (5, 4))
    tvalue, (tgw, tgb) = sg.value_and_grad(_loss, argnums=(0, 1))(tw, tb, tx)
    graph = ops.to_graph([tvalue, tgw, tgb])
    got = NumpyExecutable(graph)([w, b, x])
    for g, e in zip(got, (value, gw, gb), strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-12, atol=1e-12)


def test_graph_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    w, b, x = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((5, 4))
    ops, (tw, tb, tx) = inputs((4, 3), (3,), (5, 4))

    def smooth(w: Tensor, b: Tensor, x: Tensor) -> Tensor:
        return (sg.log_softmax(sg.tanh(x @ w + b), axis=-1) ** 2).sum()

    graph = ops.to_graph([sg.grad(smooth)(tw, tb, tx)])
    (gw,) = NumpyExecutable(graph)([w, b, x])
    forward = ops.to_graph([smooth(tw, tb, tx)])
    run = NumpyExecutable(forward)
    direction = rng.standard_normal(w.shape)
    eps = 1e-6
    plus = run([w + eps * direction, b, x])[0]
    minus = run([w - eps * direction, b, x])[0]
    np.testing.assert_allclose((plus - minus) / (2 * eps), (gw * direction).sum(), rtol=1e-6)


def test_stop_gradient_is_a_frontier_in_graphs() -> None:
    ops, (x,) = inputs((3,))
    g = sg.grad(lambda x: (sg.stop_gradient(x * x) * x).sum())(x)
    (out,) = NumpyExecutable(ops.to_graph([g]))([np.array([1.0, 2.0, 3.0])])
    np.testing.assert_allclose(out, [1.0, 4.0, 9.0])


def test_producer_and_identity_hooks() -> None:
    ops, (x,) = inputs((3,))
    y = sg.exp(x)
    made_by = ops.producer(y)
    assert made_by is not None and made_by[0] is Prim.EXP
    assert ops.identity(made_by[1][0]) == ops.identity(x)
    assert ops.producer(x) is None
    assert ops.identity(sg.exp(x)) == ops.identity(y)
