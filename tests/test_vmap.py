"""``sg.vmap``: the batching interpreter against a Python loop over the batch and against
``torch.func.vmap``; per-example gradients; nesting; axes; composition; errors.

Op-table rows against a loop: a sample by default (eager, compiled numpy and C), every row
with ``-m slow``. Each primitive against ``torch.func.vmap``: ``test_prim_transforms_torch.py``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from harness import Case
from op_table import CASES

BATCH = 3


def _examples(case: Case) -> list[list[np.ndarray]]:
    """``BATCH`` independent draws of the case's inputs (float64, as the generators give)."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    return [[np.asarray(gen(rng)) for gen in case.inputs] for _ in range(BATCH)]


def _check_case(case: Case) -> None:
    per = _examples(case)
    expected = np.stack([case.fn(*[sg.tensor(a) for a in ex]).numpy() for ex in per])
    stacked = [sg.tensor(np.stack([ex[i] for ex in per])) for i in range(len(case.inputs))]
    got = sg.vmap(case.fn)(*stacked).numpy()
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


# A sample in the default suite: at least one row per primitive family.
_SAMPLE = {
    "add[outer]", "mul[scalar_vec]", "exp[strided]", "relu[small]", "less[outer]",
    "where[scalar]", "stop_gradient", "cast[int]", "sum[axis]", "max[axis]", "argmax",
    "softmax", "layer_norm[affine]", "reshape", "transpose", "index[basic]",
    "index[advanced]", "broadcast_to", "concat", "pad[pairs]", "take[axis]", "gather",
    "prim:gather", "prim:scatter_add", "embedding", "einsum[ij,jk->ik]", "prim:einsum",
    "matmul(2, 1, 3, 4)@(5, 4, 2)", "conv2d[stride_pad_bias]", "max_pool2d[k3s2p1]",
    "cross_entropy[int]", "iota", "prim:random", "dropout[key]", "cumsum", "interpolate[bilinear]",
}  # fmt: skip


def _rows(sample: bool) -> list[Any]:
    chosen = [c for c in CASES if (c.name in _SAMPLE) == sample]
    marks = [] if sample else [pytest.mark.slow]
    return [pytest.param(c, id=c.name, marks=marks) for c in chosen]


@pytest.mark.parametrize("case", _rows(sample=True))
def test_vmap_matches_a_loop_sample(case: Case) -> None:
    _check_case(case)


@pytest.mark.parametrize("case", _rows(sample=False))
def test_vmap_matches_a_loop_every_row(case: Case) -> None:
    _check_case(case)


def test_sample_covers_the_families() -> None:
    names = {c.name for c in CASES}
    assert len(_SAMPLE & names) >= 15, sorted(_SAMPLE - names)


# --- per-example gradients of an MLP -------------------------------------------------------


def _mlp_params(rng: np.random.Generator, d_in: int, d_h: int, d_out: int) -> list[sg.Tensor]:
    return [
        sg.tensor(rng.normal(size=(d_in, d_h)) / np.sqrt(d_in)),
        sg.tensor(rng.normal(size=(d_h,)) * 0.1),
        sg.tensor(rng.normal(size=(d_h, d_out)) / np.sqrt(d_h)),
        sg.tensor(rng.normal(size=(d_out,)) * 0.1),
    ]


def _mlp_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2 = params
    h = sg.relu(x @ w1 + b1)
    return sg.cross_entropy((h @ w2 + b2)[None], y[None])


def _mlp_data(rng: np.random.Generator, n: int) -> tuple[sg.Tensor, sg.Tensor]:
    x = sg.tensor(rng.normal(size=(n, 6)))
    y = sg.tensor(rng.integers(0, 4, size=(n,)).astype(np.int32))
    return x, y


