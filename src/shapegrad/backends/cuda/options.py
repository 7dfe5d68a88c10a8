"""The CUDA backend's options: ``sg.compile(f, backend="cuda", **options)``, validated at the call."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import ClassVar

from shapegrad.backends.options import BackendOptions
from shapegrad.compiler.target import CUDA_TARGET, Target

ARCH_ENV = "SHAPEGRAD_CUDA_ARCH"
_ARCH = re.compile(r"^(sm|compute)_[0-9]{2,3}[a-z]?$")


@dataclass(frozen=True)
class CudaOptions(BackendOptions):
    """Options of backend ``"cuda"``.

    Attributes:
        device: the GPU's number (default 0).
        arch: the architecture nvcc compiles for, e.g. ``"sm_90"`` (default
            ``$SHAPEGRAD_CUDA_ARCH``, else the device's).
        target: a :class:`~shapegrad.compiler.target.Target` replacing ``CUDA_TARGET``.
    """

    backend: ClassVar[str] = "cuda"

    device: int = 0
    arch: str | None = None
    target: Target | None = None

    def check(self) -> None:
        if self.device < 0:
            raise self.fail("device", f"must be a GPU number >= 0, got {self.device}")
        if self.arch is not None and not _ARCH.match(self.arch):
            raise self.fail("arch", f"must look like 'sm_90' (nvcc -arch), got {self.arch!r}")

    def resolved_target(self) -> Target:
        """``target``, else ``CUDA_TARGET``."""
        return self.target or CUDA_TARGET

    def resolved_arch(self, device_arch: str | None = None) -> str | None:
        """``arch``, else ``$SHAPEGRAD_CUDA_ARCH``, else ``device_arch`` (the GPU's)."""
        return self.arch or os.environ.get(ARCH_ENV, "").strip() or device_arch


__all__ = ["ARCH_ENV", "CudaOptions"]
