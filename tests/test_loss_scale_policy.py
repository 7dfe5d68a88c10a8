"""One dynamic loss-scaling rule (train/mixed_precision.LossScalePolicy) for every path:
traced into the compiled float16 step, and evaluated eagerly by the ANE trainer's host
LossScaler. Both are checked step by step against a plain-Python statement of the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.train.ane import LossScaler
from shapegrad.train.mixed_precision import LossScalePolicy, init_state
from test_optim import BACKENDS


def reference(
    scale: float, good: int, skipped: int, finite: bool, window: int, lo: float, hi: float
) -> tuple[float, int, int]:
    """Overflow: halve (not below ``lo``), reset the streak, count the skip. Finite: extend
    the streak; at ``window`` double (not above ``hi``) and reset it."""
    if not finite:
        return max(lo, scale / 2), 0, skipped + 1
    if good + 1 >= window:
        return min(hi, scale * 2), 0, skipped
    return scale, good + 1, skipped


def flags(n: int, seed: int = 0) -> list[bool]:
    return [bool(f) for f in np.random.default_rng(seed).random(n) < 0.75]


@pytest.mark.parametrize(("lo", "hi"), [(1.0, 2.0**6), (4.0, math.inf)])
def test_host_scaler_follows_the_rule(lo: float, hi: float) -> None:
    scaler = LossScaler(scale=16.0, growth_interval=3, min_scale=lo, max_scale=hi)
    want = (16.0, 0, 0)
    for finite in flags(80):
        scaler.update(finite)
        want = reference(*want, finite, 3, lo, hi)
        assert (scaler.scale, scaler.good_steps, scaler.skipped) == want


@pytest.mark.parametrize("backend", ["eager", *BACKENDS])
@pytest.mark.parametrize("hi", [2.0**6, math.inf], ids=["bounded", "unbounded"])
def test_traced_policy_follows_the_rule(backend: str, hi: float) -> None:
    policy = LossScalePolicy(window=3, min_scale=1.0, max_scale=hi)
    run = (
        policy.next_state if backend == "eager" else sg.compile(policy.next_state, backend=backend)
    )
    state = init_state(16.0)
    want = (16.0, 0, 0)
    for finite in flags(80, seed=1):
        state = run(sg.tensor(np.bool_(finite)), state)
        want = reference(*want, finite, 3, 1.0, hi)
        got = (
            float(state["scale"].item()),
            int(state["good"].item()),
            int(state["skipped"].item()),
        )
        assert got == want


def test_an_unbounded_policy_adds_no_clamp_to_the_step() -> None:
    finite, state = sg.tensor(np.bool_(True)), init_state(16.0)
    unbounded = sg.compile(LossScalePolicy(3).next_state).graph(finite, state)
    bounded = sg.compile(LossScalePolicy(3, max_scale=2.0**15).next_state).graph(finite, state)
    assert len(list(bounded.nodes())) > len(list(unbounded.nodes()))


def test_trainers_share_the_policy() -> None:
    params = [sg.tensor(np.ones((2, 3), np.float32))]

    def loss(ps: list[sg.Tensor], x: sg.Tensor) -> sg.Tensor:
        return (ps[0] * x).sum()

    fp16 = sg.ScalarTrainer(loss, params, dtype="float16", loss_scale_window=7)
    assert fp16.strategy.plan.scaling == LossScalePolicy(7)
    pytest.importorskip("coremltools", reason="the ane backend needs coremltools")
    ane = sg.ScalarTrainer(loss, params, mode="compiled", backend="ane", loss_scale_window=7)
    assert ane.strategy.scaler.policy == LossScalePolicy(7, 1.0, 2.0**15)  # type: ignore[attr-defined]