def test_per_example_gradients_equal_a_loop_of_gradients() -> None:
    rng = np.random.default_rng(0)
    params = _mlp_params(rng, 6, 16, 4)
    x, y = _mlp_data(rng, 7)
    grads = sg.vmap(sg.grad(_mlp_loss), in_axes=(None, 0, 0))(params, x, y)
    for k, g in enumerate(grads):
        assert g.dtype == sg.float64
        loop = np.stack([sg.grad(_mlp_loss)(params, x[i], y[i])[k].numpy() for i in range(7)])
        np.testing.assert_allclose(g.numpy(), loop, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_per_example_gradients_compile(backend: str) -> None:
    """The batched function traces to an ordinary graph: compiled equals eager."""
    rng = np.random.default_rng(1)
    params = _mlp_params(rng, 6, 16, 4)
    x, y = _mlp_data(rng, 5)
    fn = sg.vmap(sg.grad(_mlp_loss), in_axes=(None, 0, 0))
    eager = fn(params, x, y)
    compiled = sg.compile(fn, backend=backend)(params, x, y)
    for e, c in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)


def test_grad_of_vmap_is_the_gradient_of_the_batch_sum() -> None:
    rng = np.random.default_rng(2)
    w = sg.tensor(rng.normal(size=(4, 3)))
    xs = sg.tensor(rng.normal(size=(5, 4)))

    def total(w: sg.Tensor) -> sg.Tensor:
        return sg.vmap(lambda x: sg.tanh(x @ w).sum(), in_axes=0)(xs).sum()

    g = sg.grad(total)(w)
    expected = sg.grad(lambda w: sg.tanh(xs @ w).sum())(w)
    np.testing.assert_allclose(g.numpy(), expected.numpy(), rtol=1e-12)


def test_vmap_of_jvp_equals_a_loop() -> None:
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(4, 5))
    ts = rng.normal(size=(4, 5))

    def f(x: sg.Tensor, t: sg.Tensor) -> sg.Tensor:
        return sg.jvp(lambda x: sg.sin(x) * x.sum(), (x,), (t,))[1]

    got = sg.vmap(f)(sg.tensor(xs), sg.tensor(ts)).numpy()
    loop = np.stack([f(sg.tensor(a), sg.tensor(b)).numpy() for a, b in zip(xs, ts, strict=True)])
    np.testing.assert_allclose(got, loop, rtol=1e-12)


def test_jvp_of_vmap_equals_the_batched_tangent() -> None:
    rng = np.random.default_rng(4)
    xs, ts = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    batched = sg.vmap(lambda x: sg.exp(x) * x.sum())
    _, tangent = sg.jvp(batched, (sg.tensor(xs),), (sg.tensor(ts),))
    expected = np.exp(xs) * ts * xs.sum(1, keepdims=True) + np.exp(xs) * ts.sum(1, keepdims=True)
    np.testing.assert_allclose(tangent.numpy(), expected, rtol=1e-12)


# --- axes and nesting --------------------------------------------------------------------


def test_nested_vmap_is_an_outer_product() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    dot = lambda u, v: (u * v).sum()  # noqa: E731
    got = sg.vmap(sg.vmap(dot, in_axes=(None, 0)), in_axes=(0, None))(sg.tensor(a), sg.tensor(b))
    np.testing.assert_allclose(got.numpy(), a @ b.T, rtol=1e-12)


def test_in_axes_none_and_nonzero_and_out_axes_one() -> None:
    rng = np.random.default_rng(6)
    w, xs = rng.normal(size=(4, 2)), rng.normal(size=(4, 6))  # batch on xs' axis 1
    fn = sg.vmap(lambda w, x: sg.tanh(x @ w), in_axes=(None, 1), out_axes=1)
    got = fn(sg.tensor(w), sg.tensor(xs)).numpy()
    assert got.shape == (2, 6)
    np.testing.assert_allclose(got, np.tanh(xs.T @ w).T, rtol=1e-12)


def test_pytree_in_axes_and_outputs() -> None:
    rng = np.random.default_rng(7)
    d = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))}
    fn = sg.vmap(lambda p: (p["a"] * p["b"], p["b"].sum()), in_axes=({"a": 0, "b": None},),
                 out_axes=(0, None))  # fmt: skip
    prod, total = fn({"a": sg.tensor(d["a"]), "b": sg.tensor(d["b"])})
    np.testing.assert_allclose(prod.numpy(), d["a"] * d["b"], rtol=1e-12)
    np.testing.assert_allclose(total.numpy(), d["b"].sum(), rtol=1e-12)


