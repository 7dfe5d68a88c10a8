"""The op-comparison tests: every row of ``op_table.CASES`` in every mode of ``modes.MODES``.

Each row is checked forward against NumPy in float32 and float64 and, where
differentiable, against float64 central differences of the NumPy reference
with a random cotangent. Adding a mode to ``modes.MODES`` runs this whole file
in it. Below the table: the documented gradient conventions at
non-differentiable points, and large-magnitude stability.
"""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.functional as F
from harness import Case, check_forward, check_gradient
from modes import MODES, Runner
from op_table import CASES
from shapegrad.ops.protocol import COLLECTIVES, Prim

GRAD_CASES = [c for c in CASES if c.grad]


def _mode_params() -> list[Any]:
    params = []
    for name, runner in MODES.items():
        reason = runner.unavailable()
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(runner, id=name, marks=marks))
    return params


def _skip(case: Case, runner: Any) -> None:
    reason = runner.unavailable() or case.skip_modes.get(runner.name)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("runner", _mode_params())
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_forward(case: Case, runner: Any, dtype: type) -> None:
    _skip(case, runner)
    check_forward(case, runner, dtype)


@pytest.mark.parametrize("runner", _mode_params())
@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.name)
def test_gradient(case: Case, runner: Any) -> None:
    _skip(case, runner)
    check_gradient(case, runner)


def test_table_covers_every_primitive_and_public_op() -> None:
    covered = {name for case in CASES for name in case.covers}
    prims = {p.value for p in Prim} - {Prim.INPUT.value}  # INPUT exists only inside graphs
    # collectives need several processes: tests/test_distributed.py runs them under mpiexec
    prims -= {p.value for p in COLLECTIVES}
    prims -= {Prim.SCAN.value}  # structured (a traced body): tests/test_scan.py, test_remat.py
    assert prims - covered == set()
    assert set(F.__all__) - covered == set()


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


# --- gradient conventions at non-differentiable points (closed forms) ---------------------------

CONVENTIONS: list[tuple[str, Any, list[Any], list[Any], list[Any]]] = [
    # name, scalar fn, inputs, expected forward of the inner op, expected grads
    ("relu(0)", lambda x: sg.sum(sg.relu(x)), [[0.0, -1.0, 2.0]], [2.0], [[0.5, 0.0, 1.0]]),
    ("abs(0)", lambda x: sg.sum(sg.abs(x)), [[0.0, -3.0, 2.0]], [5.0], [[0.0, -1.0, 1.0]]),
    ("maximum tie", lambda a, b: sg.sum(sg.maximum(a, b)), [[1.0, 2.0], [1.0, 0.0]], [3.0], [[0.5, 1.0], [0.5, 0.0]]),
    ("minimum tie", lambda a, b: sg.sum(sg.minimum(a, b)), [[1.0, 2.0], [1.0, 0.0]], [1.0], [[0.5, 0.0], [0.5, 1.0]]),
    ("max ties", lambda x: sg.max(x), [[1.0, 3.0, 3.0]], [3.0], [[0.0, 0.5, 0.5]]),
    ("max ties per row", lambda x: sg.sum(sg.max(x, axis=1)), [[[2.0, 2.0, 2.0], [0.0, 5.0, 1.0]]], [7.0],
     [[[1 / 3, 1 / 3, 1 / 3], [0.0, 1.0, 0.0]]]),
    ("min ties", lambda x: sg.min(x), [[4.0, -1.0, -1.0, 0.0]], [-1.0], [[0.0, 0.5, 0.5, 0.0]]),
]  # fmt: skip


@pytest.mark.parametrize("runner", _mode_params())
@pytest.mark.parametrize(
    "name, fn, inputs, value, grads", CONVENTIONS, ids=[c[0] for c in CONVENTIONS]
)
def test_gradient_convention(
    name: str, fn: Any, inputs: list[Any], value: list[Any], grads: list[Any], runner: Runner
) -> None:
    arrays = [np.asarray(x, dtype=np.float64) for x in inputs]
    (got_value,) = runner.call(fn, arrays)
    np.testing.assert_allclose(got_value, value[0], rtol=1e-12)
    got = runner.grad(fn, arrays, tuple(range(len(arrays))))
    for g, want in zip(got, grads, strict=True):
        np.testing.assert_allclose(g, np.asarray(want), rtol=1e-12, atol=1e-15)


def test_edge_values_forward() -> None:
    zeros = sg.tensor([0.0, -0.0])
    for op in (sg.sqrt, sg.relu, sg.abs):
        np.testing.assert_array_equal(op(zeros).numpy(), [0.0, 0.0])


# --- large magnitudes: stable forward and finite gradients, in float32 ----------------------

LARGE = np.array([[1e4, 0.0, -1e4], [3e38, 3e38, -3e38]], dtype=np.float32)


@pytest.mark.parametrize("runner", _mode_params())
@pytest.mark.parametrize(
    "name, fn, want",
    [
        ("softmax", lambda x: sg.softmax(x), np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])),
        (
            "log_softmax",
            lambda x: sg.log_softmax(x),
            np.array([[0.0, -1e4, -2e4], [np.nan] * 3]),  # row 2: -6e38 is not a float32,
        ),
        ("logsumexp", lambda x: sg.logsumexp(x, axis=1), np.array([1e4, 3e38])),
    ],
    ids=["softmax", "log_softmax", "logsumexp"],
)
def test_large_magnitudes(name: str, fn: Any, want: np.ndarray, runner: Runner) -> None:
    (got,) = runner.call(fn, [LARGE])
    assert got.dtype == np.float32
    finite = np.isfinite(want)
    assert np.all(np.isfinite(got[finite])), f"{name} overflowed: {got}"
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
    (g,) = runner.grad(lambda x: sg.sum(fn(x[:1]) * 0.5), [LARGE], (0,))
    assert np.all(np.isfinite(g)), f"{name} gradient is not finite: {g}"


@pytest.mark.parametrize(
    "module",
    [
        "functional",
        "_einsum",
        "_conv",
        "_creation",
        "_norms",
        "random",
        "_composites",
        "_resample",
        "_sorting",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    import importlib

    mod = importlib.import_module(f"shapegrad.{module}")
    result = doctest.testmod(mod, extraglobs={"sg": sg}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
