"""Optimizers and schedules against independent NumPy implementations of the same updates."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor
from shapegrad.backends import BackendUnavailable, get_backend
from shapegrad.train import optim, schedules


def _backends() -> list[str]:
    names = ["numpy"]
    try:
        get_backend("c")
        names.append("c")
    except (BackendUnavailable, ImportError, ValueError):
        pass
    return names


BACKENDS = _backends()
MODES = ["eager", *[f"compiled-{b}" for b in BACKENDS]]


class Pair(ParamList[Float[Tensor, "n 3"], Float[Tensor, "3"]]):
    names = ("w", "b")


# --- NumPy reference updates (written from the papers / PyTorch docs, not from optim.py) ----


def ref_sgd(
    p: np.ndarray, g: np.ndarray, s: dict[str, Any], t: int, lr: float, hp: dict[str, Any]
) -> np.ndarray:
    g = g + hp.get("weight_decay", 0.0) * p
    mu = hp.get("momentum", 0.0)
    if mu:
        s["buf"] = mu * s.get("buf", np.zeros_like(p)) + g
        g = g + mu * s["buf"] if hp.get("nesterov") else s["buf"]
    return p - lr * g


def ref_adam(
    p: np.ndarray,
    g: np.ndarray,
    s: dict[str, Any],
    t: int,
    lr: float,
    hp: dict[str, Any],
    decoupled: bool = False,
) -> np.ndarray:
    b1, b2, eps, wd = (
        hp.get("beta1", 0.9),
        hp.get("beta2", 0.999),
        hp.get("eps", 1e-8),
        hp.get("weight_decay", 0.0),
    )
    if decoupled:
        p = p * (1.0 - lr * wd)  # PyTorch AdamW: decay first, then the Adam step
    else:
        g = g + wd * p
    s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
    m_hat = s["m"] / (1 - b1**t)
    v_hat = s["v"] / (1 - b2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps)


def ref_adamw(
    p: np.ndarray, g: np.ndarray, s: dict[str, Any], t: int, lr: float, hp: dict[str, Any]
) -> np.ndarray:
    return ref_adam(p, g, s, t, lr, hp, decoupled=True)


CASES: list[
    tuple[str, Callable[..., optim.Optimizer], Callable[..., np.ndarray], dict[str, Any]]
] = [
    ("sgd", optim.SGD, ref_sgd, {}),
    ("sgd-wd", optim.SGD, ref_sgd, {"weight_decay": 0.05}),
    ("momentum", optim.SGD, ref_sgd, {"momentum": 0.9}),
    ("nesterov", optim.SGD, ref_sgd, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("adam", optim.Adam, ref_adam, {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}),
    ("adam-l2", optim.Adam, ref_adam, {"weight_decay": 0.1}),
    ("adamw", optim.AdamW, ref_adamw, {"weight_decay": 0.1}),
]


def _random_problem(seed: int) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(4, 3)), rng.normal(size=3)]
    grads = [[rng.normal(size=(4, 3)), rng.normal(size=3)] for _ in range(20)]
    return params, grads


def _runner(mode: str, opt: optim.Optimizer) -> Callable[..., Any]:
    def update(params: Any, grads: Any, state: Any, lr: Tensor) -> Any:
        return opt.update(params, grads, state, lr)

    if mode == "eager":
        return update
    return sg.compile(update, backend=mode.split("-", 1)[1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("label", "cls", "ref", "hp"), CASES, ids=[c[0] for c in CASES])
def test_20_steps_match_numpy_reference(
    mode: str, label: str, cls: Any, ref: Any, hp: dict[str, Any]
) -> None:
    lr = 0.05
    start, grad_seq = _random_problem(seed=len(label))
    opt = cls(lr, **hp)
    run = _runner(mode, opt)
    params: Any = Pair([sg.tensor(a) for a in start])
    state = opt.init(params)
    expected = [a.copy() for a in start]
    ref_state: list[dict[str, Any]] = [{}, {}]
    for t, grads in enumerate(grad_seq, start=1):
        params, state = run(
            params, Pair([sg.tensor(g) for g in grads]), state, sg.tensor(np.float64(lr))
        )
        expected = [
            ref(p, g, s, t, lr, hp) for p, g, s in zip(expected, grads, ref_state, strict=True)
        ]
        for got, want in zip(params, expected, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-9)
    assert int(state["step"]) == 20
    assert params[0].dtype == sg.float64


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.1),
        lambda: optim.Adam(0.1),
        lambda: optim.AdamW(0.1, weight_decay=0.5),
    ],
)
def test_frozen_parameters_untouched(mode: str, make: Callable[[], optim.Optimizer]) -> None:
    opt = make()
    run = _runner(mode, opt)
    start, grad_seq = _random_problem(seed=3)
    params: Any = Pair([sg.tensor(a) for a in start]).freeze("b")
    state = opt.init(params)
    for grads in grad_seq[:5]:
        params, state = run(
            params, Pair([sg.tensor(g) for g in grads]), state, sg.tensor(np.float64(0.1))
        )
    assert params.requires_grad == (True, False)
    np.testing.assert_array_equal(params[1].numpy(), start[1])
    assert not np.allclose(params[0].numpy(), start[0])
    for slot in opt.slots:
        np.testing.assert_array_equal(state[slot][1].numpy(), np.zeros(3))


def test_flag_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 parameters"):
        optim.trainable_flags([sg.tensor([1.0]), sg.tensor([2.0])], [True])


@pytest.mark.parametrize("mode", MODES)
def test_clip_by_global_norm_matches_numpy(mode: str) -> None:
    rng = np.random.default_rng(5)
    grads = [rng.normal(size=(4, 3)) * 3, rng.normal(size=5)]
    fn: Callable[..., Any] = lambda gs: optim.clip_by_global_norm(gs, 1.5)  # noqa: E731
    if mode != "eager":
        fn = sg.compile(fn, backend=mode.split("-", 1)[1])
    clipped = fn([sg.tensor(g) for g in grads])
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    for got, g in zip(clipped, grads, strict=True):
        np.testing.assert_allclose(got.numpy(), g * min(1.0, 1.5 / norm), rtol=1e-9)
    small = optim.clip_by_global_norm([sg.tensor(np.array([0.3, 0.4]))], 1.5)
    np.testing.assert_allclose(small[0].numpy(), [0.3, 0.4], rtol=1e-9)


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(0.1, nesterov=True)
    with pytest.raises(ValueError, match="beta1"):
        optim.Adam(0.1, beta1=1.0)


# --- schedules -------------------------------------------------------------------------


def _ref_schedule(name: str, k: int) -> float:
    if name == "constant":
        return 0.3
    if name == "linear":
        return 1.0 + (0.1 - 1.0) * min(k / 40, 1.0)
    if name == "cosine":
        if k < 10:
            return 0.5 * (k + 1) / 10
        progress = min((k - 10) / 40, 1.0)
        return 0.01 + 0.5 * (0.5 - 0.01) * (1 + math.cos(math.pi * progress))
    return 0.8 * 0.5 ** (k // 7)


SCHEDULES = {
    "constant": schedules.constant(0.3),
    "linear": schedules.linear_decay(1.0, 40, final_lr=0.1),
    "cosine": schedules.cosine_with_warmup(0.5, 50, warmup_steps=10, final_lr=0.01),
    "step": schedules.step_decay(0.8, 7, gamma=0.5),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_match_closed_form(mode: str, name: str) -> None:
    sched = SCHEDULES[name]
    fn: Callable[..., Any] = lambda step: sched(step, sg.float64)  # noqa: E731
    if mode != "eager":
        fn = sg.compile(fn, backend=mode.split("-", 1)[1])
    for k in range(0, 60, 3):
        got = float(fn(sg.tensor(np.int32(k))))
        assert got == pytest.approx(_ref_schedule(name, k), rel=1e-9, abs=1e-12), k


def test_schedule_arguments_checked() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        schedules.cosine_with_warmup(0.1, 10, warmup_steps=10)
    with pytest.raises(ValueError, match="step_size"):
        schedules.step_decay(0.1, 0)