def test_dict_output_with_dict_out_axes() -> None:
    xs = np.arange(6.0).reshape(3, 2)
    fn = sg.vmap(lambda x: {"s": x.sum(), "x": x * 2.0}, out_axes={"s": 0, "x": 1})
    out = fn(sg.tensor(xs))
    np.testing.assert_allclose(out["s"].numpy(), xs.sum(1))
    np.testing.assert_allclose(out["x"].numpy(), (xs * 2.0).T)


def test_unbatched_output_is_broadcast() -> None:
    got = sg.vmap(lambda x: sg.ones((2,)))(sg.tensor(np.zeros((3, 5))))
    assert got.shape == (3, 2)


def _scan_run(h: sg.Tensor, x: sg.Tensor, w: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    def body(c: sg.Tensor, xi: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        c = sg.tanh(c @ w + xi)  # w: a captured loop invariant
        return c, c * 2.0

    return sg.scan(body, h, x, reverse=True)


def _scan_loss(h: sg.Tensor, x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
    c, ys = _scan_run(h, x, w)
    return c.sum() + (ys**2).sum()


def _against_loop(fn: Callable[..., Any], args: list[np.ndarray], axes: tuple[Any, ...]) -> None:
    got, _ = sg.tree.flatten(sg.vmap(fn, in_axes=axes)(*[sg.tensor(a) for a in args]))
    size = next(a.shape[0] for a, ax in zip(args, axes, strict=True) if ax == 0)
    loop = []
    for b in range(size):
        example = [a[b] if ax == 0 else a for a, ax in zip(args, axes, strict=True)]
        loop.append(sg.tree.flatten(fn(*[sg.tensor(e) for e in example]))[0])
    for k, g in enumerate(got):
        np.testing.assert_allclose(
            g.numpy(), np.stack([row[k].numpy() for row in loop]), rtol=1e-12, atol=1e-14
        )


@pytest.mark.parametrize(
    "axes", [(0, 0, 0), (0, 0, None), (0, None, None), (None, None, 0)], ids=str
)
def test_scan_inside_vmap_batches_its_body(axes: tuple[Any, ...]) -> None:
    rng = np.random.default_rng(8)
    full = [rng.normal(size=(3, 2)), rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 2, 2))]
    args = [a if ax == 0 else a[0] for a, ax in zip(full, axes, strict=True)]
    _against_loop(_scan_run, args, axes)
    _against_loop(sg.grad(_scan_loss, argnums=(0, 1, 2)), args, axes)


def test_scan_and_checkpoint_per_example_gradients_compile_to_c() -> None:
    rng = np.random.default_rng(9)
    args = [sg.tensor(rng.normal(size=s)) for s in [(3, 2), (3, 4, 2), (3, 2, 2)]]
    fn = sg.vmap(sg.grad(_scan_loss, argnums=(0, 1, 2)))
    for c, e in zip(sg.compile(fn, backend="c")(*args), fn(*args), strict=True):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)
    ck = sg.grad(lambda h, w: sg.checkpoint(lambda h: sg.tanh(h @ w))(h).sum(), argnums=(0, 1))
    _against_loop(ck, [a.numpy() for a in (args[0], args[2])], (0, 0))


