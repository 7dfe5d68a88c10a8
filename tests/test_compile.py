"""sg.compile: structures in and out, the signature cache, trace-time errors, debug dumps."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from harness import Case, analytic_grads, cotangent_for
from modes import MODES, Runner, as_tensors, outputs
from op_table import CASES
from shapegrad.backends import CompileOptions, get_backend, validate_inputs
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim
from shapegrad.tensor import Tensor
from shapegrad.typing import ParamList


def rand(*shape: int, seed: int = 0, dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def mlp_loss(params: Any, x: Tensor, y: Tensor) -> Tensor:
    w1, b1, w2, b2 = params
    h = sg.relu(x @ w1 + b1)
    return ((h @ w2 + b2 - y) ** 2).mean()


def make_params(seed: int = 0) -> ParamList:  # type: ignore[type-arg]
    shapes = [(4, 8), (8,), (8, 2), (2,)]
    return ParamList(
        [sg.tensor(rand(*s, seed=seed + i)) for i, s in enumerate(shapes)],
        names=["w1", "b1", "w2", "b2"],
    )


def test_value_and_grad_compiled_matches_eager() -> None:
    params, x, y = make_params(), rand(16, 4, seed=9), rand(16, 2, seed=10)
    eager_v, eager_g = sg.value_and_grad(mlp_loss)(params, sg.tensor(x), sg.tensor(y))
    fast = sg.compile(sg.value_and_grad(mlp_loss))
    value, grads = fast(params, x, y)
    assert isinstance(value, Tensor) and not value.is_traced
    np.testing.assert_allclose(value.numpy(), eager_v.numpy(), rtol=1e-12)
    assert isinstance(grads, ParamList) and grads.names == params.names
    for g, e in zip(grads, eager_g, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)


def test_same_signature_does_not_retrace() -> None:
    fast = sg.compile(lambda a, b: a * b + 1.0)
    fast(rand(3), rand(3, seed=1))
    fast(rand(3, seed=2), rand(3, seed=3))
    fast(sg.tensor(rand(3)), rand(3))  # a Tensor and an array of one type are one signature
    assert fast.trace_count == 1
    fast(rand(4), rand(4))  # new shape
    assert fast.trace_count == 2
    fast(rand(3, dtype=np.float32), rand(3, dtype=np.float32))  # new dtype
    assert fast.trace_count == 3
    fast(rand(3), rand(3))
    assert fast.trace_count == 3


def test_python_scalars_are_inputs_not_constants() -> None:
    fast = sg.compile(lambda x, lr: x * lr)
    x = rand(3, dtype=np.float32)
    np.testing.assert_allclose(fast(x, 0.5).numpy(), x * 0.5, rtol=1e-6)
    np.testing.assert_allclose(fast(x, 2.0).numpy(), x * 2.0, rtol=1e-6)
    assert fast.trace_count == 1
    names = [n.attr["name"] for n in fast.graph(x, 1.0).inputs]
    assert names == ["x", "lr"]
    # A Python float follows the arrays' float dtype (weak typing, as in eager mode).
    assert fast(rand(3), 0.5).dtype == sg.float64
    with pytest.raises(sg.DTypeError, match=r"float64.*float32|float32.*float64"):
        fast(rand(3), np.float32(0.5))
    with pytest.raises(sg.DTypeError, match=r"float64.*float32|float32.*float64"):
        fast(rand(3, dtype=np.float32), np.float64(0.5))  # NumPy scalars keep their dtype


def test_static_argnums_retrace_on_change() -> None:
    def power_sum(x: Tensor, k: int) -> Tensor:
        out = x
        for _ in range(k - 1):  # Python control flow on a static value is fine
            out = out * x
        return out.sum()

    fast = sg.compile(power_sum, static_argnums=1)
    x = rand(5)
    assert np.isclose(fast(x, 3).item(), (x**3).sum())
    assert np.isclose(fast(x, 3).item(), (x**3).sum())
    assert fast.trace_count == 1
    assert np.isclose(fast(x, 2).item(), (x**2).sum())
    assert fast.trace_count == 2


def test_static_list_and_array_are_keyed_by_value_not_identity() -> None:
    def weighted(x: Tensor, weights: Any) -> Tensor:
        out = x[0] * 0.0
        for k, w in enumerate(weights):  # a Python loop over the static values
            out = out + x[k] * float(w)
        return out

    fast = sg.compile(weighted, static_argnums=1)
    x = rand(3, 2)
    weights = [1.0, 2.0, 3.0]
    np.testing.assert_allclose(fast(x, weights).numpy(), x.T @ np.array(weights))
    weights[1] = -5.0  # the caller mutates the list it passed before
    np.testing.assert_allclose(fast(x, weights).numpy(), x.T @ np.array(weights))
    assert fast.trace_count == 2
    fast(x, [1.0, -5.0, 3.0])  # an equal, distinct list: no new trace
    assert fast.trace_count == 2
    table = np.array([0.5, 0.25, 2.0])
    np.testing.assert_allclose(fast(x, table).numpy(), x.T @ table)
    table[0] = 7.0  # the same array object, mutated in place
    np.testing.assert_allclose(fast(x, table).numpy(), x.T @ table)
    assert fast.trace_count == 4
    nested = {"w": [1.0, 1.0, 1.0]}
    pick = sg.compile(lambda x, cfg: weighted(x, cfg["w"]), static_argnums=1)
    np.testing.assert_allclose(pick(x, nested).numpy(), x.sum(axis=0))
    nested["w"][2] = 0.0
    np.testing.assert_allclose(pick(x, nested).numpy(), x[0] + x[1])


def test_an_unhashable_static_argument_is_rejected() -> None:
    class Config:  # no __hash__ (defines __eq__), not a container
        def __init__(self, k: int) -> None:
            self.k = k

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Config) and other.k == self.k

    fast = sg.compile(lambda x, cfg: x * float(cfg.k), static_argnums=1, name="scale")
    with pytest.raises(
        TypeError,
        match=r"sg.compile\(scale\): static argument 1 is a Config, "
        "which is not hashable",
    ):
        fast(rand(2), Config(3))
    assert fast.trace_count == 0


def test_structure_change_retraces_and_nested_outputs_round_trip() -> None:
    def f(tree: dict[str, Any]) -> dict[str, Any]:
        a, (b, c) = tree["a"], tree["bc"]
        return {"sum": a + b, "pair": (c * 2.0, [a - c]), "none": None}

    fast = sg.compile(f)
    a, b, c = rand(2), rand(2, seed=1), rand(2, seed=2)
    out = fast({"a": a, "bc": (b, c)})
    assert set(out) == {"sum", "pair", "none"} and out["none"] is None
    np.testing.assert_allclose(out["sum"].numpy(), a + b)
    np.testing.assert_allclose(out["pair"][0].numpy(), c * 2.0)
    np.testing.assert_allclose(out["pair"][1][0].numpy(), a - c)
    fast({"a": a, "bc": [b, c]})  # tuple -> list is a different structure
    assert fast.trace_count == 2


def test_outputs_are_eager_and_usable() -> None:
    fast = sg.compile(lambda x: sg.exp(x))
    y = fast(rand(3))
    np.testing.assert_allclose((y * 2.0).numpy(), 2.0 * np.exp(rand(3)))
    g = sg.grad(lambda t: (t * t).sum())(y)
    np.testing.assert_allclose(g.numpy(), 2.0 * np.exp(rand(3)))


def test_captured_eager_tensor_is_baked_in() -> None:
    w = sg.tensor(rand(3, 3, seed=4))
    fast = sg.compile(lambda x: x @ w)
    x = rand(2, 3)
    np.testing.assert_allclose(fast(x).numpy(), x @ w.numpy(), rtol=1e-12)


def test_nested_compile_inlines() -> None:
    inner = sg.compile(lambda x: sg.tanh(x))
    outer = sg.compile(lambda x: inner(x) * 2.0)
    x = rand(4)
    np.testing.assert_allclose(outer(x).numpy(), 2.0 * np.tanh(x), rtol=1e-12)
    assert inner.trace_count == 0 and outer.trace_count == 1


def test_grad_and_stop_gradient_inside_compile() -> None:
    def f(x: Tensor) -> Tensor:
        return (sg.stop_gradient(x) * x * x).sum() + sg.softmax(x).max()

    x = rand(6)
    expected = sg.grad(f)(sg.tensor(x)).numpy()
    got = sg.compile(sg.grad(f))(x).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_second_order_gradient_compiled_matches_finite_differences() -> None:
    def f(x: Tensor) -> Tensor:
        return (sg.tanh(x) ** 3).sum()

    def h(x: Tensor) -> Tensor:
        return (sg.grad(f)(x) * x).sum()

    x = rand(5)
    got = sg.compile(sg.grad(h))(x).numpy()
    h_value = sg.compile(h)
    eps = 1e-6
    fd = [
        (h_value(x + eps * e).item() - h_value(x - eps * e).item()) / (2 * eps) for e in np.eye(5)
    ]
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-9)


def test_graph_printing_and_stats() -> None:
    fast = sg.compile(sg.value_and_grad(mlp_loss))
    params, x, y = make_params(), rand(8, 4), rand(8, 2)
    text = fast.graph(params, x, y).format()
    assert "input %params.w1 : float64[4, 8]" in text
    assert "einsum(" in text and text.splitlines()[-1].startswith("return ")
    stats = fast.stats(params, x, y)
    assert stats[0].name == "fold_constants"
    lowered = fast.lower(params, x, y)
    assert lowered.recorded_nodes >= stats[0].nodes_before >= stats[-1].nodes_after
    assert "after passes" in lowered.summary()
    assert fast.trace_count == 1


def test_debug_dumps_every_pass(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path))
    fast = sg.compile(lambda x: (x * 1.0 + 0.0).sum(), name="tiny")
    fast(rand(3))
    (folder,) = os.listdir(tmp_path)
    assert folder.startswith("tiny-")
    files = sorted(os.listdir(tmp_path / folder))
    assert files[0] == "000_traced.txt"
    assert files[1] == "001_r1_fold_constants.txt"
    assert len(files) == 1 + len(fast.stats(rand(3)))
    first = (tmp_path / folder / files[0]).read_text()
    last = (tmp_path / folder / files[-1]).read_text()
    assert "mul(" in first and "mul(" not in last


# --- trace-time errors ------------------------------------------------------------------


def test_python_if_on_traced_value_is_a_trace_error() -> None:
    def f(x: Tensor) -> Tensor:
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(sg.TraceError, match=r"bool\(tensor\).*sg\.where"):
        sg.compile(f)(rand(3))


@pytest.mark.parametrize("access", [lambda t: t.numpy(), lambda t: float(t.sum())])
def test_concrete_access_is_a_trace_error(access: Any) -> None:
    with pytest.raises(sg.TraceError, match="traced"):
        sg.compile(lambda x: sg.tensor(access(x)))(rand(3))


@pytest.mark.parametrize("value", [3, "text", 2.5])
def test_returning_a_non_tensor_is_a_trace_error(value: Any) -> None:
    with pytest.raises(sg.TraceError, match=f"returned a {type(value).__name__}"):
        sg.compile(lambda x: (x, value))(rand(3))


def test_mutating_an_input_list_is_a_trace_error() -> None:
    def replace(xs: list[Tensor]) -> Tensor:
        xs[0] = xs[0] * 2.0
        return xs[0]

    def append(xs: list[Tensor]) -> Tensor:
        xs.append(xs[0])
        return xs[0]

    with pytest.raises(sg.TraceError, match=r"replaced argument element 'xs\[0\]'"):
        sg.compile(replace)([rand(2), rand(2)])
    with pytest.raises(sg.TraceError, match="changed the structure"):
        sg.compile(append)([rand(2), rand(2)])


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        sg.compile(lambda x: x, backend="tpu")


def test_validate_inputs_names_the_input() -> None:
    fast = sg.compile(lambda weights, x: weights * x)
    graph: Graph = fast.graph(rand(3), rand(3))
    with pytest.raises(sg.ShapeError, match=r"'weights'.*\[4\].*expected \[3\]"):
        validate_inputs(graph, [rand(4), rand(3)])
    with pytest.raises(sg.DTypeError, match=r"'x' has dtype float32, expected float64"):
        validate_inputs(graph, [rand(3), rand(3, dtype=np.float32)])
    with pytest.raises(ValueError, match="C-contiguous"):
        validate_inputs(graph, [rand(6)[::2], rand(3)])
    with pytest.raises(TypeError, match="expects 2 inputs"):
        validate_inputs(graph, [rand(3)])


def test_numpy_backend_runs_a_graph_directly() -> None:
    fast = sg.compile(lambda x: sg.exp(x) + x)
    graph = fast.graph(rand(3))
    executable = get_backend("numpy").compile(graph, CompileOptions())
    (out,) = executable([rand(3)])
    np.testing.assert_allclose(out, np.exp(rand(3)) + rand(3))
    assert any(n.prim is Prim.EXP for n in executable.graph.nodes())


def test_donate_argnums_records_aliases_for_updated_state() -> None:
    def step(params: Any, x: Tensor, y: Tensor, lr: float) -> tuple[Tensor, Any]:
        loss, grads = sg.value_and_grad(mlp_loss)(params, x, y)
        return loss, params.map(lambda p, g: p - lr * g, grads)

    params, x, y = make_params(), rand(8, 4), rand(8, 2)
    graph = sg.compile(step, donate_argnums=0).graph(params, x, y, 0.1)
    assert graph.aliases == [(1, 0), (2, 1), (3, 2), (4, 3)]
    for out_k, in_i in graph.aliases:
        assert graph.outputs[out_k].aval == graph.inputs[in_i].aval
    with pytest.raises(sg.TraceError, match="donate_argnums"):
        sg.compile(step, donate_argnums=1).graph(params, x, y, 0.1)


# --- the op table: compiled (numpy backend) equals eager --------------------------------

COMPILED_NUMPY = Runner(
    "compiled-numpy",
    call=lambda fn, args: outputs(sg.compile(fn, backend="numpy")(*as_tensors(args))),
    grad=lambda fn, args, argnums: outputs(
        sg.compile(sg.grad(fn, argnums=argnums), backend="numpy")(*as_tensors(args))
    ),
)


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12 * scale, err_msg=what)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_table_compiled_equals_eager_in_float64(case: Case) -> None:
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in case.arrays()]
    eager = MODES["eager"]
    for got, want in zip(
        COMPILED_NUMPY.call(case.fn, arrays), eager.call(case.fn, arrays), strict=True
    ):
        _assert_close(got, want, f"{case.name}: forward")
    argnums = case.diff_positions(arrays)
    if not case.grad or not argnums:
        return
    ct = cotangent_for(case, arrays)
    got_grads = analytic_grads(case, COMPILED_NUMPY, arrays, ct, argnums)
    want_grads = analytic_grads(case, eager, arrays, ct, argnums)
    for g, w, pos in zip(got_grads, want_grads, argnums, strict=True):
        _assert_close(g, w, f"{case.name}: gradient of input {pos}")
