"""Validation of training hyper-parameters where they enter (optimizers, schedules, trainer).

A bad setting (``Adam(lr=-1)``, ``SGD(lr=nan)``, ``beta2=1.5``) used to be accepted and
only showed up as a diverging or NaN run; each check here names the setting, the value
and the valid range.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shapegrad.tensor import Tensor


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{left}{lo}, {hi}{right}"


def real(
    owner: str,
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float after checking it is a finite real number in the interval.

    ``low``/``high`` None mean unbounded; ``*_open`` excludes that end. An eager 0-d
    tensor is checked by value; a traced one (a learning rate fed to a compiled step) is
    returned as NaN unchecked, since its value is not known here.

    Raises:
        TypeError: not a real number (a bool, a string, a non-scalar tensor).
        ValueError: NaN, infinite or out of range; the message gives the valid range.
    """
    if isinstance(value, Tensor):
        if value.is_traced:
            return math.nan
        if value.size != 1 or value.dtype.name == "bool":
            raise TypeError(f"{owner}: {name} must be a real scalar, got a {value.aval} tensor")
        value = value.item()
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, int | float | np.integer | np.floating
    ):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__}")
    number = float(value)
    inside = math.isfinite(number)
    if inside and low is not None:
        inside = number > low if low_open else number >= low
    if inside and high is not None:
        inside = number < high if high_open else number <= high
    if not inside:
        span = _interval(low, high, low_open, high_open)
        raise ValueError(f"{owner}: {name} must be a finite number in {span}, got {value!r}")
    return number


def whole(owner: str, name: str, value: Any, low: int) -> int:
    """``value`` as an int after checking it is an integer (not a bool) ``>= low``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{owner}: {name} must be an int >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{owner}: {name} must be an int >= {low}, got {value}")
    return int(value)


def flag(owner: str, name: str, value: Any) -> bool:
    """``value`` after checking it is a bool (``nesterov="no"`` is truthy)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)
