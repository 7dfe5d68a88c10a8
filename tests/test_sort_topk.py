"""sort / argsort / topk beyond the op table: PyTorch parity, gradients against float64
finite differences, compiled C and the NumPy backend against eager on the shapes the
kernel distinguishes (selection and merge sort, runs, strided rows, low-precision and
integer inputs, NaN), vmap against a loop, forward mode, the loop IR and clear errors.

Ordering convention (checked here against PyTorch): stable, NaN is the largest value.
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.sorting import SELECT_MAX_K, sort_method

try:
    import torch
except ImportError:  # pragma: no cover - torch is a dev extra
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

RNG = np.random.default_rng(25)


def _ties(*shape: int) -> np.ndarray:
    return RNG.integers(-4, 5, shape).astype(np.float64) * 0.25


def _with_nans(*shape: int) -> np.ndarray:
    x = _ties(*shape)
    x[RNG.random(shape) < 0.2] = np.nan
    return x


# --- PyTorch parity ---------------------------------------------------------------------


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_match_torch_stable_sort(dtype: Any, axis: int, descending: bool) -> None:
    x = _with_nans(7, 9, 5).astype(dtype)
    want = torch.sort(torch.from_numpy(x), dim=axis, descending=descending, stable=True)
    values = sg.sort(sg.tensor(x), axis=axis, descending=descending).numpy()
    positions = sg.argsort(sg.tensor(x), dim=axis, descending=descending).numpy()
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(positions, want.indices.numpy())
    assert positions.dtype == np.int32


@needs_torch
@pytest.mark.parametrize("k", [1, 3, 9])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(k: int, largest: bool) -> None:
    x = RNG.standard_normal((6, 9))  # no ties: torch.topk's order among ties is unspecified
    x[2, 4] = np.nan  # NaN is the largest value for both
    values, indices = sg.topk(sg.tensor(x), k, largest=largest)
    want = torch.topk(torch.from_numpy(x), k, dim=-1, largest=largest)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


def test_topk_ties_keep_the_earlier_position() -> None:
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]])
    values, indices = sg.topk(sg.tensor(x), 2)
    assert indices.tolist() == [[1, 2]] and values.tolist() == [[3.0, 3.0]]
    values, indices = sg.topk(sg.tensor(x), 2, largest=False)
    assert indices.tolist() == [[0, 3]]


# --- gradients: float64 central differences with a random cotangent ----------------------


def _check_grad(fn: Any, x: np.ndarray, eps: float = 1e-6) -> None:
    cot = RNG.standard_normal(np.shape(fn(sg.tensor(x)).numpy()))

    def scalar(t: sg.Tensor) -> sg.Tensor:
        return sg.sum(fn(t) * sg.tensor(cot))

    got = sg.grad(scalar)(sg.tensor(x)).numpy()
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        want[i] = (scalar(sg.tensor(up)).item() - scalar(sg.tensor(down)).item()) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    "name, fn",
    [
        ("sort", lambda t: sg.sort(t, axis=1)),
        ("sort_desc_axis0", lambda t: sg.sort(t, axis=0, descending=True) ** 2),
        ("topk", lambda t: sg.topk(t, 3)[0]),
        ("topk_smallest_axis1", lambda t: sg.topk(t, 2, axis=1, largest=False)[0]),
        ("topk_all", lambda t: sg.exp(sg.topk(t, 5, axis=2)[0])),
    ],
)
def test_gradients_match_finite_differences(name: str, fn: Any) -> None:
    x = RNG.permutation(60).reshape(3, 4, 5) * 0.02 + RNG.uniform(0, 0.01)  # no ties
    _check_grad(fn, x)


def test_gradient_goes_to_the_chosen_positions_only() -> None:
    x = sg.tensor([[0.5, 2.0, -1.0, 3.0]])
    g = sg.grad(lambda t: sg.sum(sg.topk(t, 2)[0] * sg.tensor([[10.0, 1.0]])))(x)
    assert g.tolist() == [[0.0, 1.0, 0.0, 10.0]]


# --- compiled C and the NumPy backend against eager --------------------------------------

_KERNEL_CASES = [
    # (name, shape, fn): every method, strided rows (axis not last), runs of the merge sort
    ("merge_long", (3, 1000), lambda t: sg.argsort(t, descending=True)),
    ("merge_odd_runs", (2, 5, 77), lambda t: sg.argsort(t, axis=2)),
    ("merge_strided", (40, 3, 6), lambda t: sg.argsort(t, axis=0, descending=True)),
    ("select", (4, 300), lambda t: sg.topk(t, SELECT_MAX_K)[1]),
    ("select_strided", (5, 90, 2), lambda t: sg.topk(t, 4, axis=1, largest=False)[1]),
    ("topk_merge", (3, 40), lambda t: sg.topk(t, 30)[1]),
    ("one_row", (129,), lambda t: sg.sort(t)),
    ("k_zero", (3, 4), lambda t: sg.topk(t, 0)[0]),
    ("length_one", (5, 1), lambda t: sg.argsort(t)),
]


@needs_cc
@pytest.mark.parametrize("name, shape, fn", _KERNEL_CASES, ids=[c[0] for c in _KERNEL_CASES])
@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_compiled_matches_eager(name: str, shape: tuple[int, ...], fn: Any, backend: str) -> None:
    x = _with_nans(*shape).astype(np.float32)
    want = fn(sg.tensor(x)).numpy()
    got = sg.compile(fn, backend=backend)(sg.tensor(x)).numpy()
    np.testing.assert_array_equal(got, want)


@needs_cc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "bool", "float64"])
def test_compiled_sorts_every_element_type(dtype: str) -> None:
    x = sg.tensor(_with_nans(4, 50) if dtype.startswith(("float", "bf")) else _ties(4, 50) * 4)
    x = x.astype(dtype) if dtype != "bool" else x > 0

    def fn(t: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
        return sg.argsort(t), sg.argsort(t, descending=True), sg.topk(t, 5)[1]

    for got, want in zip(sg.compile(fn, backend="c")(x), fn(x), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@needs_cc
def test_compiled_gradient_matches_eager() -> None:
    x = RNG.standard_normal((6, 40))
    cot = RNG.standard_normal((6, 3))

    def loss(t: sg.Tensor) -> sg.Tensor:
        return sg.sum(sg.topk(t, 3)[0] * sg.tensor(cot)) + sg.sum(sg.sort(t, axis=0) ** 2)

    got = sg.compile(sg.grad(loss), backend="c")(sg.tensor(x)).numpy()
    np.testing.assert_allclose(got, sg.grad(loss)(sg.tensor(x)).numpy(), rtol=1e-12)


@needs_cc
def test_sorts_inside_a_scanned_layer_compile_with_their_gradient() -> None:
    xs = RNG.standard_normal((5, 4, 30))
    h0 = RNG.standard_normal((4, 30))

    def body(h: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        values, _ = sg.topk(h + x, 3)
        return sg.sort(h * x, axis=1, descending=True) * 0.5 + h, values

    def loss(h: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        last, ys = sg.scan(body, h, x)
        return sg.sum(last) + sg.sum(ys * ys)

    args = (sg.tensor(h0), sg.tensor(xs))
    np.testing.assert_allclose(sg.compile(loss, backend="c")(*args).item(), loss(*args).item(), rtol=1e-12)
    got = sg.compile(sg.grad(loss), backend="c")(*args).numpy()
    np.testing.assert_allclose(got, sg.grad(loss)(*args).numpy(), rtol=1e-10, atol=1e-12)


@needs_cc
def test_rows_are_split_across_the_thread_team() -> None:
    x = sg.tensor(RNG.standard_normal((256, 512)).astype(np.float32))
    lowered = sg.compile(lambda t: sg.argsort(t), backend="c").trace(x).lower()
    sorts = [
        (k, s) for k in lowered.program.kernels for s in L.walk(k.body) if isinstance(s, L.SortRow)
    ]
    assert len(sorts) == 1
    kernel, stmt = sorts[0]
    assert isinstance(kernel.body[0], L.Loop) and kernel.body[0].kind == "parallel"
    assert stmt.method == "merge" and stmt.n == 512 and stmt.k == 512
    source = lowered.source
    at = source.index("argsort (merge")
    assert "#pragma omp for" in source[source.rindex("/* k", 0, at) : at]


def test_method_choice() -> None:
    assert sort_method(1000, 5) == "select"
    assert sort_method(1000, SELECT_MAX_K + 1) == "merge"
    assert sort_method(8, 8) == "merge"  # a full sort never selects


# --- vmap and forward mode ---------------------------------------------------------------


def test_vmap_matches_a_loop() -> None:
    xs = _ties(5, 4, 7)

    def f(x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
        values, indices = sg.topk(x, 3, axis=0)
        return sg.argsort(x, descending=True), values, indices

    got = sg.vmap(f, in_axes=1)(sg.tensor(xs))
    for b in range(xs.shape[1]):
        for g, w in zip(got, f(sg.tensor(xs[:, b])), strict=True):
            np.testing.assert_array_equal(g.numpy()[b], w.numpy())


def test_vmap_of_grad_matches_a_loop_of_grads() -> None:
    xs = RNG.permutation(48).reshape(4, 3, 4) * 0.5

    def loss(x: sg.Tensor) -> sg.Tensor:
        return sg.sum(sg.topk(x, 2)[0] ** 2) + sg.sum(sg.sort(x, axis=0)[0])

    got = sg.vmap(sg.grad(loss))(sg.tensor(xs)).numpy()
    for b in range(xs.shape[0]):
        np.testing.assert_allclose(got[b], sg.grad(loss)(sg.tensor(xs[b])).numpy(), rtol=1e-12)


def test_jvp_moves_the_tangent_with_the_values() -> None:
    x = RNG.permutation(12).reshape(3, 4) * 1.0
    t = RNG.standard_normal((3, 4))
    out, tangent = sg.jvp(lambda a: sg.sort(a, axis=1), (sg.tensor(x),), (sg.tensor(t),))
    order = np.argsort(x, axis=1)
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, order, 1))
    np.testing.assert_allclose(tangent.numpy(), np.take_along_axis(t, order, 1), rtol=1e-12)


# --- errors --------------------------------------------------------------------------------


def test_k_out_of_range_names_op_shape_dim_and_line() -> None:
    x = sg.tensor(np.zeros((2, 5), np.float32))
    for k in (6, -1):
        with pytest.raises(sg.ShapeError, match=r"topk: k=.* from 0 to 5.* dimension 1 of \[2, 5\]") as caught:
            sg.topk(x, k)
        assert caught.value.location and "test_sort_topk.py" in caught.value.location
    with pytest.raises(sg.ShapeError, match=r"topk: k=2\.0 must be an int"):
        sg.topk(x, 2.0)  # type: ignore[arg-type]


def test_bad_axis_and_scalars_are_clear_errors() -> None:
    x = sg.tensor(np.zeros((2, 5), np.float32))
    with pytest.raises(sg.ShapeError, match="argsort: axis 2 is out of range for a rank-2"):
        sg.argsort(x, axis=2)
    with pytest.raises(sg.ShapeError, match="sort: needs a tensor with an axis"):
        sg.sort(sg.tensor(1.0))
    with pytest.raises(sg.ShapeError, match=r"argsort: k=4 is out of range for dimension 0 of size 2"):
        from shapegrad.ops import prims

        prims.argsort(x, 0, k=4)


def test_pytorch_spellings() -> None:
    x = sg.tensor(_ties(3, 4))
    np.testing.assert_array_equal(x.argsort(dim=0).numpy(), sg.argsort(x, axis=0).numpy())
    np.testing.assert_array_equal(x.topk(2, dim=0)[0].numpy(), sg.topk(x, 2, axis=0)[0].numpy())
    with pytest.raises(TypeError, match=r"torch.sort returns \(values, indices\).*sg.sort\(x, axis=0\)"):
        x.sort(dim=0)
    with pytest.raises(TypeError, match="argsort: got both axis=0 and PyTorch's dim=1"):
        sg.argsort(x, 0, dim=1)


@needs_cc
def test_compiled_errors_name_the_op_at_trace_time() -> None:
    with pytest.raises(sg.ShapeError, match="topk: k=9"):
        sg.compile(lambda t: sg.topk(t, 9)[0], backend="c")(sg.tensor(np.zeros((2, 4))))


# --- CUDA: the kernel compiles (one thread per row) ------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (no CUDA toolkit)")
def test_cuda_source_compiles_with_nvcc() -> None:
    from shapegrad.backends.cuda import generate
    from shapegrad.backends.cuda.render import INCLUDES, render_cuda_unit
    from shapegrad.backends.cuda.toolchain import compile_check

    def graph(fn: Any, *xs: np.ndarray) -> Any:
        return sg.compile(fn, backend="numpy").graph(*xs)

    x = _with_nans(6, 70).astype(np.float32)
    programs = [
        generate(graph(lambda t: sg.argsort(t, axis=0, descending=True), x))[0],
        generate(graph(lambda t: sg.topk(t, 4)[0], x.astype(np.float16)))[0],
        generate(graph(sg.grad(lambda t: sg.sum(sg.sort(t) ** 2)), x.astype(np.float64)))[0],
    ]
    units = [render_cuda_unit(p, namespace=f"p{n}") for n, p in enumerate(programs)]
    source = INCLUDES + "\n".join(units)
    assert source.count("argsort (") >= 3
    compile_check(source)


# --- ANE: exact ranks, or a clear error for rows too long to rank ---------------------------


def test_ane_ranks_short_rows_and_refuses_long_ones_clearly() -> None:
    from shapegrad.backends.ane import AneLoweringError, lower_to_mil
    from shapegrad.backends.ane._mil import CoremltoolsMissing, coremltools

    try:
        coremltools()
    except CoremltoolsMissing:
        pytest.skip("the ane backend needs coremltools")
    from ane_support import run_lowered, traced_graph

    x = _with_nans(3, 40).astype(np.float32)
    mil = lower_to_mil(traced_graph(lambda t: sg.argsort(t, axis=0, descending=True), [x]))
    (got,) = run_lowered(mil, [x])
    np.testing.assert_array_equal(got, sg.argsort(sg.tensor(x), axis=0, descending=True).numpy())
    long_rows = np.zeros((2, 3000), np.float32)
    with pytest.raises(AneLoweringError, match=r"argsort: a row of 3000 elements.*at most 2048.*backend='c'"):
        lower_to_mil(traced_graph(lambda t: sg.topk(t, 3)[0], [long_rows]))
