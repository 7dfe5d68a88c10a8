"""ScalarTrainer: eager == compiled, NumPy-reference updates, frozen params, fit, losses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import Tensor
from shapegrad.autodiff import _topological_order
from shapegrad.data import Batches, make_moons
from shapegrad.models import MoonsMLP as MLP
from shapegrad.ops.protocol import Prim
from shapegrad.train import ScalarTrainer, StopTraining, losses, optim, schedules
from test_optim import BACKENDS, MODES, ref_adam, ref_adamw, ref_sgd


def mlp_scores(params: Any, x: Tensor) -> Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(x @ w1.T + b1)
    h = sg.relu(h @ w2.T + b2)
    return (h @ w3.T + b3).reshape(-1)


def hinge_loss(params: Any, x: Tensor, y: Tensor) -> Tensor:
    return sg.relu(1.0 - y * mlp_scores(params, x)).mean()


def moons(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, labels = make_moons(n, noise=0.1, seed=seed)
    return x.astype(np.float32), (2.0 * labels - 1.0).astype(np.float32)


def mlp_params(dtype: str = "float32", seed: int = 0) -> MLP:
    return MLP.init(sg.nn.init.kaiming, seed=seed, dtype=dtype, h=16)


def _mode(mode: str) -> dict[str, str]:
    return (
        {"mode": "eager"}
        if mode == "eager"
        else {"mode": "compiled", "backend": mode.split("-", 1)[1]}
    )


# --- updates against NumPy, through the trainer (closed-form gradient) -----------------------


def quadratic(params: Any, a: Tensor, b: Tensor) -> Tensor:
    w, c = params
    return (0.5 * a * w * w + b * w).sum() + (c * c * c).sum() / 3.0


def quad_grads(ws: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [a * ws[0] + b, ws[1] ** 2]


TRAINER_CASES = [
    ("sgd", lambda: optim.SGD(0.05), ref_sgd, {}),
    ("momentum", lambda: optim.SGD(0.05, momentum=0.9), ref_sgd, {"momentum": 0.9}),
    (
        "nesterov",
        lambda: optim.SGD(0.05, momentum=0.8, nesterov=True),
        ref_sgd,
        {"momentum": 0.8, "nesterov": True},
    ),
    ("adam", lambda: optim.Adam(0.05), ref_adam, {}),
    ("adamw", lambda: optim.AdamW(0.05, weight_decay=0.2), ref_adamw, {"weight_decay": 0.2}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("label", "make", "ref", "hp"), TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES]
)
def test_trainer_updates_match_numpy(
    mode: str, label: str, make: Any, ref: Any, hp: dict[str, Any]
) -> None:
    rng = np.random.default_rng(1)
    ws = [rng.normal(size=(3, 4)), rng.uniform(0.5, 1.0, size=4)]
    a, b = rng.uniform(0.5, 2.0, size=(3, 4)), rng.normal(size=(3, 4))
    trainer = ScalarTrainer(quadratic, [sg.tensor(w) for w in ws], optimizer=make(), **_mode(mode))
    states: list[dict[str, Any]] = [{}, {}]
    for t in range(1, 21):
        loss = trainer.step(a, b)
        want = float((0.5 * a * ws[0] ** 2 + b * ws[0]).sum() + (ws[1] ** 3).sum() / 3)
        assert loss == pytest.approx(want, rel=1e-9)
        ws = [
            ref(w, g, s, t, 0.05, hp)
            for w, g, s in zip(ws, quad_grads(ws, a, b), states, strict=True)
        ]
    for got, want_w in zip(trainer.get_params(), ws, strict=True):
        np.testing.assert_allclose(got.numpy(), want_w, rtol=1e-6, atol=1e-9)
    assert int(trainer.optimizer_state()["step"]) == 20


@pytest.mark.parametrize("mode", MODES)
def test_adam_step_and_adamw_step_keep_their_own_state(mode: str) -> None:
    rng = np.random.default_rng(2)
    ws = [rng.normal(size=(3, 4)), rng.uniform(0.5, 1.0, size=4)]
    a, b = rng.uniform(0.5, 2.0, size=(3, 4)), rng.normal(size=(3, 4))
    for method, ref, hp in [
        ("adam_step", ref_adam, {"beta1": 0.7, "beta2": 0.9, "eps": 1e-7}),
        ("adamw_step", ref_adamw, {"weight_decay": 0.3}),
    ]:
        trainer = ScalarTrainer(quadratic, [sg.tensor(w) for w in ws], **_mode(mode))
        expected, states = [w.copy() for w in ws], [{}, {}]
        for t in range(1, 8):
            getattr(trainer, method)(a, b, lr=0.02, **hp)
            expected = [
                ref(w, g, s, t, 0.02, hp)
                for w, g, s in zip(expected, quad_grads(expected, a, b), states, strict=True)
            ]
        for got, want in zip(trainer.get_params(), expected, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


# --- eager vs compiled --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_and_compiled_give_the_same_200_step_curve(backend: str) -> None:
    x, y = moons()
    curves = []
    for mode in ("eager", "compiled"):
        trainer = ScalarTrainer(
            hinge_loss,
            mlp_params(),
            mode=mode,
            backend=backend,
            optimizer=optim.Adam(0.01),
            schedule=schedules.cosine_with_warmup(0.02, 200, 20),
            clip_norm=5.0,
        )
        curves.append(
            [
                trainer.step(x[k % 4 * 32 : (k % 4 + 1) * 32], y[k % 4 * 32 : (k % 4 + 1) * 32])
                for k in range(200)
            ]
        )
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-4, atol=1e-5)
    assert np.mean(curves[0][-20:]) < 0.5 * np.mean(curves[0][:20])


def test_compiled_step_traces_once_and_lr_changes_do_not_retrace() -> None:
    x, y = moons(32)
    trainer = ScalarTrainer(
        hinge_loss,
        mlp_params(),
        mode="compiled",
        backend="numpy",
        optimizer=optim.SGD(0.1, momentum=0.9),
    )
    for k in range(5):
        trainer.step(x, y, lr=0.1 / (k + 1))
    compiled_functions = trainer.strategy.functions.compiled  # type: ignore[attr-defined]
    (compiled,) = [c for key, c in compiled_functions.items() if key[0] == "step"]
    assert compiled.trace_count == 1  # type: ignore[attr-defined]


# --- requires_grad, gradients, forward ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_frozen_parameters_stay_fixed_in_the_trainer(mode: str) -> None:
    x, y = moons(64)
    params = mlp_params().freeze("w1", "b1")
    trainer = ScalarTrainer(
        hinge_loss, params, optimizer=optim.AdamW(0.05, weight_decay=0.5), **_mode(mode)
    )
    for _ in range(5):
        trainer.step(x, y)
    after = trainer.get_params()
    for k, name in enumerate(MLP.names):
        same = np.array_equal(after[k].numpy(), params[k].numpy())
        assert same == (name in ("w1", "b1")), name
    grads = trainer.backward(x, y)
    assert not grads[0].numpy().any() and grads[2].numpy().any()


def test_requires_grad_override_is_validated() -> None:
    with pytest.raises(ValueError, match="one flag per parameter"):
        ScalarTrainer(hinge_loss, mlp_params(), requires_grad=[True, False])
    with pytest.raises(ValueError, match="frozen"):
        ScalarTrainer(hinge_loss, mlp_params(), requires_grad=[False] * 6)


@pytest.mark.parametrize("mode", MODES)
def test_backward_matches_central_differences(mode: str) -> None:
    x, y = moons(16)
    params = mlp_params("float64", seed=3)
    trainer = ScalarTrainer(hinge_loss, params, **_mode(mode))
    grads = trainer.backward(x.astype(np.float64), y.astype(np.float64))
    rng = np.random.default_rng(0)
    direction = [rng.normal(size=t.shape) for t in params]
    eps = 1e-6

    def loss_at(sign: float) -> float:
        moved = MLP([t.numpy() + sign * eps * d for t, d in zip(params, direction, strict=True)])
        return float(
            hinge_loss(moved, sg.tensor(x.astype(np.float64)), sg.tensor(y.astype(np.float64)))
        )

    numeric = (loss_at(1.0) - loss_at(-1.0)) / (2 * eps)
    analytic = sum(float((g.numpy() * d).sum()) for g, d in zip(grads, direction, strict=True))
    assert analytic == pytest.approx(numeric, rel=1e-5)
    assert trainer.forward(x, y) == pytest.approx(loss_at(0.0), rel=1e-12)


def test_set_params_validates_and_replaces() -> None:
    trainer = ScalarTrainer(hinge_loss, mlp_params())
    other = mlp_params(seed=9)
    trainer.set_params(other)
    np.testing.assert_array_equal(trainer.get_params()[0].numpy(), other[0].numpy())
    with pytest.raises(ValueError, match="expected"):
        trainer.set_params(list(other)[:5])
    with pytest.raises(ValueError, match="parameter 0"):
        trainer.set_params([np.zeros((3, 2), np.float32), *list(other)[1:]])


def _dict_loss(p: dict[str, Tensor], x: Any) -> Tensor:
    return ((x @ p["w1"].T) @ p["w2"].T).sum()


def test_set_params_matches_dict_entries_by_key_not_position() -> None:
    a, b = np.ones((2, 3), np.float32), np.full((3, 2), 2.0, np.float32)
    trainer = ScalarTrainer(_dict_loss, {"w1": sg.zeros((2, 3)), "w2": sg.zeros((3, 2))})
    trainer.set_params({"w2": b, "w1": a})  # another order: matched by key
    got = trainer.get_params()
    assert list(got) == ["w1", "w2"]
    np.testing.assert_array_equal(got["w1"].numpy(), a)
    np.testing.assert_array_equal(got["w2"].numpy(), b)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert trainer.forward(x) == pytest.approx(float(((x @ a.T) @ b.T).sum()))
    with pytest.raises(TypeError, match=r"expected a dict with keys \['w1', 'w2'\], got a list"):
        trainer.set_params([a, b])
    with pytest.raises(ValueError, match=r"missing \['w2'\], unexpected \['w3'\]"):
        trainer.set_params({"w1": a, "w3": b})
    with pytest.raises(ValueError, match=r"parameter 0 \('w1'\) is float32\[3, 2\]"):
        trainer.set_params({"w1": b, "w2": a})
    np.testing.assert_array_equal(trainer.get_params()["w1"].numpy(), a)  # failures change nothing


def test_set_params_refuses_a_container_of_another_kind_or_names() -> None:
    trainer = ScalarTrainer(hinge_loss, mlp_params())
    other = mlp_params(seed=9)
    with pytest.raises(TypeError, match=r"expected a MoonsMLP of 6 entries, got a dict"):
        trainer.set_params(dict(zip(other.names, other, strict=True)))
    renamed = MLP(list(other), names=("a", "b", "c", "d", "e", "f"))
    with pytest.raises(ValueError, match=r"parameter names \['a'"):
        trainer.set_params(renamed)
    with pytest.raises(TypeError, match=r"params\[0\]: expected a tensor, got a list"):
        trainer.set_params([[other[0], other[0]], *list(other)[1:]])


def test_reset_optimizer_state() -> None:
    x, y = moons(32)
    trainer = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.Adam(0.01))
    trainer.step(x, y)
    assert int(trainer.optimizer_state()["step"]) == 1
    trainer.reset_optimizer_state()
    assert int(trainer.optimizer_state()["step"]) == 0
    assert not trainer.optimizer_state()["m"][0].numpy().any()


def test_unknown_backend_is_an_error_but_unavailable_c_falls_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        ScalarTrainer(hinge_loss, mlp_params(), mode="compiled", backend="tpu")
    if "c" in BACKENDS:
        pytest.skip("the C backend is available here, so there is no fallback to observe")
    trainer = ScalarTrainer(hinge_loss, mlp_params(), mode="compiled", backend="c")
    assert trainer.backend == "numpy"
    assert "falling back" in capsys.readouterr().out


# --- fit ------------------------------------------------------------------------------------


def test_fit_runs_epochs_calls_callbacks_and_stops() -> None:
    x, y = moons(96)
    batches = Batches(x, y, batch_size=32, seed=0)
    trainer = ScalarTrainer(
        hinge_loss, mlp_params(), optimizer=optim.SGD(0.1), schedule=schedules.linear_decay(0.1, 6)
    )
    seen: list[tuple[int, float]] = []
    history = trainer.fit(
        batches,
        epochs=2,
        callbacks=[lambda t, info: seen.append((info.step, info.lr))],
        progress=False,
    )
    assert len(history.loss) == 6 and len(history.epoch_loss) == 2
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(history.lr, [0.1 * (1 - k / 6) for k in range(6)], rtol=1e-6)
    assert history.epoch_loss[0] == pytest.approx(np.mean(history.loss[:3]))

    def stop_at_two(t: ScalarTrainer, info: Any) -> None:
        if info.step >= 8:
            raise StopTraining

    more = trainer.fit(batches, epochs=5, callbacks=[stop_at_two], progress=False)
    assert len(more.loss) == 2 and trainer.global_step == 8
    with pytest.raises(TypeError, match="one-shot"):
        trainer.fit(iter([(x, y)]), epochs=2, progress=False)


def test_fit_progress_bar_shows_loss(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = moons(64)
    trainer = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.SGD(0.1))
    trainer.fit([(x, y)] * 3, epochs=1, progress=True)
    err = capsys.readouterr().err
    assert "loss=" in err and "3/3" in err


# --- losses -----------------------------------------------------------------------------------


def _np_ce(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    shifted = logits - logits.max(1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)
    onehot = np.eye(logits.shape[1])[labels]
    value = float(-(onehot * np.log(probs)).sum(1).mean())
    return value, (probs - onehot) / len(labels)


@pytest.mark.parametrize("mode", ["eager", "compiled-numpy"])
def test_cross_entropy_value_and_fused_gradient(mode: str) -> None:
    rng = np.random.default_rng(4)
    logits, labels = rng.normal(size=(7, 5)) * 3, rng.integers(0, 5, size=7)
    fn: Any = sg.value_and_grad(losses.softmax_cross_entropy)
    if mode != "eager":
        fn = sg.compile(fn, backend="numpy")
    value, grad = fn(sg.tensor(logits), sg.tensor(labels, "int32"))
    want_value, want_grad = _np_ce(logits, labels)
    assert float(value) == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-10, atol=1e-14)
    onehot_value, onehot_grad = fn(sg.tensor(logits), sg.tensor(np.eye(5)[labels]))
    assert float(onehot_value) == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(onehot_grad.numpy(), want_grad, rtol=1e-10, atol=1e-14)


def test_cross_entropy_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(6)
    logits, labels = rng.normal(size=(4, 3)), rng.integers(0, 3, size=4)
    direction = rng.normal(size=(4, 3))
    g = sg.grad(losses.softmax_cross_entropy)(sg.tensor(logits), sg.tensor(labels, "int32")).numpy()
    eps = 1e-6
    plus = _np_ce(logits + eps * direction, labels)[0]
    minus = _np_ce(logits - eps * direction, labels)[0]
    assert float((g * direction).sum()) == pytest.approx((plus - minus) / (2 * eps), rel=1e-6)


def test_cross_entropy_backward_has_no_log() -> None:
    logits = sg.tensor(np.random.default_rng(0).normal(size=(6, 4)))
    labels = sg.tensor(np.arange(6) % 4, "int32")
    # Eager: the part of the tape autodiff walks (stop_gradient is a frontier).
    leaf = sg.ops.eager.EAGER.make_leaf(logits)
    loss = losses.softmax_cross_entropy(leaf, labels)
    walked = _topological_order([loss], {id(leaf)})
    prims = {t._tape.prim for t in walked if t._tape is not None}
    assert Prim.LOG not in prims and Prim.EXP not in prims
    # Compiled: the optimized gradient graph contains neither LOG nor EXP.
    fast = sg.compile(sg.grad(losses.softmax_cross_entropy), backend="numpy")
    graph = fast.graph(logits, labels)
    ops_in_graph = {node.prim for node in graph.nodes()}
    assert Prim.LOG not in ops_in_graph
    plain = sg.compile(
        sg.grad(
            lambda lg, lb: -(sg.log_softmax(lg) * sg.one_hot(lb, 4, dtype=lg.dtype)).sum(1).mean()
        ),
        backend="numpy",
    )
    assert Prim.EXP in {node.prim for node in plain.graph(logits, labels).nodes()}


def test_accuracy_and_predict() -> None:
    rng = np.random.default_rng(8)
    logits, labels = rng.normal(size=(50, 4)), rng.integers(0, 4, size=50)
    assert float(losses.accuracy(sg.tensor(logits), sg.tensor(labels, "int32"))) == pytest.approx(
        (logits.argmax(1) == labels).mean()
    )
    np.testing.assert_array_equal(losses.predict(sg.tensor(logits)).numpy(), logits.argmax(1))
    scores, signs = rng.normal(size=(30, 1)), np.where(rng.random(30) > 0.5, 1.0, -1.0)
    assert float(losses.accuracy(sg.tensor(scores), sg.tensor(signs))) == pytest.approx(
        ((scores[:, 0] > 0) == (signs > 0)).mean()
    )
    np.testing.assert_array_equal(
        losses.predict(sg.tensor(scores[:, 0])).numpy(), (scores[:, 0] > 0).astype(np.int32)
    )


# --- K steps per call and the bound (live) state -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_schedule", [False, True])
def test_step_many_equals_k_single_steps(mode: str, use_schedule: bool) -> None:
    x, y = moons(64)
    xs, ys = x.reshape(4, 16, 2), y.reshape(4, 16)
    sched = schedules.step_decay(0.05, 2, gamma=0.5) if use_schedule else None
    single = ScalarTrainer(
        hinge_loss, mlp_params(), optimizer=optim.Adam(0.05), schedule=sched, **_mode(mode)
    )
    many = ScalarTrainer(
        hinge_loss, mlp_params(), optimizer=optim.Adam(0.05), schedule=sched, **_mode(mode)
    )
    want = [single.step(xs[k], ys[k]) for k in range(4)] + [
        single.step(xs[k], ys[k]) for k in range(4)
    ]
    got = np.concatenate([many.step_many(xs, ys), many.step_many(xs, ys)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for a, b in zip(many.get_params(), single.get_params(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert many.global_step == 8 and int(many.optimizer_state()["step"]) == 8


@pytest.mark.parametrize("mode", MODES)
def test_state_reads_and_writes_between_steps(mode: str) -> None:
    # In compiled C mode the parameters live in the executable's buffers between steps;
    # reading, replacing and switching optimizers must behave exactly as in eager mode.
    x, y = moons(32)
    ref = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.SGD(0.1, momentum=0.9))
    t = ScalarTrainer(
        hinge_loss, mlp_params(), optimizer=optim.SGD(0.1, momentum=0.9), **_mode(mode)
    )
    for trainer in (ref, t):
        trainer.step(x, y)
        snapshot = [a.numpy().copy() for a in trainer.get_params()]
        trainer.step(x, y)
        trainer.set_params(MLP(snapshot))
        trainer.step(x, y)
        trainer.adam_step(x, y, lr=0.01)
        trainer.step(x, y)
    for a, b in zip(t.get_params(), ref.get_params(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert t.forward(x, y) == pytest.approx(ref.forward(x, y), rel=1e-5)
    assert int(t.optimizer_state()["step"]) == 4
    assert int(t.optimizer_state(optim.Adam(0.01))["step"]) == 1


@pytest.mark.skipif("c" not in BACKENDS, reason="the C backend (a C compiler) is not available")
def test_c_backend_keeps_state_in_the_executable() -> None:
    x, y = moons(32)
    t = ScalarTrainer(
        hinge_loss, mlp_params(), mode="compiled", backend="c", optimizer=optim.Adam(0.01)
    )
    t.step(x, y)
    live = t.strategy.live  # type: ignore[attr-defined]
    assert live is not None  # bound: later calls pass only the batch and the lr
    t.step(x, y)
    assert t.strategy.live is live  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", MODES)
def test_assigning_a_schedule_changes_the_learning_rate(mode: str) -> None:
    rng = np.random.default_rng(3)
    ws = [rng.normal(size=(3, 4)), rng.uniform(0.5, 1.0, size=4)]
    a, b = rng.uniform(0.5, 2.0, size=(3, 4)), rng.normal(size=(3, 4))
    trainer = ScalarTrainer(
        quadratic, [sg.tensor(w) for w in ws], optimizer=optim.SGD(0.05), **_mode(mode)
    )
    trainer.step(a, b)
    ws = [w - 0.05 * g for w, g in zip(ws, quad_grads(ws, a, b), strict=True)]
    trainer.schedule = schedules.constant(0.3)
    assert trainer.current_lr() == pytest.approx(0.3)
    trainer.step(a, b)
    ws = [w - 0.3 * g for w, g in zip(ws, quad_grads(ws, a, b), strict=True)]
    for got, want in zip(trainer.get_params(), ws, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_last_lr_reports_the_rate_each_step_used(mode: str) -> None:
    x, y = moons(32)
    sched = schedules.cosine_with_warmup(0.1, 10, warmup_steps=3)
    trainer = ScalarTrainer(
        hinge_loss, mlp_params(), optimizer=optim.SGD(0.1), schedule=sched, **_mode(mode)
    )
    used = []
    for _ in range(6):
        trainer.step(x, y)
        used.append(trainer.last_lr)
    np.testing.assert_allclose(used, sched.values(6), rtol=1e-6)
    trainer.step(x, y, lr=0.25)
    assert trainer.last_lr == pytest.approx(0.25)
    trainer.step_many(np.stack([x, x]), np.stack([y, y]))
    assert trainer.last_lr == pytest.approx(sched.value(8), rel=1e-6)  # steps 7 and 8 ran


def test_recipe_resume_refuses_other_settings_and_restores_the_same(tmp_path: Any) -> None:
    from shapegrad.train.recipe import RecipeMismatch, resume

    x, y = moons(32)
    saved = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.AdamW(0.01))
    for _ in range(3):
        saved.step(x, y)
    path = saved.save_checkpoint(tmp_path / "run.npz", {"recipe": {"batch_size": 32, "seed": 0}})
    fresh = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.AdamW(0.01))
    with pytest.raises(RecipeMismatch, match=r"batch_size 32 \(this run: 16\)"):
        resume(fresh, path, {"batch_size": 16, "seed": 0})
    assert fresh.global_step == 0  # nothing restored
    done = resume(fresh, path, {"batch_size": 32, "seed": 0})
    assert done.step == 3 and done.differences == [] and done.fresh_optimizer is None
    assert fresh.step(x, y) == pytest.approx(saved.step(x, y), rel=1e-6)  # Adam moments too
    other = ScalarTrainer(hinge_loss, mlp_params(), optimizer=optim.Adam(0.01))
    forced = resume(other, path, {"batch_size": 16, "seed": 0}, override=True)
    assert forced.fresh_optimizer == "AdamW" and forced.differences
    for a, b in zip(other.get_params(), ScalarTrainer(hinge_loss, mlp_params()).get_params(), strict=True):
        assert not np.array_equal(a.numpy(), b.numpy())  # the saved parameters, not fresh ones
    assert int(other.optimizer_state()["step"]) == 0 and other.global_step == 3
