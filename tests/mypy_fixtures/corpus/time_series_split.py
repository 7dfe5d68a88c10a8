"""Forecasting on a series split at an int time ``t`` (named like the time axis, as in
the maths: context ``x[:, :t]``, target ``x[:, t:]``), a linear autoregressor over
a window of ``k`` lags, and the top-``k`` largest errors."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def lagged(x: Float[Tensor, "b t"], k: int) -> Float[Tensor, "b n k"]:
    """Windows of ``k`` consecutive values: ``out[:, i] = x[:, i : i + k]``."""
    T = x.shape[1]
    return sg.stack([x[:, i : T - k + 1 + i] for i in range(k)], axis=-1)


@sg.typechecked
def forecast_error(series: Float[Tensor, "b t"], coef: Float[Tensor, " k"], t: int) -> Float[Tensor, "b m"]:
    k = coef.shape[0]
    context, target = series[:, :t], series[:, t:]
    windows = lagged(series[:, t - k : -1], k)  # the k values before each target step
    pred = windows @ coef
    del context
    return pred - target


@sg.typechecked
def tail_projection(series: Float[Tensor, "b t"], w: Float[Tensor, "r e"], t: int) -> Float[Tensor, "b e"]:
    return series[:, t:] @ w


@sg.typechecked
def worst(errors: Float[Tensor, "b m"], k: int) -> Float[Tensor, "b k"]:
    values, _ = sg.topk(sg.abs(errors), k, axis=-1)
    return values


def run() -> float:
    series = sg.randn((2, 9), seed=0)
    err = forecast_error(series, sg.randn((3,), seed=1) * 0.3, 5)
    assert err.shape == (2, 4)
    proj = tail_projection(series, sg.randn((4, 2), seed=2), 5)
    return float(worst(err, 2).sum().item() + proj.sum().item())
