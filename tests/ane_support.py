"""Helpers shared by the ANE tests: trace a function, lower it to MIL, run it in the MIL evaluator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from mil_evaluator import run_mil
from shapegrad.backends.ane import IoSignature, MilProgram, lower_to_mil
from shapegrad.backends.ane._mil import CoremltoolsMissing, coremltools
from shapegrad.ir import Graph


def require_coremltools() -> None:
    """Skip the calling test module when coremltools is missing (imported the backend's way,
    which keeps it from loading torch/tensorflow it does not need)."""
    try:
        coremltools()
    except CoremltoolsMissing:
        pytest.skip("the ane backend needs coremltools", allow_module_level=True)


def traced_graph(fn: Callable[..., Any], arrays: Sequence[np.ndarray]) -> Graph:
    """The optimized graph ``sg.compile`` builds for ``fn`` on arrays of these shapes/dtypes."""
    return sg.compile(fn, backend="numpy").graph(*[sg.tensor(a) for a in arrays])


def run_lowered(mil: MilProgram, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Execute a lowered program in the MIL evaluator with positional shapegrad arrays."""
    signature = IoSignature.of(mil)
    return signature.fetch(run_mil(mil.program, signature.feeds(list(arrays))))


def mil_call(
    fn: Callable[..., Any], arrays: Sequence[np.ndarray], precision: str = "fp16"
) -> list[np.ndarray]:
    """``fn(*arrays)`` traced, lowered to MIL with ``precision`` compute and evaluated."""
    return run_lowered(lower_to_mil(traced_graph(fn, arrays), precision), arrays)


def mil_grad(
    fn: Callable[..., Any], arrays: Sequence[np.ndarray], argnums: tuple[int, ...], precision: str
) -> list[np.ndarray]:
    """Gradient of scalar ``fn`` w.r.t. ``argnums``, through the lowered MIL program."""
    return mil_call(sg.grad(fn, argnums=argnums), arrays, precision)


def evaluator_runner(mil: MilProgram) -> Callable[[Any], Any]:
    """A MilRunner (feeds -> outputs by name) that executes ``mil`` in the evaluator."""
    program = mil.program
    return lambda feeds: run_mil(program, feeds)