def test_vmap_inside_a_scan_body() -> None:
    rng = np.random.default_rng(10)
    h0, xs = rng.normal(size=(3, 2)), rng.normal(size=(4, 3, 2))

    def body(c: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return sg.vmap(lambda a, b: sg.tanh(a * b))(c, x), c.sum(1)

    h, _ = sg.scan(body, sg.tensor(h0), sg.tensor(xs))
    expected = h0
    for x in xs:
        expected = np.tanh(expected * x)
    np.testing.assert_allclose(h.numpy(), expected, rtol=1e-12)


# --- errors -------------------------------------------------------------------------------


def test_mismatched_batch_sizes_name_the_arguments() -> None:
    fn = sg.vmap(lambda a, b: a + b)
    with pytest.raises(sg.ShapeError, match=r"argument 0 has size 3.*argument 1 has size 4"):
        fn(sg.tensor(np.zeros((3, 2))), sg.tensor(np.zeros((4, 2))))


def test_bad_axes_are_clear_errors() -> None:
    x = sg.tensor(np.zeros((3, 2)))
    with pytest.raises(sg.ShapeError, match="axis 2 is out of range for rank 2"):
        sg.vmap(lambda a: a, in_axes=2)(x)
    with pytest.raises(ValueError, match="one entry per argument"):
        sg.vmap(lambda a, b: a, in_axes=(0,))(x, x)
    with pytest.raises(ValueError, match="no argument has a batch axis"):
        sg.vmap(lambda a: a, in_axes=None)(x)
    with pytest.raises(ValueError, match="out_axes is None"):
        sg.vmap(lambda a: a, out_axes=None)(x)


def test_per_example_shape_errors_use_the_example_shape() -> None:
    x = sg.tensor(np.zeros((3, 2)))
    with pytest.raises(sg.ShapeError, match=r"cannot reshape \[2\]"):
        sg.vmap(lambda a: a.reshape(3))(x)


def test_collectives_have_no_batching_rule() -> None:
    from shapegrad.ops import prims

    class _Comm:
        size = 1

    with pytest.raises(NotImplementedError, match="collective all_reduce"):
        sg.vmap(lambda a: prims.all_reduce(a, _Comm()))(sg.tensor(np.zeros((3, 2))))


# --- against torch.func.vmap --------------------------------------------------------------

torch = pytest.importorskip("torch", reason="torch.func.vmap is the reference")


def _torch_pairs() -> list[
    tuple[str, Callable[..., Any], Callable[..., Any], list[tuple[int, ...]]]
]:
    tf = torch.nn.functional
    return [
        ("matvec", lambda w, x: w @ x, lambda w, x: w @ x, [(4, 3), (3,)]),
        ("softmax", lambda x: sg.softmax(x, axis=-1), lambda x: tf.softmax(x, -1), [(2, 5)]),
        ("layer_norm", lambda x: sg.layer_norm(x), lambda x: tf.layer_norm(x, (5,)), [(2, 5)]),
        ("outer_sum", lambda a, b: (a[:, None] * b).sum(0), lambda a, b: (a[:, None] * b).sum(0), [(3,), (4,)]),
        ("gelu_max", lambda x: sg.gelu(x).max(axis=0), lambda x: tf.gelu(x, approximate="tanh").max(0).values, [(3, 4)]),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name,ours,theirs,shapes", _torch_pairs(), ids=[p[0] for p in _torch_pairs()]
)
def test_vmap_matches_torch_func_vmap(name: str, ours: Any, theirs: Any, shapes: list[Any]) -> None:  # fmt: skip
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [rng.normal(size=(6, *s)) for s in shapes]
    got = sg.vmap(ours)(*[sg.tensor(a) for a in arrays]).numpy()
    expected = torch.func.vmap(theirs)(*[torch.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_per_example_gradients_match_torch_func() -> None:
    rng = np.random.default_rng(9)
    params = _mlp_params(rng, 6, 16, 4)
    x, y = _mlp_data(rng, 8)
    ours = sg.vmap(sg.grad(_mlp_loss), in_axes=(None, 0, 0))(params, x, y)

    def torch_loss(p: list[Any], xi: Any, yi: Any) -> Any:
        h = torch.relu(xi @ p[0] + p[1])
        return torch.nn.functional.cross_entropy((h @ p[2] + p[3])[None], yi[None])

    tp = [torch.tensor(p.numpy()) for p in params]
    theirs = torch.func.vmap(torch.func.grad(torch_loss), in_dims=(None, 0, 0))(
        tp, torch.tensor(x.numpy()), torch.tensor(y.numpy()).long()
    )
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


# --- custom_vjp and nesting with grad ------------------------------------------------------


@sg.custom_vjp
def _clip_gradient(x: sg.Tensor) -> sg.Tensor:
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (sg.clip(g, -1.0, 1.0),))


def test_custom_vjp_backward_is_honoured_by_an_inner_grad() -> None:
    xs = np.array([[0.5, -2.0], [3.0, 0.1]])
    fn = sg.vmap(sg.grad(lambda x: (_clip_gradient(x) * x * 4.0).sum()))
    got = fn(sg.tensor(xs)).numpy()
    # d/dx of c(x) * x * 4: 4 * c(x) from the plain factor, clip(4 * x) through the marker
    np.testing.assert_allclose(got, 4.0 * xs + np.clip(4.0 * xs, -1.0, 1.0), rtol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "numpy"])
def test_custom_vjp_under_an_outer_grad_matches_a_loop(mode: str) -> None:
    """``grad(vmap(f))`` applies the custom backward per example; a shared (``in_axes=None``)
    argument gets the sum of the per-example gradients."""
    rng = np.random.default_rng(3)
    w, xs = rng.normal(size=3) * 2.0, rng.normal(size=(4, 3)) * 2.0

    def f(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return (_clip_gradient(w * x) ** 2).sum() + (_clip_gradient(w) * x).sum()

    def total(w: sg.Tensor, xs: sg.Tensor) -> sg.Tensor:
        return sg.vmap(f, in_axes=(None, 0))(w, xs).sum()

    fn = sg.grad(total, argnums=(0, 1))
    gw, gx = (fn if mode == "eager" else sg.compile(fn, backend=mode))(sg.tensor(w), sg.tensor(xs))
    loop = [sg.grad(f, argnums=(0, 1))(sg.tensor(w), sg.tensor(x)) for x in xs]
    np.testing.assert_allclose(gw.numpy(), sum(g.numpy() for g, _ in loop), rtol=1e-12)
    np.testing.assert_allclose(gx.numpy(), np.stack([g.numpy() for _, g in loop]), rtol=1e-12)
    # by hand: the cotangent of w * x is 2 w x, of the marker over w is x, each clipped
    clipped = np.clip(2.0 * w * xs, -1.0, 1.0)
    np.testing.assert_allclose(gx.numpy(), clipped * w + w, rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), (clipped * xs + np.clip(xs, -1, 1)).sum(0), rtol=1e-12)


def test_nested_vmap_of_grad_is_a_per_pair_gradient() -> None:
    rng = np.random.default_rng(11)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    g = sg.grad(lambda u, v: sg.tanh(u * v).sum())
    got = sg.vmap(sg.vmap(g, in_axes=(None, 0)), in_axes=(0, None))(sg.tensor(a), sg.tensor(b))
    expected = (1 - np.tanh(a[:, None] * b[None]) ** 2) * b[None]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def _check_compiled(case: Case, backend: str) -> None:
    """The batched function traces to an ordinary graph that equals a loop of examples."""
    per = _examples(case)
    expected = np.stack([case.fn(*[sg.tensor(a) for a in ex]).numpy() for ex in per])
    stacked = [sg.tensor(np.stack([ex[i] for ex in per])) for i in range(len(case.inputs))]
    got = sg.compile(sg.vmap(case.fn), backend=backend)(*stacked).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


_IN_SAMPLE = [c for c in CASES if c.name in _SAMPLE]


@pytest.mark.parametrize(
    "case,backend",
    [pytest.param(c, "numpy", id=f"numpy-{c.name}") for c in _IN_SAMPLE[:12]]
    + [pytest.param(c, "c", id=f"c-{c.name}") for c in _IN_SAMPLE[::9]],
)
def test_vmap_of_op_table_rows_compiles(case: Case, backend: str) -> None:
    _check_compiled(case, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_vmap_of_every_op_table_row_compiled(case: Case, backend: str) -> None:
    _check_compiled(case, backend)


def test_per_example_gradients_of_a_typed_paramlist() -> None:
    """vmap(grad) over a typed ParamList: the per-example gradients carry a batch dim the
    ParamList's annotations do not declare, so they come back as a plain tuple (a typed
    rebuild raised ShapeError), each equal to a loop of grads."""
    from shapegrad import Float, Tensor

    class Params(sg.ParamList[Float[Tensor, "10 4"], Float[Tensor, "10"]]):
        names = ("w", "b")

    def loss(p: Params, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return ((x @ p.w.T + p.b - y) ** 2).sum()

    rng = np.random.default_rng(3)
    params = Params.init(sg.nn.init.kaiming, seed=0, dtype=sg.float64)
    xs, ys = rng.standard_normal((6, 4)), rng.standard_normal((6, 10))
    got = sg.vmap(sg.grad(loss), in_axes=(None, 0, 0))(params, sg.tensor(xs), sg.tensor(ys))
    assert type(got) is tuple and [g.shape for g in got] == [(6, 10, 4), (6, 10)]
    for i in range(6):
        want = sg.grad(loss)(params, sg.tensor(xs[i]), sg.tensor(ys[i]))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.numpy()[i], w.numpy(), rtol=1e-12, atol=1e-12)
