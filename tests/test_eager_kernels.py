"""Kernels of the eager interpreter.

* NumPy kernels that replace a slower NumPy call: the branch-free ``select`` of large
  where's and the planned two-operand einsum, checked against the NumPy call they replace
  (bit for bit / to float tolerance).
* Native kernels (``ops/kernels.py``, ``_fused.py``, ``jit/eager_kernels.py``): composites
  marked ``eager_kernel`` run as one compiled C call forward and one for the VJP. Every
  op-table case of such a composite is checked against its NumPy reference with the op
  table's own tolerances (forward in float32 and float64, gradients against finite
  differences) and against the NumPy eager path, and the kernel path is checked to be
  taken; a subset by default, all of them in the slow suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from harness import Case, check_forward, check_gradient
from modes import Runner, _c_unavailable, _eager_call, _eager_grad
from op_table import CASES
from shapegrad import _fused
from shapegrad.jit import eager_kernels
from shapegrad.ops import kernels
from shapegrad.ops.einsum_plan import plan_einsum

RNG = np.random.default_rng(11)


# --- the branch-free select of large where's -------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_large_select_is_bit_identical_to_np_where(dtype: Any) -> None:
    from shapegrad.ops.reference import SELECT_BITWISE_MIN, select

    n = SELECT_BITWISE_MIN + 3
    a = RNG.standard_normal(n).astype(dtype)
    b = RNG.standard_normal(n).astype(dtype)
    if dtype != np.int32:
        a[:5] = [np.nan, np.inf, -0.0, -np.inf, 0.0]
    zero, neg_zero = dtype(0), dtype(-0.0) if dtype != np.int32 else dtype(0)
    cases = [(a, b), (a, dtype(3)), (dtype(2), b), (a, zero), (zero, a), (a, neg_zero)]
    cases += [(dtype(1), neg_zero), (neg_zero, b)]
    cases.append((np.broadcast_to(a[:1], (n,)), b))  # zero-stride views ...
    cases.append((a, np.broadcast_to(zero, (n,))))  # ... of a zero too (the one-AND form)
    # random, all-False (a max's tie mask: one branch, no blend) and all-True masks
    for mask in (RNG.random(n) < 0.5, np.zeros(n, bool), np.ones(n, bool)):
        for x, y in cases:
            got, expected = select(mask, x, y), np.where(mask, x, y)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()
    # and through the op, with gradients
    x = sg.tensor(a.astype(np.float64) if dtype != np.int32 else a)
    np.testing.assert_array_equal(
        sg.where(sg.tensor(mask), x, 0.0 if dtype != np.int32 else 0).numpy(),
        np.where(mask, x.numpy(), 0),
    )


@pytest.mark.parametrize(
    "spec,shape_a,shape_b",
    [
        ("ab,bc->ac", (3, 4), (4, 5)),
        ("ab,cb->ac", (3, 4), (5, 4)),
        ("ba,bc->ac", (4, 3), (4, 5)),
        ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
        ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
        ("ij,ij->i", (3, 4), (3, 4)),
        ("ij,ij->", (3, 4), (3, 4)),
        ("i,j->ij", (3,), (4,)),
        ("abc,cd->dba", (2, 3, 4), (4, 5)),
        ("ab,c->ac", (3, 4), (5,)),  # c summed inside b alone
        ("ij,jk->", (3, 4), (4, 5)),
        ("ab,bc->ca", (3, 0), (0, 5)),  # an empty contraction is zeros
        ("ab,bc->ac", (0, 4), (4, 5)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_einsum_plan_matches_np_einsum(
    spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any
) -> None:
    a = RNG.standard_normal(shape_a).astype(dtype)
    b = RNG.standard_normal(shape_b).astype(dtype)
    got, expected = plan_einsum(spec, shape_a, shape_b)(a, b), np.einsum(spec, a, b)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # through the eager primitive (and its VJP, which is einsums again)
    ta, tb = sg.tensor(a), sg.tensor(b)
    np.testing.assert_allclose(sg.einsum(spec, ta, tb).numpy(), expected, rtol=1e-5, atol=1e-5)


# --- native kernels of eager composites ------------------------------------------------

# (``prim:*`` cases call the primitive itself, not the marked composite of that name)
NATIVE_CASES = [
    c for c in CASES if _fused.NAMES & set(c.covers) and not c.name.startswith("prim:")
]
# The default suite's subset: one case per kind of kernel (convolution, pooling, norms,
# softmax family, activation, loss); the slow suite runs every case above.
DEFAULT_NATIVE = {
    "conv2d[stride_pad_bias]",
    "max_pool2d[k3s2p1]",
    "layer_norm[affine]",
    "log_softmax",
    "gelu[odd]",
    "cross_entropy[int]",
}


def _native_params(cases: list[Case]) -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=() if c.name in DEFAULT_NATIVE else pytest.mark.slow)
        for c in cases
    ]


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> Iterator[eager_kernels.CKernels]:
    """A fresh C provider that compiles every key on first sight, in the foreground (the
    call runs the kernel), for operands of any size."""
    reason = _c_unavailable()
    if reason:
        pytest.skip(reason)
    previous = kernels.installed()
    provider = eager_kernels.CKernels(compile_after=1, background=False)
    monkeypatch.setattr(_fused, "MIN_ELEMENTS", 0)
    kernels.install(provider)
    try:
        with kernels.enabled(True):
            yield provider
    finally:
        kernels.install(previous)


NATIVE = Runner("eager_native", call=_eager_call, grad=_eager_grad)


def _numpy_path(fn: Any, *args: Any) -> Any:
    with kernels.enabled(False):
        return fn(*args)


def test_default_subset_names_exist() -> None:
    names = {c.name for c in NATIVE_CASES}
    assert names >= DEFAULT_NATIVE, DEFAULT_NATIVE - names
    # every marked composite has op-table cases to check it (or NN_CASES below)
    covered = {n for c in NATIVE_CASES for n in c.covers} | set(NN_CASES)
    covered.add("optimizer_update")  # test_optimizer_update_is_one_kernel
    assert covered >= _fused.NAMES, _fused.NAMES - covered


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", _native_params(NATIVE_CASES))
def test_native_forward_matches_reference(
    case: Case, dtype: Any, native: eager_kernels.CKernels
) -> None:
    before = native.calls
    check_forward(case, NATIVE, dtype)
    assert native.calls > before, f"{case.name}: no native kernel ran"
    # and the NumPy eager path agrees with it (the same tolerance as the reference check)
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in case.arrays()]
    (got,) = _eager_call(case.fn, arrays)
    (want,) = _numpy_path(_eager_call, case.fn, arrays)
    tol = (1e-9, 1e-11) if dtype == np.float64 else (case.rtol32, case.atol32)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1] * scale)


@pytest.mark.parametrize("case", _native_params([c for c in NATIVE_CASES if c.grad]))
def test_native_gradient_matches_reference(case: Case, native: eager_kernels.CKernels) -> None:
    before = native.calls
    check_gradient(case, NATIVE)
    assert native.calls > before, f"{case.name}: no native kernel ran"


def _causal_attention(q: sg.Tensor, k: sg.Tensor, v: sg.Tensor) -> sg.Tensor:
    return sg.nn.scaled_dot_product_attention(q, k, v, causal=True)


def _masked_attention(q: sg.Tensor, k: sg.Tensor, v: sg.Tensor, m: sg.Tensor) -> sg.Tensor:
    return sg.nn.scaled_dot_product_attention(q, k, v, mask=m, scale=0.3)


# Marked composites of sg.nn (not in the op table): checked against the NumPy path.
NN_CASES: dict[str, list[tuple[Any, list[tuple[int, ...] | str]]]] = {
    "rms_norm": [
        (lambda x, w: sg.nn.rms_norm(x, w), [(3, 5, 8), (8,)]),
        (lambda x: sg.nn.rms_norm(x, eps=1e-3), [(4, 6)]),
    ],
    "scaled_dot_product_attention": [
        (_causal_attention, [(2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 6)]),
        (_masked_attention, [(2, 4, 3), (2, 5, 3), (2, 5, 2), "mask"]),
    ],
}


@pytest.mark.parametrize(
    "fn,shapes",
    [pytest.param(fn, shapes, id=f"{name}{i}") for name, cases in NN_CASES.items()
     for i, (fn, shapes) in enumerate(cases)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_nn_kernels_match_numpy_path(
    fn: Any, shapes: list[Any], dtype: Any, native: eager_kernels.CKernels
) -> None:
    rng = np.random.default_rng(3)
    args = [
        sg.tensor(rng.random((2, 4, 5)) < 0.7)
        if s == "mask"
        else sg.tensor(rng.standard_normal(s).astype(dtype))
        for s in shapes
    ]
    floats = tuple(i for i, a in enumerate(args) if a.dtype.is_float)
    out = fn(*args)
    ct = sg.tensor(rng.standard_normal(out.shape).astype(dtype))

    def objective(*xs: sg.Tensor) -> sg.Tensor:
        return (fn(*xs) * ct).sum()

    grads = sg.grad(objective, argnums=floats)(*args)
    assert native.calls == 2, "forward and the objective's forward each ran one kernel"
    want_out = _numpy_path(fn, *args)
    want_grads = _numpy_path(sg.grad(objective, argnums=floats), *args)
    rtol, atol = (1e-9, 1e-11) if dtype == np.float64 else (2e-4, 2e-5)
    np.testing.assert_allclose(out.numpy(), want_out.numpy(), rtol=rtol, atol=atol)
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=rtol, atol=atol)


def _conv_loss(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
    h = sg.conv2d(x, w, b, padding=1)
    h = sg.layer_norm(h, axis=(1, 2, 3))
    return sg.log_softmax(h.reshape((h.shape[0], -1))).mean() + sg.gelu(h).sum()


def _conv_args() -> list[sg.Tensor]:
    rng = np.random.default_rng(5)
    shapes = [(4, 3, 12, 12), (5, 3, 3, 3), (5,)]
    return [sg.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def test_kernel_path_is_taken_and_matches_numpy_path(native: eager_kernels.CKernels) -> None:
    args = _conv_args()
    want_v, want_g = _numpy_path(sg.value_and_grad(_conv_loss, argnums=(0, 1, 2)), *args)
    value, grads = sg.value_and_grad(_conv_loss, argnums=(0, 1, 2))(*args)
    assert native.compiles == 4  # conv2d, layer_norm, log_softmax, gelu
    assert native.calls == 4
    np.testing.assert_allclose(value.numpy(), want_v.numpy(), rtol=1e-5)
    for g, w in zip(grads, want_g, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6)
    # the output of a fused composite is one tape node: the kernel's VJP marker
    x, w, b = (sg.tensor(a.numpy()) for a in args)

    def check_tape(x: sg.Tensor) -> sg.Tensor:
        y = sg.conv2d(x, w, b, padding=1)
        node = y._tape
        assert node is not None and "custom_vjp" in node.attrs and node.inputs[0] is x
        return y.sum()

    sg.grad(check_tape)(x)
    assert (native.compiles, native.calls) == (4, 5)  # the same conv2d key: no new compile


def test_switched_off_and_small_operands_stay_on_numpy(
    native: eager_kernels.CKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = sg.tensor(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    with kernels.enabled(False):
        sg.softmax(x)
    assert native.calls == 0
    monkeypatch.setattr(_fused, "MIN_ELEMENTS", 65)
    sg.softmax(x)
    assert native.calls == 0
    monkeypatch.setattr(_fused, "MIN_ELEMENTS", 64)
    sg.softmax(x)
    assert native.calls == 1


def test_compile_after_counts_sightings(monkeypatch: pytest.MonkeyPatch) -> None:
    if _c_unavailable():
        pytest.skip(_c_unavailable() or "")
    previous = kernels.installed()
    provider = eager_kernels.CKernels(compile_after=3, background=False)
    monkeypatch.setattr(_fused, "MIN_ELEMENTS", 0)
    kernels.install(provider)
    try:
        with kernels.enabled(True):
            x = sg.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
            for expected in (0, 0, 1, 2):
                got = sg.log_softmax(x, axis=0)
                assert provider.calls == expected
                np.testing.assert_allclose(
                    got.numpy(), _numpy_path(sg.log_softmax, x, 0).numpy(), rtol=1e-6
                )
    finally:
        kernels.install(previous)


def test_nested_grad_through_a_fused_composite(native: eager_kernels.CKernels) -> None:
    """A second-order derivative records the backward: the composite's Python VJP runs
    (the kernel's VJP is not differentiable), on the tape of the outer grad."""
    x = sg.tensor(np.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def f(x: sg.Tensor) -> sg.Tensor:
        return (sg.softmax(x) * sg.softmax(x)).sum()

    def df_sum(x: sg.Tensor) -> sg.Tensor:
        return (sg.grad(f)(x) * x).sum()

    got = sg.grad(df_sum)(x)
    want = _numpy_path(sg.grad(df_sum), x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)
    # a vjp recorded at depth 1 and differentiated again goes through the kernel's rule
    out, pull = sg.vjp(lambda t: sg.gelu(t), x)
    (g,) = pull(sg.ones_like(out))
    want_g = _numpy_path(sg.grad(lambda t: sg.gelu(t).sum()), x)
    np.testing.assert_allclose(g.numpy(), want_g.numpy(), rtol=1e-9)


def test_bad_label_raises_index_error_through_the_kernel(native: eager_kernels.CKernels) -> None:
    logits = sg.tensor(np.zeros((4, 3), np.float32))
    good = sg.tensor(np.array([0, 1, 2, 0], np.int32))
    sg.cross_entropy(logits, good)
    assert native.calls == 1
    with pytest.raises(IndexError, match=r"labels must lie in \[0, 3\)"):
        sg.cross_entropy(logits, sg.tensor(np.array([0, 1, 3, 0], np.int32)))


def test_env_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, on in (("0", False), ("off", False), ("1", True), ("", True), ("sync", True)):
        monkeypatch.setenv(kernels.ENV, value)
        assert kernels._env_enabled() is on
    assert kernels._env_mode() == "sync"  # (the last value): compiles in the foreground
    monkeypatch.setattr(kernels, "_ENV_SYNC", True)
    assert eager_kernels.CKernels().background is False
    monkeypatch.setattr(kernels, "_ENV_SYNC", False)
    assert eager_kernels.CKernels().background is True
    monkeypatch.setenv(kernels.ENV, "maybe")
    with pytest.raises(ValueError, match="SHAPEGRAD_EAGER_KERNELS='maybe'"):
        kernels._env_enabled()


def test_env_zero_keeps_numpy_in_a_fresh_process() -> None:
    import os
    import subprocess
    import sys

    code = (
        "import shapegrad as sg; from shapegrad.ops import kernels; "
        "print(kernels.installed() is not None, kernels.provider() is None)"
    )
    env = {**os.environ, kernels.ENV: "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("policy", ["recompute", "residuals"])
def test_scan_runs_as_one_kernel_forward_and_backward(
    policy: str, native: eager_kernels.CKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCAN's NumPy rule is a Python loop over its body: eagerly it runs as one native call,
    keyed by the body's content (each sg.scan call traces a new body object), and so
    does its VJP (another SCAN)."""
    from shapegrad.ops import eager

    monkeypatch.setattr(eager, "KERNEL_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(8)
    ws = sg.tensor(rng.standard_normal((3, 6, 6)).astype(np.float32) * 0.4)
    h0 = sg.tensor(rng.standard_normal((4, 6)).astype(np.float32))

    def loss(ws: sg.Tensor, h0: sg.Tensor) -> sg.Tensor:
        def layer(h: sg.Tensor, w: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
            h = sg.tanh(h @ w)
            return h, h.sum(axis=1)

        h, ys = sg.scan(layer, h0, ws, policy=policy)
        return (h * h).sum() + ys.sum()

    vg = sg.value_and_grad(loss, argnums=(0, 1))
    want_v, want_g = _numpy_path(vg, ws, h0)
    for step in range(2):  # the second call traces a new body: the same kernel (by content)
        value, grads = vg(ws, h0)
        assert native.compiles == 2, step  # the forward SCAN and its VJP SCAN
        np.testing.assert_allclose(value.numpy(), want_v.numpy(), rtol=1e-5)
        for g, w in zip(grads, want_g, strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6)
    assert native.calls == 4


def test_forward_mode_and_jacobians_through_a_fused_composite(
    native: eager_kernels.CKernels,
) -> None:
    """jvp/linearize transpose the pullback and jacrev calls it once per row: through a
    fused composite they agree with the NumPy path."""
    rng = np.random.default_rng(4)
    x = sg.tensor(rng.standard_normal((3, 5)))
    t = sg.tensor(rng.standard_normal((3, 5)))

    def f(x: sg.Tensor) -> sg.Tensor:
        return sg.layer_norm(sg.gelu(x) * 2.0)

    for transform in (
        lambda: sg.jvp(f, (x,), (t,))[1],
        lambda: sg.linearize(f, x)[1](t),
        lambda: sg.jacrev(f)(x),
        lambda: sg.hessian(lambda x: sg.log_softmax(x).sum() * 0.5)(x),
    ):
        got, want = transform(), _numpy_path(transform)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)
    assert native.calls > 0


@pytest.mark.parametrize(
    "optimizer",
    [
        sg.optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        sg.optim.Adam(lr=1e-2, weight_decay=0.01),
        sg.optim.AdamW(lr=1e-2),
    ],
    ids=["sgd", "adam", "adamw"],
)
def test_optimizer_update_is_one_kernel(optimizer: Any, native: eager_kernels.CKernels) -> None:
    """The update of every leaf (several outputs: parameters and slots) is one native
    call; its results agree with the NumPy path over a few steps, a frozen leaf included."""
    rng = np.random.default_rng(6)
    shapes = [(4, 5), (5,), (3, 2, 2)]
    params = [sg.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    grads = [
        [sg.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes] for _ in range(3)
    ]

    def run() -> tuple[list[sg.Tensor], Any]:
        ps, state = list(params), optimizer.init(params)
        for g in grads:
            ps, state = optimizer.update(ps, g, state, requires_grad=[True, False, True])
        return ps, state

    got, got_state = run()
    assert native.calls == 3 and native.compiles == 1
    want, want_state = _numpy_path(run)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[1].numpy(), params[1].numpy())  # frozen
    for key in want_state:
        pairs = zip(
            sg.tree.flatten(got_state[key])[0], sg.tree.flatten(want_state[key])[0], strict=True
        )
        for a, b in pairs:
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_no_c_compiler_falls_back_to_numpy(tmp_path: Any) -> None:
    """Without a C compiler the provider declines every key (once it knows) and the eager
    results are the NumPy path's."""
    import os
    import subprocess
    import sys

    code = """
import numpy as np, shapegrad as sg
from shapegrad.jit import eager_kernels
from shapegrad.ops import kernels
x = sg.tensor(np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64))
outs = [sg.log_softmax(x).numpy() for _ in range(3)]
with kernels.enabled(False):
    want = sg.log_softmax(x).numpy()
p = eager_kernels.installed()
assert all(np.array_equal(o, want) for o in outs)
print(p.compiles, p.calls, p.unavailable is not None, len(p.declined))
"""
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "0", "True", "1"], out.stdout + out.stderr
