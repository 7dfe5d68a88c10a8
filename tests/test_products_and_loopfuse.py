"""Codegen of transformer-style steps: products over shared weights become single
products (``compiler/products.py``), exp never hands libmvec a denormal-range argument
(``compiler/expand.py``), and adjacent elementwise kernels share one loop
(``compiler/loopfuse.py``). Values are checked against NumPy in float64."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.loopfuse import forward_private_temps, fuse_elementwise_kernels
from shapegrad.compiler.passes import optimize
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.products import merge_product_batches
from shapegrad.compiler.target import C_TARGET, Tuning
from shapegrad.dtypes import float32
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _graph(fn, *args) -> Graph:  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy").graph(*args)


def _einsums(graph: Graph) -> list[str]:
    return [n.attr["spec"] for n in graph.nodes() if n.prim is Prim.EINSUM]


def _contracts(graph: Graph) -> list[L.Contract]:
    program, _ = lower_program(graph, C_TARGET, "t")
    return [s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.Contract)]


# --- products over broadcast weights and sums of products ----------------------------------


def _dense_loss(w: sg.Tensor, x: sg.Tensor, r: sg.Tensor) -> sg.Tensor:
    return ((x @ w) * r).sum()


def test_batched_product_with_a_shared_weight_is_one_product() -> None:
    x, w = _f32(4, 8, 16), _f32(16, 32, seed=1)
    graph = _graph(lambda w, x: x @ w, sg.tensor(w), sg.tensor(x))
    assert _einsums(graph) == ["aij,jk->aik"]  # no broadcast copy of w, no batch letter
    (product,) = _contracts(graph)
    assert (product.m, product.n, product.k, product.batch) == (32, 32, 16, 1)
    out = sg.compile(lambda w, x: x @ w, backend="c")(sg.tensor(w), sg.tensor(x)).numpy()
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


@needs_cc
def test_weight_gradient_sums_inside_the_product() -> None:
    x, w, r = _f32(4, 8, 16), _f32(16, 32, seed=1), _f32(4, 8, 32, seed=2)
    args = (sg.tensor(w), sg.tensor(x), sg.tensor(r))
    graph = _graph(sg.grad(_dense_loss), *args)
    assert not any(
        n.prim is Prim.REDUCE_SUM and n.inputs[0].prim is Prim.EINSUM for n in graph.nodes()
    )
    (product,) = _contracts(graph)
    assert product.k == 32 and product.batch == 1  # b*t summed by the library product
    grad = sg.compile(sg.grad(_dense_loss), backend="c")(*args).numpy()
    expected = np.einsum("btd,btf->df", x.astype(np.float64), r.astype(np.float64))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-4)


def test_sum_of_a_product_read_elsewhere_stays_a_batched_product() -> None:
    a, b = _f32(3, 4, 5), _f32(3, 5, 6, seed=1)

    def fn(a: sg.Tensor, b: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        p = a @ b
        return p.sum(axis=0), p * 2.0

    graph = _graph(fn, sg.tensor(a), sg.tensor(b))
    assert _einsums(graph) == ["aij,ajk->aik"]  # computed once, not once per consumer
    s, d = sg.compile(fn, backend="c")(sg.tensor(a), sg.tensor(b))
    p = a.astype(np.float64) @ b
    np.testing.assert_allclose(s.numpy(), p.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.numpy(), 2 * p, rtol=1e-5, atol=1e-5)


def test_broadcast_letter_the_other_operand_lacks_is_kept() -> None:
    # an outer product over a broadcast axis: dropping 'a' from the second operand would
    # make it vanish from the product, so the rule must leave the einsum alone
    u, v = _f32(4), _f32(5, seed=1)

    def fn(u: sg.Tensor, v: sg.Tensor) -> sg.Tensor:
        vb = v.reshape((1, 5)).broadcast_to((3, 5))
        return sg.einsum("i,aj->aij", u, vb)

    graph = _graph(fn, sg.tensor(u), sg.tensor(v))
    before = _einsums(graph)
    after = _einsums(merge_product_batches(graph))
    assert after == before
    out = sg.compile(fn, backend="c")(sg.tensor(u), sg.tensor(v)).numpy()
    np.testing.assert_allclose(out, np.broadcast_to(np.outer(u, v), (3, 4, 5)), rtol=1e-6)


def test_transposed_product_writes_the_transposed_layout() -> None:
    a, b = _f32(32, 64), _f32(64, 24, seed=1)
    graph = _graph(lambda a, b: (a @ b).T, sg.tensor(a), sg.tensor(b))
    assert _einsums(graph) == ["ij,jk->ki"]
    assert not any(n.prim is Prim.PERMUTE for n in graph.nodes())
    (product,) = _contracts(graph)
    assert (product.m, product.n) == (24, 32)  # computed as b^T a^T: no transpose pass
    out = sg.compile(lambda a, b: (a @ b).T, backend="c")(sg.tensor(a), sg.tensor(b)).numpy()
    np.testing.assert_allclose(out, (a.astype(np.float64) @ b).T, rtol=1e-5, atol=1e-5)


def test_permute_moving_a_batch_letter_stays_a_permute() -> None:
    # batched attention output [b, h, t, d] -> [b, t, h, d]: a batch letter would leave
    # the front, and the product could no longer be one batched library call
    p, v = _f32(2, 3, 4, 4), _f32(2, 3, 4, 5, seed=1)

    def fn(p: sg.Tensor, v: sg.Tensor) -> sg.Tensor:
        return (p @ v).transpose((0, 2, 1, 3))

    graph = _graph(fn, sg.tensor(p), sg.tensor(v))
    assert any(n.prim is Prim.PERMUTE for n in graph.nodes())
    out = sg.compile(fn, backend="c")(sg.tensor(p), sg.tensor(v)).numpy()
    ref = (p.astype(np.float64) @ v).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_rules_reach_a_fixed_point_in_the_pipeline() -> None:
    args = (sg.tensor(_f32(16, 32)), sg.tensor(_f32(4, 8, 16)), sg.tensor(_f32(4, 8, 32)))
    graph = _graph(sg.value_and_grad(_dense_loss), *args)
    again, _ = optimize(graph)
    assert sorted(_einsums(again)) == sorted(_einsums(graph))


# --- exp without libmvec's scalar fallback -------------------------------------------------

SPECIAL = [-np.inf, -3.4e38, -1e4, -104.0, -87.34, -87.33, -20.0, -1.0, 0.0, 1e-8, 1.0, 88.0, 89.0]


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exp_flushes_only_denormal_results(dtype: str) -> None:
    x = np.array([*SPECIAL, -700.0, -708.3, -708.4, -745.5, np.inf, np.nan], dtype=dtype)
    out = sg.compile(sg.exp, backend="c")(sg.tensor(x)).numpy()
    with np.errstate(over="ignore", under="ignore"):
        ref = np.exp(x.astype(np.float64)).astype(dtype)
    tiny = float(np.finfo(dtype).tiny)
    np.testing.assert_allclose(out, ref, rtol=8 * float(np.finfo(dtype).eps), atol=tiny)
    assert np.isnan(out[-1]) and out[-2] == np.inf and out[0] == 0.0
    normal = ref >= tiny
    np.testing.assert_allclose(out[normal], ref[normal], rtol=8 * float(np.finfo(dtype).eps))


@needs_cc
def test_masked_softmax_matches_numpy() -> None:
    s = _f32(2, 8, 8)
    mask = np.tril(np.ones((8, 8), dtype=bool))

    def fn(s: sg.Tensor) -> sg.Tensor:
        keep = sg.tensor(mask)
        return sg.softmax(sg.where(keep, s, float(np.finfo(np.float32).min)), axis=-1)

    out = sg.compile(fn, backend="c")(sg.tensor(s)).numpy()
    z = np.where(mask, s.astype(np.float64), -np.inf)
    ref = np.exp(z - z.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)


def test_cuda_target_keeps_the_plain_exp() -> None:
    from shapegrad.compiler.target import CUDA_TARGET

    assert C_TARGET.exp_underflow_to_zero and not CUDA_TARGET.exp_underflow_to_zero


# --- loop fusion ---------------------------------------------------------------------------


def _nest(vars_: list[L.Var], stores: list[tuple[str, L.Affine, L.Expr]], root: str) -> L.Kernel:
    """A kernel: a parallel nest over ``vars_`` (outermost first) of plain stores."""
    body: tuple[L.Stmt, ...] = tuple(L.Store(b, ix, value) for b, ix, value in stores)
    for v in reversed(vars_):
        body = (L.Loop(v, "parallel", body),)
    return L.Kernel(f"k_{root}", body, 1, root)


def _program(kernels: list[L.Kernel], temps: dict[str, int], outputs: list[str]) -> L.Program:
    buffers = {n: L.BufferSpec(n, float32, size, "temp") for n, size in temps.items()}
    buffers |= {n: L.BufferSpec(n, float32, 12, "output") for n in outputs}
    buffers["x"] = L.BufferSpec("x", float32, 12, "input")
    return L.Program("p", buffers, kernels, ["x"], outputs)


V0, V1, W = L.Var("v0", 3), L.Var("v1", 4), L.Var("w", 12)
FLAT = L.var(V0) * 4 + L.var(V1)


def _load(buffer: str, ix: L.Affine) -> L.Load:
    return L.Load(float32, buffer, ix)


def test_kernels_reading_each_other_at_the_same_index_merge() -> None:
    a = _nest([V0, V1], [("t", FLAT, L.Unary(float32, "exp", _load("x", FLAT)))], "a")
    t = _load("t", L.var(W))
    b = _nest([W], [("y", L.var(W), L.Binary(float32, "mul", t, t))], "b")  # flat loop
    program = _program([a, b], {"t": 12}, ["y"])
    fuse_elementwise_kernels(program)
    (kernel,) = program.kernels
    assert kernel.root == "a + b"
    loops = [s.var for s in L.walk(kernel.body) if isinstance(s, L.Loop)]
    assert loops == [V0, V1]  # the flat loop is re-indexed into the two-axis nest
    # t is read by nobody else: it is forwarded into y's expression, never stored
    (store,) = [s for s in L.walk(kernel.body) if isinstance(s, L.Store)]
    assert store.buffer == "y" and store.index == FLAT and "t" not in program.buffers
    exp_x = L.Unary(float32, "exp", _load("x", FLAT))
    assert store.value == L.Binary(float32, "mul", exp_x, exp_x)


def test_shifted_read_of_a_written_buffer_does_not_merge() -> None:
    a = _nest([V0, V1], [("t", FLAT, _load("x", FLAT))], "a")
    row_start = L.var(V0) * 4  # reads t[4*v0] for every v1: another index than the store
    b = _nest([V0, V1], [("y", FLAT, _load("t", row_start))], "b")
    program = _program([a, b], {"t": 12}, ["y"])
    fuse_elementwise_kernels(program)
    assert len(program.kernels) == 2 and "t" in program.buffers


def test_temp_read_by_a_later_kernel_is_still_stored() -> None:
    a = _nest([V0, V1], [("t", FLAT, _load("x", FLAT))], "a")
    b = _nest([V0, V1], [("y", FLAT, _load("t", FLAT))], "b")
    total = L.Reduce("acc", "add", L.Const(float32, 0.0), (W,), _load("t", L.var(W)))
    c = L.Kernel("k3", (total,), 1, "c")
    program = _program([a, b, c], {"t": 12}, ["y"])
    forward_private_temps(fuse_elementwise_kernels(program))
    assert len(program.kernels) == 2
    stores = [s.buffer for s in L.walk(program.kernels[0].body) if isinstance(s, L.Store)]
    assert stores == ["t", "y"]


def test_update_hoisted_to_its_moments_merges_with_them() -> None:
    # m = 0.9 m + x (moments), z = exp(x) (unrelated), p = p - m (the update, traced last)
    m, p = _load("m", FLAT), _load("p", FLAT)
    moments = _nest([V0, V1], [("m", FLAT, L.Binary(float32, "add", m, _load("x", FLAT)))], "m")
    other = _nest([V0, V1], [("z", FLAT, L.Unary(float32, "exp", _load("x", FLAT)))], "z")
    update = _nest([V0, V1], [("p", FLAT, L.Binary(float32, "sub", p, m))], "p")
    program = _program([moments, other, update], {"m": 12}, ["z"])
    program.buffers["p"] = L.BufferSpec("p", float32, 12, "state")  # a parameter
    fuse_elementwise_kernels(program, Tuning(fuse_max_group=2))
    assert [k.root for k in program.kernels] == ["m + p", "z"]  # one pass per parameter
    program = _program([moments, other, update], {"m": 12, "p": 12}, ["z"])
    fuse_elementwise_kernels(program, Tuning(fuse_max_group=2))
    assert [k.root for k in program.kernels] == ["m + z", "p"]  # p a temp: not moved


def test_update_read_in_between_stays_after_the_reader() -> None:
    m, p = _load("m", FLAT), _load("p", FLAT)
    moments = _nest([V0, V1], [("m", FLAT, L.Binary(float32, "add", m, _load("x", FLAT)))], "m")
    reader = _nest([V0, V1], [("z", FLAT, L.Unary(float32, "exp", p))], "z")  # reads old p
    update = _nest([V0, V1], [("p", FLAT, L.Binary(float32, "sub", p, m))], "p")
    program = _program([moments, reader, update], {"m": 12}, ["z"])
    program.buffers["p"] = L.BufferSpec("p", float32, 12, "state")
    fuse_elementwise_kernels(program, Tuning(fuse_max_group=2))
    assert [k.root for k in program.kernels] == ["m + z", "p"]  # p not moved above z


def test_temp_reading_a_buffer_overwritten_later_is_kept() -> None:
    # t = m + x; m = t (in place, a moment update); y = 2 t. Forwarding t into y would
    # read m after it was overwritten: y = 2 (m + x) with the new m.
    m, t = _load("m", FLAT), _load("t", FLAT)
    kernel = _nest(
        [V0, V1],
        [
            ("t", FLAT, L.Binary(float32, "add", m, _load("x", FLAT))),
            ("m", FLAT, t),
            ("y", FLAT, L.Binary(float32, "mul", t, L.Const(float32, 2.0))),
        ],
        "k",
    )
    program = _program([kernel], {"t": 12}, ["y", "m"])  # m: state, written in place
    forward_private_temps(program)
    stores = [x.buffer for x in L.walk(program.kernels[0].body) if isinstance(x, L.Store)]
    assert stores == ["t", "m", "y"] and "t" in program.buffers


@needs_cc
def test_gelu_mlp_step_fuses_and_matches_numpy() -> None:
    x, w, b, r = _f32(16, 8), _f32(8, 64, seed=1) * 0.3, _f32(64, seed=2), _f32(16, 64, seed=3)

    def loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor, r: sg.Tensor) -> sg.Tensor:
        return (sg.gelu(x @ w + b) * r).sum()

    args = tuple(sg.tensor(a) for a in (w, b, x, r))
    exe = sg.compile(sg.value_and_grad(loss, argnums=(0, 1)), backend="c").lower(*args).executable
    merged = [k for k in exe.program.kernels if " + " in k.root]
    assert merged, "GELU's kernels should share loops"
    value, (gw, gb) = sg.compile(sg.value_and_grad(loss, argnums=(0, 1)), backend="c")(*args)

    x64, w64, b64, r64 = (a.astype(np.float64) for a in (x, w, b, r))
    h = x64 @ w64 + b64
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (h + 0.044715 * h**3))
    ref_value = (0.5 * h * (1 + t) * r64).sum()
    dh = r64 * (0.5 * (1 + t) + 0.5 * h * (1 - t**2) * c * (1 + 3 * 0.044715 * h**2))
    np.testing.assert_allclose(float(value.numpy()), ref_value, rtol=1e-5)
    np.testing.assert_allclose(gw.numpy(), x64.T @ dh, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb.numpy(), dh.sum(0), rtol=1e-4, atol=1e-4)


# --- reshapes of layout views --------------------------------------------------------------


def test_reshape_groups_pair_axes_of_equal_size() -> None:
    from shapegrad.compiler.expand import _reshape_groups

    assert _reshape_groups((32, 64, 128), (32, 64, 4, 32)) == [
        ((0, 1), (0, 1)),
        ((1, 2), (1, 2)),
        ((2, 3), (2, 4)),
    ]
    assert _reshape_groups((2, 3), (3, 2)) == [((0, 2), (0, 2))]
    assert _reshape_groups((0, 4), (4, 0)) is None


@needs_cc
def test_head_merge_of_a_permuted_view_has_no_div_mod_on_batch_or_time() -> None:
    q = _f32(2, 3, 4, 5)  # [batch, heads, time, dim]

    def merge_heads(q: sg.Tensor) -> sg.Tensor:
        merged = q.transpose((0, 2, 1, 3)).reshape((2, 4, 15))
        return sg.functional.pad(merged, ((0, 0), (0, 0), (0, 15))) * 2.0

    graph = _graph(merge_heads, sg.tensor(q))
    # the indices as lowered (before the split_index_sets stage cuts the pad into segments)
    unsplit = C_TARGET.replace(skip_stages=C_TARGET.skip_stages | {"split_index_sets"})
    program, _ = lower_program(graph, unsplit, "t")
    (store,) = [s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.Store)]
    loads = [x for x in L.walk_expr(store.value) if isinstance(x, L.Load)]
    divided = {
        v
        for ld in loads
        for a in ld.index.atoms()
        if isinstance(a, L.DivMod)
        for v in a.inner.atoms()
    }
    loop_vars = [s.var for s in L.walk(program.kernels[-1].body) if isinstance(s, L.Loop)]
    assert loop_vars[0] not in divided and loop_vars[1] not in divided  # batch, time exact
    out = sg.compile(merge_heads, backend="c")(sg.tensor(q)).numpy()
    ref = np.pad(q.transpose(0, 2, 1, 3).reshape(2, 4, 15), ((0, 0), (0, 0), (0, 15))) * 2
    np.testing.assert_allclose(out, ref, rtol=1e-6)
