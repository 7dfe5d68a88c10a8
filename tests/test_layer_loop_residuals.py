"""What a ``policy="residuals"`` layer loop stores and how its step is built.

* the reverse body takes no cotangent of the carry history when nothing reads the stored
  carries (so the program never zero-pads a cotangent of the whole stacked output);
* a stored product moves along its only reader's elementwise/reshape chain (stored after a
  bias add, heads merged), and stays put when two nodes read it;
* the loop stage ``forward_output_copies``: an output that is a whole copy of a temp is
  written in that temp's place (and is left alone when the output is listed twice).

Values against the unrolled program and float64 central differences.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad._remat import _residual_backward
from shapegrad.backends.c import generate
from shapegrad.compiler import loops as L
from shapegrad.compiler.memory import forward_output_copies
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim
from shapegrad.ops.scan import derived


def _c() -> Any:
    runner = MODES["c"]
    reason = runner.unavailable()
    if reason:
        pytest.skip(reason)
    return runner


def _attention_layer(h: sg.Tensor, w: tuple[sg.Tensor, ...]) -> tuple[sg.Tensor, None]:
    """A two-head attention block with a bias after its input product (b 2, t 3, d 4)."""
    wqkv, bqkv, wo = w
    qkv = h @ wqkv.T + bqkv  # [b, t, 3d]
    q, k, v = (qkv[:, :, i * 4 : (i + 1) * 4] for i in range(3))

    def heads(x: sg.Tensor) -> sg.Tensor:
        return x.reshape((2, 3, 2, 2)).transpose((0, 2, 1, 3))  # [b, h, t, d/h]

    scores = heads(q) @ heads(k).transpose((0, 1, 3, 2))
    att = sg.softmax(scores, axis=-1) @ heads(v)
    merged = att.transpose((0, 2, 1, 3)).reshape((2, 3, 4))
    return sg.tanh(h + merged @ wo.T), None


def _arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.normal(size=(2, 12, 4)) * 0.5,
        rng.normal(size=(2, 12)) * 0.1,
        rng.normal(size=(2, 4, 4)) * 0.5,
        rng.normal(size=(2, 3, 4)),
    ]


def _loss(loop: bool) -> Any:
    def loss(wqkv: sg.Tensor, bqkv: sg.Tensor, wo: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        if loop:
            h, _ = sg.scan(_attention_layer, x, (wqkv, bqkv, wo), policy="residuals")
        else:
            h = x
            for i in range(wqkv.shape[0]):
                h, _ = _attention_layer(h, (wqkv[i], bqkv[i], wo[i]))
        return (h * h).sum()

    return loss


def _graph(loss: Any, arrays: list[np.ndarray]) -> Graph:
    fn = sg.compile(sg.value_and_grad(loss, argnums=(0, 1, 2, 3)), backend="numpy")
    return fn.graph(*(sg.tensor(a) for a in arrays))


def _scan_bodies(graph: Graph) -> dict[str, Any]:
    return {n.attr["body"].name: n.attr["body"] for n in graph.nodes() if n.prim is Prim.SCAN}


def test_loop_equals_unrolled_and_central_differences() -> None:
    runner = _c()
    arrays = _arrays()
    nums = (0, 1, 2, 3)
    grads = runner.grad(_loss(True), arrays, nums)
    want = MODES["eager"].grad(_loss(False), arrays, nums)
    for g, e in zip(grads, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)
    # float64 central differences of the eager unrolled loss, a few coordinates each
    rng = np.random.default_rng(5)
    eps = 1e-6
    for k, g in enumerate(grads):
        for flat in rng.choice(arrays[k].size, size=3, replace=False):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[k].reshape(-1)[flat] += eps
            minus[k].reshape(-1)[flat] -= eps
            (fp,) = MODES["eager"].call(_loss(False), plus)
            (fm,) = MODES["eager"].call(_loss(False), minus)
            np.testing.assert_allclose(g.reshape(-1)[flat], (fp - fm) / (2 * eps), atol=1e-6)


def test_reverse_body_takes_no_history_cotangent() -> None:
    graph = _graph(_loss(True), _arrays())
    bodies = _scan_bodies(graph)
    forward = bodies["_attention_layer_res"]
    backward = bodies["_attention_layer_res_vjp"]
    assert backward is _residual_backward(forward, False)
    with_history = _residual_backward(forward, True)
    assert with_history.n_xs == backward.n_xs + 1  # the rows of the history cotangent
    # no buffer holds a cotangent as large as the whole stacked output (carries and
    # residuals): the only buffer of that size is the forward loop's output
    scan = next(n for n in graph.nodes() if n.prim is Prim.SCAN)
    whole = scan.aval.shape[0]
    program, _ = generate(graph)
    assert [b.size for b in program.buffers.values()].count(whole) == 1


def test_gradient_of_gradient_through_a_residuals_loop() -> None:
    """A second derivative differentiates through the residual outputs: the VJP must fall
    back (recompute), never read a zero history cotangent it was not given."""
    arrays = [sg.tensor(a) for a in _arrays(1)]

    def outer(loss: Any) -> Any:
        return lambda *a: (sg.grad(loss, argnums=(0, 2))(*a)[1] ** 2).sum()

    got = sg.grad(outer(_loss(True)), argnums=(0, 3))(*arrays)
    want = sg.grad(outer(_loss(False)), argnums=(0, 3))(*arrays)
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=0, atol=1e-10)


def _stored(body: Any) -> list[Prim]:
    return [n.prim for n in derived(body)["residual_of"][2]]


def test_products_are_stored_after_their_only_reader() -> None:
    forward = _scan_bodies(_graph(_loss(True), _arrays()))["_attention_layer_res"]
    stored = [(n.prim, tuple(n.aval.shape)) for n in derived(forward)["residual_of"][2]]
    # the qkv product is stored with its bias added, not as the product
    assert (Prim.ADD, (2, 3, 12)) in stored and (Prim.EINSUM, (2, 3, 12)) not in stored
    # the attention output is stored heads merged ([b, t, d]), not as [b, h, t, d/h]
    assert (Prim.RESHAPE, (2, 3, 4)) in stored and (Prim.EINSUM, (2, 2, 3, 2)) not in stored
    # the scores have two readers (max and subtract of the softmax): stored as the product
    assert (Prim.EINSUM, (2, 2, 3, 3)) in stored


def test_a_product_read_twice_stays_stored_as_the_product() -> None:
    def layer(h: sg.Tensor, w: sg.Tensor) -> tuple[sg.Tensor, None]:
        z = h @ w
        return sg.tanh(z) + sg.sin(z), None  # two readers of the product

    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, _ = sg.scan(layer, x, w, policy="residuals")
        return (h * h).sum()

    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(3, 4, 4)) * 0.5, rng.normal(size=(2, 4))]
    fn = sg.compile(sg.value_and_grad(loss, argnums=(0, 1)), backend="numpy")
    graph = fn.graph(*(sg.tensor(a) for a in arrays))
    forward = _scan_bodies(graph)["layer_res"]
    assert Prim.EINSUM in _stored(forward)

    def unrolled(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h = x
        for i in range(w.shape[0]):
            h, _ = layer(h, w[i])
        return (h * h).sum()

    runner = _c()
    got = runner.grad(loss, arrays, (0, 1))
    want = MODES["eager"].grad(unrolled, arrays, (0, 1))
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)


def _copies(program: Any) -> list[str]:
    return [k.root for k in program.kernels if k.root.startswith("reshape")]


def test_an_output_reshaped_from_a_product_is_written_in_place() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(6, 4)), rng.normal(size=(4, 4))

    def f(a: sg.Tensor, b: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        c = a @ b
        return c.reshape((2, 12)), c @ b

    program, _ = generate(sg.compile(f, backend="c").graph(sg.tensor(a), sg.tensor(b)))
    assert not _copies(program)
    assert len(program.kernels) == 2  # the two products, nothing else
    runner = _c()
    got = runner.call(f, [a, b])
    np.testing.assert_allclose(got[0], (a @ b).reshape(2, 12), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[1], a @ b @ b, rtol=0, atol=1e-12)


def _copy_program(
    copy_extent: int = 8, state: bool = False, second_writer: bool = False
) -> L.Program:
    """in0 -> t (x2) -> copy into out0 -> out1 = out0 + 1 (hand-built loop IR)."""
    f32 = sg.float32
    buffers = {
        "in0": L.BufferSpec("in0", f32, 8, "input"),
        "t": L.BufferSpec("t", f32, 8, "temp"),
        "out0": L.BufferSpec("out0", f32, 8, "state" if state else "output"),
        "out1": L.BufferSpec("out1", f32, 8, "output"),
    }

    def loop(name: str, extent: int, dst: str, value: Any) -> L.Loop:
        v = L.Var(name, extent)
        return L.Loop(v, "parallel", (L.Store(dst, L.var(v), value(L.var(v))),))

    two = L.Const(f32, 2.0)
    kernels = [
        L.Kernel(
            "k0",
            (loop("i", 8, "t", lambda i: L.Binary(f32, "mul", L.Load(f32, "in0", i), two)),),
            8,
            "mul",
        ),
        L.Kernel(
            "k1", (loop("j", copy_extent, "out0", lambda j: L.Load(f32, "t", j)),), 8, "reshape"
        ),
        L.Kernel(
            "k2",
            (loop("k", 8, "out1", lambda k: L.Binary(f32, "add", L.Load(f32, "t", k), two)),),
            8,
            "add",
        ),
    ]
    if second_writer:
        kernels.append(
            L.Kernel("k3", (loop("m", 8, "out0", lambda m: L.Load(f32, "in0", m)),), 8, "x")
        )
    program = L.Program("p", buffers, kernels, inputs=["in0"], outputs=["out0", "out1"])
    if state:
        program.inputs = ["out0"]
        program.state_of_output = {0: 0}
    return program


def test_forward_output_copies_drops_a_whole_copy() -> None:
    program = forward_output_copies(_copy_program())
    assert [k.name for k in program.kernels] == ["k0", "k2"]
    assert "t" not in program.buffers
    assert L.writes(program.kernels[0].body) == {"out0"}
    assert L.reads(program.kernels[1].body) == {"out0"}


@pytest.mark.parametrize("case", [{"copy_extent": 4}, {"state": True}, {"second_writer": True}])
def test_forward_output_copies_keeps_partial_state_and_shared_outputs(case: dict[str, Any]) -> None:
    program = forward_output_copies(_copy_program(**case))
    assert "k1" in [k.name for k in program.kernels] and "t" in program.buffers
