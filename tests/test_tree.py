"""Pytrees (issue 14): dataclasses and registered types through grad/compile, clear errors
for opaque objects holding tensors, lists of numbers as data, names per leaf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import tree


@dataclass
class Params:
    w: sg.Tensor
    b: sg.Tensor
    scale: float = 2.0


def _loss(p: Params, x: Any) -> sg.Tensor:
    return ((sg.matmul(x, p.w) + p.b) ** 2).sum() * p.scale


def _params(seed: int = 0) -> Params:
    rng = np.random.default_rng(seed)
    return Params(sg.tensor(rng.normal(size=(3, 2))), sg.tensor(rng.normal(size=(2,))))


def _reference_grads(p: Params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Closed form: d/dW sum(s*(xW+b)^2) = 2s x^T (xW+b), d/db = 2s sum_rows(xW+b)."""
    r = x @ p.w.numpy() + p.b.numpy()
    return 2 * p.scale * x.T @ r, 2 * p.scale * r.sum(axis=0)


X = np.random.default_rng(1).normal(size=(4, 3))


def test_grad_of_a_dataclass_returns_gradients_not_the_input() -> None:
    p = _params()
    g = sg.grad(_loss)(p, X)
    assert isinstance(g, Params) and g is not p
    gw, gb = _reference_grads(p, X)
    np.testing.assert_allclose(g.w.numpy(), gw, rtol=1e-10)
    np.testing.assert_allclose(g.b.numpy(), gb, rtol=1e-10)


def test_compile_traces_dataclass_leaves_as_inputs_once() -> None:
    fast = sg.compile(sg.value_and_grad(_loss), backend="numpy")
    for seed in range(3):  # new objects and values: one trace, fresh results every call
        p = _params(seed)
        value, g = fast(p, X)
        gw, _ = _reference_grads(p, X)
        np.testing.assert_allclose(g.w.numpy(), gw, rtol=1e-10)
        np.testing.assert_allclose(value.item(), _loss(p, X).item(), rtol=1e-12)
    assert fast.trace_count == 1


class Opaque:
    def __init__(self, w: sg.Tensor) -> None:
        self.inner = {"w": w}


def test_unregistered_object_holding_tensors_is_a_clear_error() -> None:
    model = {"layers": [Opaque(sg.ones(3))]}
    with pytest.raises(TypeError, match=r"value\['layers'\]\[0\] is a Opaque object holding tensors "
                       r"\(at value\['layers'\]\[0\]\.inner\['w'\]\).*sg.tree.register"):
        sg.grad(lambda m: m["layers"][0].inner["w"].sum())(model)
    with pytest.raises(TypeError, match="Opaque object holding tensors"):
        sg.compile(lambda m: m["layers"][0].inner["w"].sum())(model)


def test_opaque_objects_without_tensors_stay_static() -> None:
    class Config:
        def __init__(self) -> None:
            self.factor = 3.0

    out = sg.compile(lambda x, c: x * c.factor)(sg.ones(2), Config())
    np.testing.assert_array_equal(out.numpy(), [3.0, 3.0])


class Pair:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


tree.register(Pair, lambda p: ((p.a, p.b), ("a", "b"), None), lambda aux, kids: Pair(*kids))


def test_registered_type_round_trips_and_is_differentiated() -> None:
    p = Pair(sg.tensor([1.0, 2.0]), sg.tensor(3.0))
    g = sg.grad(lambda q: (q.a * q.b).sum())(p)
    assert isinstance(g, Pair)
    np.testing.assert_allclose(g.a.numpy(), [3.0, 3.0])
    np.testing.assert_allclose(g.b.numpy(), 3.0)
    assert tree.leaf_paths({"pair": p}) == ["pair.a", "pair.b"]


def test_python_lists_are_array_data_in_compiled_and_grad_calls() -> None:
    w = sg.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    fast = sg.compile(lambda w, x: sg.matmul(x, w).sum(), backend="numpy")
    assert fast(w, [[1.0, 2.0]]).item() == pytest.approx(1 * 3 + 2 * 12.0)
    assert fast(w, [[1.0, 0.0]]).item() == pytest.approx(3.0)  # same trace, new data
    assert fast.trace_count == 1
    g = sg.grad(lambda v: (v * v).sum())([1.0, 2.0])
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


def test_tuples_of_scalars_stay_containers() -> None:
    leaves, td = tree.flatten((1.0, 2))
    assert leaves == [] and td.kind == "seq"


def test_leaf_paths_and_flags_of_nested_containers() -> None:
    class P(sg.ParamList[sg.Float[sg.Tensor, "2"], sg.Float[sg.Tensor, "2"]]):
        names = ("w", "b")

    p = P([np.ones(2, np.float32)] * 2).freeze("b")
    nested = {"enc": [p, p], "head": sg.ones(1)}
    assert tree.leaf_paths(nested) == ["enc.0.w", "enc.0.b", "enc.1.w", "enc.1.b", "head"]
    assert tree.leaf_flags(nested) == (True, False, True, False, True)
