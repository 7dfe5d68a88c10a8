"""Forward mode and Jacobians (``sg.jvp``, ``linearize``, ``jacrev``, ``jacfwd``, ``hessian``)
against ``torch.func`` and float64 central differences, eager and compiled; the compile
retrace warning.

The op-table sweep checks ``jvp(f)(x, t) == d/de f(x + e t)`` (central differences of the
NumPy reference) and ``jvp(grad <ct, f>)(x, t)`` (a Hessian-vector product, which runs the
VJP of every VJP rule the op's gradient uses) against central differences of the gradient.
The default suite runs a sample; ``-m slow`` runs every differentiable row (eager, numpy
and C). Each primitive against ``torch.func.jvp``: ``test_prim_transforms_torch.py``.
"""

from __future__ import annotations

import doctest
import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from harness import Case
from op_table import GRAD_CASES
from shapegrad.jit import RetraceWarning
from shapegrad.ops.protocol import NON_DIFFERENTIABLE, Prim
from shapegrad.ops.vjp import vjp_rule

torch = pytest.importorskip("torch", reason="the torch.func references need PyTorch")
tfunc = pytest.importorskip("torch.func", reason="the torch.func references need PyTorch")


def f64(a: Any) -> sg.Tensor:
    return sg.tensor(np.asarray(a, dtype=np.float64), dtype="float64")


