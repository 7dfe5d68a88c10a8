"""Invalid settings are refused where they enter, with the valid range in the message
(issue 24, item 8): optimizers, schedules, the trainer's own settings, sg.checkpoint."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.train import optim, schedules

NAN, INF = math.nan, math.inf

BAD_SETTINGS: list[tuple[str, Callable[[], Any], str]] = [
    ("Adam lr<0", lambda: optim.Adam(lr=-1), r"Adam: lr must be a finite number in \[0, inf\), got -1"),
    ("SGD lr nan", lambda: optim.SGD(lr=NAN), r"SGD: lr must be a finite number in \[0, inf\), got nan"),
    ("AdamW lr inf", lambda: optim.AdamW(lr=INF), r"AdamW: lr must be a finite number"),
    ("Adam beta1 nan", lambda: optim.Adam(0.1, beta1=NAN), r"beta1 must be a finite number in \[0, 1\)"),
    ("AdamW beta2 1", lambda: optim.AdamW(0.1, beta2=1.0), r"AdamW: beta2 must be a finite number in \[0, 1\), got 1.0"),
    ("Adam beta2<0", lambda: optim.Adam(0.1, beta2=-0.5), r"beta2 .* got -0.5"),
    ("Adam eps nan", lambda: optim.Adam(0.1, eps=NAN), r"Adam: eps must be a finite number in \[0, inf\)"),
    ("Adam eps inf", lambda: optim.Adam(0.1, eps=INF), r"eps must be a finite number"),
    ("AdamW wd<0", lambda: optim.AdamW(0.1, weight_decay=-0.01), r"AdamW: weight_decay must be .* got -0.01"),
    ("AdamW wd nan", lambda: optim.AdamW(0.1, weight_decay=NAN), r"weight_decay must be a finite number"),
    ("SGD momentum nan", lambda: optim.SGD(0.1, momentum=NAN), r"SGD: momentum must be a finite number"),
    ("SGD momentum<0", lambda: optim.SGD(0.1, momentum=-0.9), r"momentum must be .* got -0.9"),
    ("SGD wd inf", lambda: optim.SGD(0.1, weight_decay=INF), r"SGD: weight_decay must be a finite"),
    ("clip max_norm nan", lambda: optim.clip_by_global_norm([sg.ones(2)], NAN), r"max_norm must be a finite number in \(0, inf\)"),
    ("constant lr nan", lambda: schedules.constant(NAN), r"Constant: lr must be a finite number"),
    ("linear lr<0", lambda: schedules.linear_decay(-0.1, 10), r"LinearDecay: lr must be .* got -0.1"),
    ("linear final nan", lambda: schedules.linear_decay(0.1, 10, final_lr=NAN), r"final_lr must be a finite"),
    ("cosine lr inf", lambda: schedules.cosine_with_warmup(INF, 10), r"CosineWithWarmup: lr must be a finite"),
    ("cosine warmup<0", lambda: schedules.cosine_with_warmup(0.1, 10, warmup_steps=-2), r"warmup_steps must be an int >= 0, got -2"),
    ("step gamma 0", lambda: schedules.step_decay(0.1, 5, gamma=0.0), r"StepDecay: gamma must be a finite number in \(0, inf\), got 0.0"),
    ("step gamma nan", lambda: schedules.step_decay(0.1, 5, gamma=NAN), r"gamma must be a finite number"),
    ("checkpoint policy", lambda: sg.checkpoint(lambda x: x * 2.0, policy="bogus"), r"sg.checkpoint: policy must be one of \('recompute', 'residuals'\), got 'bogus'"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("make, message", [(m, msg) for _, m, msg in BAD_SETTINGS], ids=[n for n, _, _ in BAD_SETTINGS])
def test_bad_settings_are_refused_with_the_valid_range(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_settings_of_the_wrong_type_are_type_errors() -> None:
    with pytest.raises(TypeError, match="nesterov must be True or False, got 'yes'"):
        optim.SGD(0.1, momentum=0.9, nesterov="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Adam: lr must be a number, got str"):
        optim.Adam(lr="0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="beta1 must be a number, got bool"):
        optim.Adam(0.1, beta1=True)
    with pytest.raises(TypeError, match=r"LinearDecay: total_steps must be an int >= 1, got 2\.5"):
        schedules.linear_decay(0.1, 2.5)  # type: ignore[arg-type]


def test_the_ends_of_each_valid_range_are_accepted() -> None:
    optim.SGD(lr=0.0, momentum=0.0, weight_decay=0.0)
    optim.Adam(lr=np.float32(1e-3), beta1=0.0, beta2=0.0, eps=0.0)
    optim.AdamW(lr=sg.tensor(np.float32(0.01)), weight_decay=0.0)
    schedules.cosine_with_warmup(0.0, 1, warmup_steps=0, final_lr=0.0)
    schedules.step_decay(0.1, 1, gamma=2.0)


def _loss(p: list[sg.Tensor], x: Any) -> sg.Tensor:
    return (p[0] * x).sum()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_norm": NAN}, r"clip_norm must be a finite number in \(0, inf\), got nan"),
        ({"clip_norm": 0.0}, r"clip_norm must be a finite number in \(0, inf\)"),
        ({"loss_scale": INF}, r"loss_scale must be a finite number in \[1, inf\), got inf"),
        ({"loss_scale": 0.5}, r"loss_scale must be a finite number in \[1, inf\)"),
        ({"loss_scale_window": 0}, r"loss_scale_window must be an int >= 1, got 0"),
    ],
)
def test_trainer_settings_are_checked_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sg.ScalarTrainer(_loss, [sg.ones(2)], **kwargs)


def test_trainer_refuses_a_non_optimizer_and_a_bad_per_step_lr() -> None:
    with pytest.raises(TypeError, match=r"optimizer must be a shapegrad\.optim optimizer"):
        sg.ScalarTrainer(_loss, [sg.ones(2)], optimizer="adam")  # type: ignore[arg-type]
    trainer = sg.ScalarTrainer(_loss, [sg.ones(2)], optimizer=optim.SGD(lr=0.1))
    x = np.ones(2, np.float32)
    for bad in (INF, NAN, -0.1):
        with pytest.raises(ValueError, match=r"ScalarTrainer.step: lr must be a finite number"):
            trainer.step(x, lr=bad)
        with pytest.raises(ValueError, match=r"ScalarTrainer.step_many: lr must be a finite"):
            trainer.step_many(x[None], lr=bad)
    np.testing.assert_array_equal(trainer.get_params()[0].numpy(), 1.0)  # nothing was applied
    trainer.step(x, lr=0.5)
    np.testing.assert_allclose(trainer.get_params()[0].numpy(), 0.5)  # p - 0.5 * x


def test_loss_scale_policy_settings_are_checked() -> None:
    from shapegrad.train.mixed_precision import LossScalePolicy

    with pytest.raises(ValueError, match="LossScalePolicy: window must be an int >= 1, got 0"):
        LossScalePolicy(window=0)
    with pytest.raises(ValueError, match=r"min_scale must be a finite number in \(0, inf\)"):
        LossScalePolicy(min_scale=NAN)
    with pytest.raises(ValueError, match=r"max_scale must be >= min_scale \(1.0\) or inf, got nan"):
        LossScalePolicy(max_scale=NAN)
    assert LossScalePolicy(3, 1.0, INF).max_scale == INF
