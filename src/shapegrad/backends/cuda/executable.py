"""A compiled CUDA program: device-resident buffers, one host call per step.

Memory: one device buffer per I/O slot (inputs, outputs, state, constants) and one
arena for every temp, allocated once; constants are uploaded once; state stays on
the device across steps (``read_state`` copies it back on demand). The launcher
library (``render.py``'s host code, compiled by nvcc) enqueues a step's kernels
and cuBLAS calls on the device's stream; a bound step captures them once as a CUDA
graph and replays it, so a training step costs one launch plus the batch copies.

When calls synchronise: ``exe(inputs)`` and ``bound.step(*batch)`` return host
arrays, so they wait for the step (one ``cudaStreamSynchronize``) and read the
error flag with it; ``bound.run_steps(*stacked)`` waits once for all K steps.
The state is read back only by ``state``/``read_state`` (a synchronising copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.backends.base import Array, StateLayout, explain_input_mismatch, validate_inputs
from shapegrad.backends.cuda.driver import DeviceContext
from shapegrad.backends.cuda.launcher import ffi
from shapegrad.compiler import loops as L
from shapegrad.ir import Graph
from shapegrad.shapes import ShapeError, fmt


class CudaError(RuntimeError):
    """A CUDA runtime or cuBLAS call failed (the message has the code)."""


class CudaIndexError(IndexError):
    """An index was out of range (checked on the device before it was used)."""


class CudaExecutable:
    """A compiled graph on one device; see the module docstring."""

    def __init__(
        self,
        graph: Graph,
        program: L.Program,
        lib: Any,
        path: str,
        device: DeviceContext,
        launches_per_step: int = 0,
    ) -> None:
        self.graph, self.program, self.lib, self.path, self.device = (
            graph,
            program,
            lib,
            path,
            device,
        )
        f = ffi()
        self.launches_per_step = launches_per_step  # kernels + cuBLAS calls (the dumped source)
        self.layout = StateLayout.of(graph)
        self.n_slots = max(program.n_slots, 1)
        self._slot_of_input = [program.buffers[b].slot for b in program.inputs]
        self._slot_of_output = [program.buffers[b].slot for b in program.outputs]
        self._buffers: dict[int, Any] = {}
        for spec in program.buffers.values():
            if spec.slot >= 0 and spec.slot not in self._buffers:
                self._buffers[spec.slot] = device.alloc(spec.size * spec.dtype.numpy.itemsize)
        self.arena = device.alloc(program.arena_bytes)
        self.err = device.alloc(8)
        self.io = f.new("void *[]", self.n_slots)
        for slot, buf in self._buffers.items():
            self.io[slot] = f.cast("void *", int(buf))
        self._arena_ptr = f.cast("char *", int(self.arena))
        self._err_ptr = f.cast("int *", int(self.err))
        self._no_steps = f.new("int64_t[]", self.n_slots)
        handle = f.new("void **")
        with device.active():
            rc = lib.sg_blas_create(handle)
        if rc:
            raise CudaError(f"cuBLAS initialisation failed (status {rc})")
        self.blas = handle[0]
        for name, value in program.constants.items():
            device.upload(self._buffers[program.buffers[name].slot], np.ascontiguousarray(value))
        self._bound: CudaBoundStep | None = None

    # -- the Executable protocol -----------------------------------------------------------
    def __call__(self, inputs: Sequence[Array]) -> list[Array]:
        validate_inputs(self.graph, inputs)
        return self.run_validated(inputs)

    def run_validated(self, inputs: Sequence[Array]) -> list[Array]:
        for i, a in enumerate(inputs):
            self.device.upload(self._buffers[self._slot_of_input[i]], np.asarray(a))
        self.enqueue(self.io, 1, self._no_steps)
        outs = [np.empty(n.shape, n.aval.dtype.numpy) for n in self.graph.outputs]
        for k, out in enumerate(outs):
            self.device.download(out, self._buffers[self._slot_of_output[k]])
        self.finish(1)
        if self._bound is not None:
            self._bound.stale = True
        return outs

    def bind(self, state: Sequence[Array] | None = None) -> CudaBoundStep:
        self._bound = CudaBoundStep(self, state)
        return self._bound

    # -- launching ---------------------------------------------------------------------------
    def enqueue(self, io: Any, k: int, steps: Any) -> None:
        with self.device.active():
            rc = self.lib.sg_enqueue_steps(
                io,
                self._arena_ptr,
                self._err_ptr,
                _void(self.device.stream_handle),
                self.blas,
                k,
                steps,
            )
        self.raise_launch_error(rc)

    def raise_launch_error(self, rc: int) -> None:
        if rc >= 1000:
            raise CudaError(f"compiled {self.program.name}: cuBLAS status {rc - 1000}")
        if rc:
            raise CudaError(f"compiled {self.program.name}: CUDA error {rc}")

    def finish(self, steps: int) -> None:
        """Wait for the stream, then raise what the program recorded (error-flag contract)."""
        flag = np.zeros(2, np.int32)
        self.device.download(flag, self.err)
        self.device.sync()
        code, step = int(flag[0]), int(flag[1])
        if not code:
            return
        text = self.program.errors.get(code, f"native error code {code}")
        message = f"compiled {self.program.name}: {text}"
        if steps > 1:
            done = f"steps 0..{step - 1} were applied" if step else "no step was applied"
            message += f"; at step {step} of {steps} ({done}, step {step} changed nothing)"
        raise CudaIndexError(message) if code in self.program.errors else CudaError(message)


class CudaBoundStep:
    """Device-resident state; one CUDA graph replay per step (see the module docstring)."""

    def __init__(self, exe: CudaExecutable, state: Sequence[Array] | None) -> None:
        self.exe = exe
        self.layout = exe.layout
        self.stale = False
        graph = exe.graph
        if state is not None:
            self.write_state(state)
        self._batch = [(i, graph.inputs[i]) for i in self.layout.batch_inputs]
        self.outputs = [
            np.empty(graph.outputs[k].shape, graph.outputs[k].aval.dtype.numpy)
            for k in self.layout.free_outputs
        ]
        self._graphs: dict[int, _Captured] = {}

    # -- state ---------------------------------------------------------------------------
    def write_state(self, state: Sequence[Array]) -> None:
        exe = self.exe
        if len(state) != len(self.layout.state_inputs):
            raise TypeError(
                f"expected {len(self.layout.state_inputs)} state arrays, got {len(state)}"
            )
        for i, value in zip(self.layout.state_inputs, state, strict=True):
            node = exe.graph.inputs[i]
            array = np.asarray(value)
            if array.shape != node.shape:
                raise ShapeError(
                    "bind", f"state {i} has shape {fmt(array.shape)}, expected {fmt(node.shape)}"
                )
            exe.device.upload(
                exe._buffers[exe._slot_of_input[i]], array.astype(node.aval.dtype.numpy, copy=False)
            )

    def read_state(self) -> list[Array]:
        exe = self.exe
        out = []
        for i in self.layout.state_inputs:
            node = exe.graph.inputs[i]
            host = np.empty(node.shape, node.aval.dtype.numpy)
            exe.device.download(host, exe._buffers[exe._slot_of_input[i]])
            out.append(host)
        exe.device.sync()
        return out

    @property
    def state(self) -> list[Array]:
        """Copies of the device state (a synchronising read; the state lives on the GPU)."""
        return self.read_state()

    # -- steps ----------------------------------------------------------------------------
    def step(self, *batch: Array) -> list[Array]:
        """One step; returns the free outputs (borrowed until the next call)."""
        self._validate(batch, None)
        stacked = self._run([a[None] for a in batch], 1)
        for out, value in zip(self.outputs, stacked, strict=True):
            out[...] = value[0]
        return self.outputs

    __call__ = step

    def run_steps(self, *stacked: Array) -> list[Array]:
        """K steps in one graph launch; outputs stacked ``[K, ...]`` (borrowed)."""
        k = int(np.shape(stacked[0])[0]) if stacked and np.ndim(stacked[0]) else 0
        if k < 1:
            raise ValueError(f"run_steps needs inputs stacked [K, ...] with K >= 1 (got K = {k})")
        self._validate(stacked, k)
        return self._run(list(stacked), k)

    def _validate(self, arrays: Sequence[Any], k: int | None) -> None:
        if len(arrays) != len(self._batch):
            raise TypeError(f"expected {len(self._batch)} batch inputs, got {len(arrays)}")
        for (i, node), a in zip(self._batch, arrays, strict=True):
            shape = node.shape if k is None else (k, *node.shape)
            explain_if_mismatched(node.attr.get("name", f"in{i}"), a, shape, node.aval.dtype.numpy)

    def _run(self, stacked: list[Array], k: int) -> list[Array]:
        exe = self.exe
        captured = self._captured(k)
        for buf, a in zip(captured.inputs, stacked, strict=True):
            exe.device.upload(buf, a)
        if captured.graph is None:  # MPI exchanges between launches: enqueue the steps
            io, steps = captured.keep
            exe.enqueue(io, k, steps)
        else:
            with exe.device.active():
                rc = exe.lib.sg_graph_launch(captured.graph, _void(exe.device.stream_handle))
            exe.raise_launch_error(rc)
        for out, buf in zip(captured.outputs, captured.output_buffers, strict=True):
            exe.device.download(out, buf)
        exe.finish(k)
        self.stale = False
        return captured.outputs

    def _captured(self, k: int) -> _Captured:
        """The K-step CUDA graph, with its stacked device buffers and host outputs."""
        if k in self._graphs:
            return self._graphs[k]
        exe, f = self.exe, ffi()
        io = f.new("void *[]", exe.n_slots)
        steps = f.new("int64_t[]", exe.n_slots)
        for slot, buf in exe._buffers.items():
            io[slot] = f.cast("void *", int(buf))

        def stacked_buffer(slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            buf = exe.device.alloc(nbytes * k)
            io[slot], steps[slot] = f.cast("void *", int(buf)), nbytes
            return buf

        inputs = [
            stacked_buffer(exe._slot_of_input[i], node.shape, node.aval.dtype.numpy)
            for i, node in self._batch
        ]
        outputs, output_buffers = [], []
        for j in self.layout.free_outputs:
            node = exe.graph.outputs[j]
            outputs.append(np.empty((k, *node.shape), node.aval.dtype.numpy))
            output_buffers.append(
                stacked_buffer(exe._slot_of_output[j], node.shape, node.aval.dtype.numpy)
            )
        graph = None
        if not exe.program.communicators:  # a host exchange (MPI) cannot be captured
            handle = f.new("void **")
            stream = _void(exe.device.stream_handle)
            with exe.device.active():
                rc = exe.lib.sg_graph_build(
                    io, exe._arena_ptr, exe._err_ptr, stream, exe.blas, k, steps, handle
                )
            exe.raise_launch_error(rc)
            graph = handle[0]
        captured = _Captured(graph, (io, steps), inputs, output_buffers, outputs)
        self._graphs[k] = captured
        return captured


@dataclass
class _Captured:
    """A captured K-step graph and what it points at (kept alive with it); ``graph`` is None
    for a program with collectives, whose steps are enqueued on each call instead."""

    graph: Any
    keep: tuple[Any, ...]
    inputs: list[Any]
    output_buffers: list[Any]
    outputs: list[Array]


def explain_if_mismatched(name: str, a: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if not (isinstance(a, np.ndarray) and a.shape == shape and a.dtype == dtype):
        explain_input_mismatch(name, a, shape, dtype)


def _void(handle: int) -> Any:
    return ffi().cast("void *", handle)
