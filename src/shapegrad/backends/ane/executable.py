"""Calling a compiled ML program: host-side I/O conversion and Core ML prediction.

Core ML feeds and fetches named fp32/int32 arrays of rank >= 1.
:class:`IoSignature` converts shapegrad's positional arrays (any float
dtype, bool, rank 0) to that form and back. Execution goes through a
*runner* - a function from feeds to outputs by name. On macOS 13+ the runner
is ``MLModel(...).predict`` with compute units CPU_AND_NE; elsewhere calling
the executable raises :class:`AneExecutionUnavailable` (the program is still
compiled and saved). Tests pass their MIL evaluator as the runner to execute
the same program without Core ML.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shapegrad.backends.base import Array, Executable
from shapegrad.ir import Graph
from shapegrad.ops.protocol import AVal

from .lowering import MilProgram, host_input_dtype

MilRunner = Callable[[Mapping[str, Array]], Mapping[str, Array]]


class AneExecutionUnavailable(RuntimeError):
    """The program was built, but this machine cannot execute Core ML programs."""


def can_execute() -> tuple[bool, str]:
    """``(True, "")`` on macOS 13+ with coremltools' native runtime, else ``(False, reason)``."""
    if platform.system() != "Darwin":
        return False, f"Core ML prediction needs macOS 13+, this is {platform.system()}"
    release = platform.mac_ver()[0]
    major = int(release.split(".")[0]) if release else 0
    if major < 13:
        return False, f"Core ML ML programs (iOS16 opset) need macOS 13+, this is {release}"
    return True, ""


@dataclass(frozen=True)
class IoSignature:
    """Names and abstract values of a program's inputs and outputs, in graph order."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_avals: tuple[AVal, ...]
    output_avals: tuple[AVal, ...]

    @classmethod
    def of(cls, mil: MilProgram) -> IoSignature:
        graph = mil.graph
        return cls(
            tuple(mil.input_names),
            tuple(mil.output_names),
            tuple(n.aval for n in graph.inputs),
            tuple(n.aval for n in graph.outputs),
        )

    def feeds(self, arrays: Sequence[Array]) -> dict[str, Array]:
        """Positional shapegrad arrays -> Core ML feeds (fp32/int32, rank >= 1)."""
        feeds: dict[str, Array] = {}
        for name, aval, array in zip(self.input_names, self.input_avals, arrays, strict=True):
            host = np.asarray(array).astype(host_input_dtype(aval.dtype))
            feeds[name] = np.ascontiguousarray(host.reshape(aval.shape or (1,)))
        return feeds

    def fetch(self, outputs: Mapping[str, Array]) -> list[Array]:
        """Core ML outputs by name -> arrays with the graph's shapes and dtypes."""
        result: list[Array] = []
        for name, aval in zip(self.output_names, self.output_avals, strict=True):
            value = np.asarray(outputs[name]).reshape(aval.shape)
            kind = aval.dtype.numpy
            result.append(value != 0 if kind == np.bool_ else value.astype(kind))
        return result


def coreml_runner(package: Path) -> MilRunner:
    """``MLModel(package).predict`` on CPU + Neural Engine (macOS only)."""
    from ._mil import coremltools

    ct = coremltools()
    model = ct.models.MLModel(str(package), compute_units=ct.ComputeUnit.CPU_AND_NE)

    def run(feeds: Mapping[str, Array]) -> Mapping[str, Array]:
        outputs: Mapping[str, Array] = model.predict(dict(feeds))
        return outputs

    return run


class AneExecutable(Executable):
    """A graph compiled to a saved ``.mlpackage``; calling it runs Core ML prediction.

    Core ML keeps no state between predictions: ``bind`` returns None
    (``AneBackend.binds_state``); training feeds the weights every step.

    Attributes:
        graph: the implemented graph.
        package: path of the ``.mlpackage``.
        signature: host I/O conversion.
        stats: ``mil_ops``, ``converted_ops``, ``convert_seconds``, ``cached``, ``lowering``.
    """

    def __init__(
        self,
        graph: Graph,
        signature: IoSignature,
        package: Path,
        stats: Mapping[str, Any],
        runner: MilRunner | None = None,
    ) -> None:
        self.graph = graph
        self.signature = signature
        self.package = package
        self.stats = dict(stats)
        self._runner = runner

    def with_runner(self, runner: MilRunner) -> AneExecutable:
        """The same program executed by ``runner`` (e.g. a MIL interpreter in tests)."""
        return AneExecutable(self.graph, self.signature, self.package, self.stats, runner)

    def _resolve_runner(self) -> MilRunner:
        if self._runner is None:
            ok, reason = can_execute()
            if not ok:
                raise AneExecutionUnavailable(
                    f"the ane backend compiled and saved this function to {self.package}, but "
                    f"cannot execute it here: {reason}. Run it on a Mac, or compile with "
                    "backend='c' (or 'numpy') to execute on this machine"
                )
            self._runner = coreml_runner(self.package)
        return self._runner

    def __call__(self, inputs: Sequence[Array]) -> list[Array]:
        runner = self._resolve_runner()
        return self.signature.fetch(runner(self.signature.feeds(inputs)))
