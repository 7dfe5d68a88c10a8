"""The CUDA driver layer: one small module over pycuda (devices, contexts, streams, memory).

Everything that touches pycuda lives here, so the rest of the backend (and
``import shapegrad``) works on machines without it. Per device N there is one
:class:`DeviceContext`: the device's primary context (shared with the CUDA
runtime that the compiled launcher uses, so pointers from either side are
valid in both), one stream on which every copy, kernel and library call of
that device is ordered, and allocation helpers. Programs are bound to a device
by number (``sg.compile(..., backend="cuda", device=N)``).

Example:
    >>> ctx = device_context(0)
    >>> buf = ctx.alloc(1024); ctx.upload(buf, np.ones(256, np.float32)); ctx.sync()
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.backends.base import Array, BackendUnavailable


def pycuda_driver() -> Any:
    """``pycuda.driver``, initialised; raises BackendUnavailable naming what is missing."""
    try:
        cuda = importlib.import_module("pycuda.driver")
    except ImportError as exc:
        raise BackendUnavailable(
            "CUDA backend needs pycuda (pip install 'shapegrad[cuda]'; building pycuda needs "
            f"the CUDA toolkit): {exc}"
        ) from exc
    try:
        cuda.init()
    except Exception as exc:  # pycuda raises its own error types (no driver, no device)
        raise BackendUnavailable(f"CUDA backend: no usable NVIDIA driver: {exc}") from exc
    return cuda


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the driver reports it."""

    number: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    multiprocessors: int

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def devices() -> list[DeviceInfo]:
    """Every visible GPU (raises BackendUnavailable without pycuda or a driver)."""
    cuda = pycuda_driver()
    found = []
    for n in range(cuda.Device.count()):
        dev = cuda.Device(n)
        sms = dev.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
        found.append(
            DeviceInfo(n, dev.name(), dev.compute_capability(), dev.total_memory(), int(sms))
        )
    return found


class DeviceContext:
    """The primary context, stream and memory of one device."""

    def __init__(self, number: int) -> None:
        cuda = pycuda_driver()
        count = cuda.Device.count()
        if not 0 <= number < count:
            raise BackendUnavailable(
                f"CUDA backend: device {number} requested, {count} device(s) visible"
            )
        self.cuda = cuda
        self.number = number
        self.device = cuda.Device(number)
        self.context = self.device.retain_primary_context()
        with self.active():
            self.stream = cuda.Stream()
        self.info = devices()[number]

    @contextmanager
    def active(self) -> Any:
        """Make this device's context current for the duration."""
        self.context.push()
        try:
            yield self
        finally:
            self.cuda.Context.pop()

    @property
    def stream_handle(self) -> int:
        return int(self.stream.handle)

    def alloc(self, nbytes: int) -> Any:
        """Device memory (at least 256 bytes, so empty tensors still get a pointer)."""
        with self.active():
            return self.cuda.mem_alloc(max(int(nbytes), 256))

    def upload(self, dst: Any, src: Array) -> None:
        """Host -> device, ordered on the stream."""
        if src.nbytes:
            with self.active():
                self.cuda.memcpy_htod_async(dst, np.ascontiguousarray(src), self.stream)

    def download(self, dst: Array, src: Any) -> None:
        """Device -> host into ``dst`` (ordered on the stream; call :meth:`sync` before use)."""
        if dst.nbytes:
            with self.active():
                self.cuda.memcpy_dtoh_async(dst, src, self.stream)

    def sync(self) -> None:
        with self.active():
            self.stream.synchronize()


_CONTEXTS: dict[int, DeviceContext] = {}


def device_context(number: int = 0) -> DeviceContext:
    """The (shared) context of device ``number``."""
    if number not in _CONTEXTS:
        _CONTEXTS[number] = DeviceContext(number)
    return _CONTEXTS[number]


def availability() -> tuple[bool, str]:
    """(usable here, reason if not): pycuda, a driver, at least one device."""
    try:
        found = devices()
    except BackendUnavailable as exc:
        return False, str(exc)
    if not found:
        return False, "CUDA backend: the driver reports no GPU"
    return True, ""