def close(got: Any, want: Any, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    got = got.numpy() if isinstance(got, sg.Tensor) else np.asarray(got)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# --- an MLP loss, written once for shapegrad and once for PyTorch -------------------------

RNG = np.random.default_rng(0)
W1, B1 = RNG.standard_normal((4, 3)), RNG.standard_normal(4)
W2, B2 = RNG.standard_normal((2, 4)), RNG.standard_normal(2)
X, Y = RNG.standard_normal((5, 3)), np.array([0, 1, 1, 0, 1], dtype=np.int32)


def sg_logits(w1: sg.Tensor, b1: sg.Tensor, w2: sg.Tensor, b2: sg.Tensor) -> sg.Tensor:
    return sg.tanh(f64(X) @ w1.T + b1) @ w2.T + b2


def sg_loss(w1: sg.Tensor, b1: sg.Tensor, w2: sg.Tensor, b2: sg.Tensor) -> sg.Tensor:
    return sg.cross_entropy(sg_logits(w1, b1, w2, b2), sg.tensor(Y))


def th_logits(w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    return torch.tanh(torch.from_numpy(X) @ w1.T + b1) @ w2.T + b2


def th_loss(w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    return torch.nn.functional.cross_entropy(
        th_logits(w1, b1, w2, b2), torch.from_numpy(Y.astype(np.int64))
    )


PARAMS = (W1, B1, W2, B2)


def sg_params() -> tuple[sg.Tensor, ...]:
    return tuple(f64(p) for p in PARAMS)


def th_params() -> tuple[Any, ...]:
    return tuple(torch.from_numpy(p.copy()) for p in PARAMS)


TANGENTS = tuple(np.random.default_rng(1).standard_normal(p.shape) for p in PARAMS)


def compiled(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return fn if mode == "eager" else sg.compile(fn, backend=mode)


MODES = ["eager", "numpy", "c"]


@pytest.mark.parametrize("mode", MODES)
def test_jvp_of_mlp_loss_and_logits_matches_torch(mode: str) -> None:
    tangents = tuple(f64(t) for t in TANGENTS)
    th_tangents = tuple(torch.from_numpy(t) for t in TANGENTS)
    for sg_f, th_f in ((sg_loss, th_loss), (sg_logits, th_logits)):
        run = compiled(lambda *a, sg_f=sg_f: sg.jvp(sg_f, a[:4], a[4:]), mode)
        out, tangent = run(*sg_params(), *tangents)
        want_out, want_tangent = tfunc.jvp(th_f, th_params(), th_tangents)
        close(out, want_out)
        close(tangent, want_tangent)


@pytest.mark.parametrize("mode", MODES)
def test_jacobians_and_hessian_of_mlp_match_torch(mode: str) -> None:
    params = sg_params()
    jr = compiled(sg.jacrev(sg_logits, argnums=0), mode)(*params)
    jf = compiled(sg.jacfwd(sg_logits, argnums=(0, 1)), mode)(*params)
    want = tfunc.jacrev(th_logits, argnums=(0, 1))(*th_params())
    assert jr.shape == (5, 2, 4, 3)
    close(jr, want[0])
    close(jf[0], want[0])
    close(jf[1], want[1])
    h = compiled(sg.hessian(sg_loss, argnums=(0, 2)), mode)(*params)
    want_h = tfunc.hessian(th_loss, argnums=(0, 2))(*th_params())
    for i in range(2):
        for j in range(2):
            close(h[i][j], want_h[i][j], rtol=1e-9, atol=1e-11)


def test_jacfwd_of_jacrev_equals_jacrev_of_jacrev() -> None:
    params = sg_params()
    a = sg.jacrev(sg.jacrev(sg_loss, 1), 1)(*params)
    b = sg.hessian(sg_loss, 1)(*params)
    close(a, b.numpy(), rtol=1e-10)
    assert a.shape == (4, 4)


def test_jvp_of_pytrees_and_linearize_reuses_one_linearization() -> None:
    def f(p: dict[str, sg.Tensor], x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return sg.sin(p["a"] * x), (p["b"] * x).sum()

    p = {"a": f64([0.5, -1.0]), "b": f64([2.0, 3.0])}
    x = f64([1.5, 0.25])
    tp = {"a": f64([1.0, 0.0]), "b": f64([0.0, 1.0])}
    tx = f64([0.5, 2.0])
    (o1, o2), (t1, t2) = sg.jvp(f, (p, x), (tp, tx))
    a, b, xv = p["a"].numpy(), p["b"].numpy(), x.numpy()
    close(o1, np.sin(a * xv))
    close(t1, np.cos(a * xv) * (tp["a"].numpy() * xv + a * tx.numpy()))
    close(t2, float(np.sum(tp["b"].numpy() * xv + b * tx.numpy())))
    # linearize: the function runs once, its linear map many times
    calls = []

    def g(x: sg.Tensor) -> sg.Tensor:
        calls.append(1)
        return sg.exp(x) * x

    y, g_jvp = sg.linearize(g, x)
    for t in ([1.0, 0.0], [0.0, 1.0], [2.0, -1.0]):
        close(g_jvp(f64(t)), np.exp(xv) * (1 + xv) * np.array(t))
    assert len(calls) == 1
    close(y, np.exp(xv) * xv)


def test_vjp_pullback_can_be_called_again_and_differentiated() -> None:
    x = f64([0.3, 0.7])
    out, pullback = sg.vjp(lambda x: sg.exp(x) * x, x)
    (first,) = pullback(f64([1.0, 0.0]))
    (second,) = pullback(f64([0.0, 1.0]))  # the tape is still there
    xv = x.numpy()
    close(first, [np.exp(0.3) * 1.3, 0.0])
    close(second, [0.0, np.exp(0.7) * 1.7])

    def grad_through_vjp(x: sg.Tensor) -> sg.Tensor:
        o, pb = sg.vjp(lambda x: sg.exp(x) * x, x)
        return pb(sg.ones_like(o))[0].sum()

    close(sg.grad(grad_through_vjp)(x), np.exp(xv) * (2 + xv))


def test_non_float_outputs_get_zero_tangents_and_jvp_errors_name_the_problem() -> None:
    x = f64([1.0, -2.0])
    (y, idx), (ty, tidx) = sg.jvp(lambda x: (x * 2.0, sg.argmax(x, axis=0)), (x,), (x,))
    close(ty, [2.0, -4.0])
    assert tidx.dtype == sg.int32 and tidx.item() == 0
    with pytest.raises(
        sg.ShapeError, match=r"tangent 0 has shape \[3\] but its primal has shape \[2\]"
    ):
        sg.jvp(sg.sin, (x,), (f64([1.0, 2.0, 3.0]),))
    with pytest.raises(TypeError, match="tangent 0 is float32 but its primal is float64"):
        sg.jvp(sg.sin, (x,), (sg.tensor([1.0, 2.0]),))
    with pytest.raises(TypeError, match="got 1 primals but 2 tangents"):
        sg.jvp(sg.sin, (x,), (x, x))
    with pytest.raises(TypeError, match="must be tuples"):
        sg.jvp(sg.sin, x, x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot differentiate with respect to a int32"):
        sg.jacrev(lambda i: i * 2)(sg.tensor([1, 2]))
    with pytest.raises(TypeError, match=r"jvp: cannot differentiate .* int32 input \(argument 1\)"):
        sg.jvp(lambda x, i: x * i, (x, sg.tensor([1, 2])), (x, sg.tensor([0, 0])))
    with pytest.raises(TypeError, match="argnums=3 but the function was called with 1"):
        sg.jacfwd(sg.sin, argnums=3)(x)


@pytest.mark.parametrize("mode", MODES)
def test_jvp_and_hessian_through_scan_and_checkpoint(mode: str) -> None:
    rng = np.random.default_rng(3)
    xs, h0 = f64(rng.standard_normal((4, 3))), f64(rng.standard_normal(3))
    w, t = f64(0.5 * rng.standard_normal((3, 3))), f64(rng.standard_normal((3, 3)))

    def f(w: sg.Tensor) -> sg.Tensor:
        def body(h: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
            h = sg.tanh(h @ w + x)
            return h, h.sum()

        h, ys = sg.scan(body, h0, xs)
        return h.sum() + sg.checkpoint(lambda y: (sg.sin(y) * y).sum())(ys)

    def th_f(w: Any) -> Any:
        h, ys = torch.from_numpy(h0.numpy()), []
        for x in torch.from_numpy(xs.numpy()):
            h = torch.tanh(h @ w + x)
            ys.append(h.sum())
        y = torch.stack(ys)
        return h.sum() + (torch.sin(y) * y).sum()

    th_w = torch.from_numpy(w.numpy())
    out, tangent = compiled(lambda w, t: sg.jvp(f, (w,), (t,)), mode)(w, t)
    close(tangent, tfunc.jvp(th_f, (th_w,), (torch.from_numpy(t.numpy()),))[1])
    close(compiled(sg.hessian(f), mode)(w), tfunc.hessian(th_f)(th_w), rtol=1e-9, atol=1e-11)
    close(out, th_f(th_w))


def test_every_differentiable_primitive_has_a_vjp_rule() -> None:
    """Forward mode and second derivatives are derived from these rules (the op-table sweeps
    below check that each rule's own primitives differentiate correctly)."""
    for prim in Prim:
        if prim not in NON_DIFFERENTIABLE and prim is not Prim.INPUT:
            assert callable(vjp_rule(prim)), prim
    with pytest.raises(NotImplementedError, match="no VJP rule for primitive input"):
        vjp_rule(Prim.INPUT)


# --- the op table: forward mode and second derivatives against central differences -----


def _prepare(case: Case) -> tuple[list[Any], tuple[int, ...], list[np.ndarray]]:
    arrays = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in case.arrays()]
    positions = case.diff_positions(arrays)
    rng = np.random.default_rng(11)
    tangents = [rng.standard_normal(arrays[p].shape) for p in positions]
    return arrays, positions, tangents


def _bind(case: Case, arrays: Sequence[Any], positions: tuple[int, ...]) -> Callable[..., Any]:
    """``case.fn`` as a function of its differentiated inputs (the others fixed)."""
    fixed = [sg.tensor(a, dtype="float64") if a.dtype.kind == "f" else sg.tensor(a) for a in arrays]

    def fn(*xs: sg.Tensor) -> Any:
        full = list(fixed)
        for p, x in zip(positions, xs, strict=True):
            full[p] = x
        return case.fn(*full)

    return fn


def _fd(
    fn: Callable[..., Any],
    arrays: Sequence[Any],
    positions: tuple[int, ...],
    tangents: Sequence[np.ndarray],
    eps: float,
) -> np.ndarray:
    def at(sign: float) -> np.ndarray:
        moved = list(arrays)
        for p, t in zip(positions, tangents, strict=True):
            moved[p] = arrays[p] + sign * eps * t
        return np.asarray(fn(*moved), dtype=np.float64)

    return (at(1.0) - at(-1.0)) / (2 * eps)


def check_jvp(case: Case, mode: str) -> None:
    arrays, positions, tangents = _prepare(case)
    fn = _bind(case, arrays, positions)
    k = len(positions)
    run = compiled(lambda *a: sg.jvp(fn, a[:k], a[k:]), mode)
    out, tangent = run(*(f64(arrays[p]) for p in positions), *(f64(t) for t in tangents))
    close(out, np.asarray(case.ref(*arrays), dtype=np.float64), rtol=1e-9, atol=1e-9)
    want = _fd(case.ref, arrays, positions, tangents, case.fd_step)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(
        tangent.numpy(), want, rtol=1e-5, atol=1e-6 * scale, err_msg=case.name
    )


def check_hvp(case: Case) -> None:
    """The derivative of the gradient of ``<ct, f>`` along ``t``, by forward over reverse."""
    arrays, positions, tangents = _prepare(case)
    fn = _bind(case, arrays, positions)
    out = np.asarray(fn(*(f64(arrays[p]) for p in positions)).numpy())
    ct = f64(np.random.default_rng(5).standard_normal(out.shape))
    k = len(positions)
    grad = sg.grad(lambda *xs: (fn(*xs) * ct).sum(), argnums=tuple(range(k)))
    _, hvp = sg.jvp(grad, tuple(f64(arrays[p]) for p in positions), tuple(f64(t) for t in tangents))

    def numeric_grad(*moved: np.ndarray) -> np.ndarray:
        gs = grad(*(f64(moved[p]) for p in positions))
        return np.concatenate([g.numpy().reshape(-1) for g in gs])

    eps = max(case.fd_step, 1e-5)  # the gradient itself carries rounding: a wider step
    want = _fd(numeric_grad, arrays, positions, tangents, eps)
    got = np.concatenate([h.numpy().reshape(-1) for h in hvp])
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=case.name)


SAMPLE = GRAD_CASES[::7]


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_jvp_sample_eager(case: Case) -> None:
    check_jvp(case, "eager")


@pytest.mark.parametrize("case", SAMPLE[::3], ids=lambda c: c.name)
def test_jvp_sample_compiled_numpy(case: Case) -> None:
    check_jvp(case, "numpy")


@pytest.mark.parametrize("case", SAMPLE[::10], ids=lambda c: c.name)
def test_jvp_sample_compiled_c(case: Case) -> None:
    check_jvp(case, "c")


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_hvp_sample(case: Case) -> None:
    check_hvp(case)


def _jvp_params() -> list[Any]:
    # cross_entropy[nd]-c was xfail here: gcc 12.2 miscompiled it under -fassociative-math,
    # which the C backend no longer passes (tests/test_c_gcc_workarounds.py).
    return [
        pytest.param(case, mode, id=f"{case.name}-{mode}") for case in GRAD_CASES for mode in MODES
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case,mode", _jvp_params())
def test_jvp_every_op(case: Case, mode: str) -> None:
    check_jvp(case, mode)


@pytest.mark.slow
@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.name)
def test_hvp_every_op(case: Case) -> None:
    check_hvp(case)


@pytest.mark.parametrize("module", ["transforms", "_custom_vjp", "_custom_jvp"])
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"shapegrad.{module}")
    result = doctest.testmod(mod, extraglobs={"sg": sg}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --- the retrace warning ------------------------------------------------------------------


def test_fifth_retrace_warns_once_naming_the_changed_shapes() -> None:
    f = sg.compile(lambda x, w: (x * w).sum(), backend="numpy")
    w = sg.tensor(np.ones(3, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 6):  # the first trace and four retraces: quiet
            f(sg.tensor(np.ones((n, 3), np.float32)), w)
        f(sg.tensor(np.ones((1, 3), np.float32)), w)  # cached: not a retrace
        assert [c for c in caught if issubclass(c.category, RetraceWarning)] == []
        f(sg.tensor(np.ones((6, 3), np.float32)), w)  # the fifth retrace
        for n in range(7, 10):
            f(sg.tensor(np.ones((n, 3), np.float32)), w)
    retraces = [c for c in caught if issubclass(c.category, RetraceWarning)]
    assert len(retraces) == 1 and issubclass(RetraceWarning, UserWarning)
    message = str(retraces[0].message)
    assert "traced and compiled 6 times" in message
    assert "x: float32[1, 3], float32[2, 3]" in message and "float32[6, 3]" in message
    assert "w:" not in message  # unchanged inputs are not named
    assert retraces[0].filename == __file__  # points at the caller
    assert f.trace_count == 9


def test_hessian_vector_product_through_scan_eagerly() -> None:
    """grad of grad through sg.scan: the inner gradient's scan stores its carries and the
    outer one differentiates through them. Eagerly, SCAN's VJP skipped a stored-carry
    cotangent that was zero by value even while the tape recorded it, so the outer
    gradient lost that path. Checked against float64 central differences of the gradient."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 3))
    v = rng.standard_normal((5, 3))

    def f(x: sg.Tensor) -> sg.Tensor:
        def body(h: sg.Tensor, xi: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
            h = sg.tanh(h * xi + 0.5)
            return h, h * h

        _, ys = sg.scan(body, x[0], x)
        return ys.sum()

    def grad_dot_v(x: sg.Tensor) -> sg.Tensor:
        return (sg.grad(f)(x) * sg.tensor(v)).sum()

    got = sg.grad(grad_dot_v)(sg.tensor(x)).numpy()
    eps = 1e-6
    want = (
        sg.grad(f)(sg.tensor(x + eps * v)).numpy() - sg.grad(f)(sg.tensor(x - eps * v)).numpy()
    ) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_scan_vjp_skips_only_cotangents_that_no_tape_records() -> None:
    """SCAN's VJP skips a stored-carry cotangent that is zero by value; one that a tape
    records is being differentiated (a Hessian through a linearized scan transposes at a
    point that may be zero): skipping it cut that path and gave wrong eager Hessians."""
    from shapegrad import _scan

    assert _scan._zero_range(sg.tensor(np.zeros(6)), 0, 6)
    recorded: list[bool] = []

    def probe(u: sg.Tensor) -> sg.Tensor:
        recorded.append(_scan._zero_range(u, 0, 6))
        return (u * u).sum()

    sg.grad(probe)(sg.tensor(np.zeros(6)))
    assert recorded == [False]  # zero now, but a gradient flows through it
