"""The ANE backend's options: ``sg.compile(f, backend="ane", **options)``, validated at the call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from shapegrad.backends.options import BackendOptions


@dataclass(frozen=True)
class AneOptions(BackendOptions):
    """Options of backend ``"ane"``.

    Attributes:
        precision: compute precision of the ML program, ``"fp16"`` (the Neural Engine's,
            default) or ``"fp32"`` (inputs and outputs are float32 either way).
        cache_dir: the package cache, replacing ``$SHAPEGRAD_CACHE_DIR/ane`` (default
            ``$XDG_CACHE_HOME/shapegrad/ane``).
    """

    backend: ClassVar[str] = "ane"

    precision: Literal["fp16", "fp32"] = "fp16"
    cache_dir: str | None = None

    def check(self) -> None:
        if self.cache_dir is not None and not self.cache_dir.strip():
            raise self.fail("cache_dir", "must be a directory path or None, got an empty string")


__all__ = ["AneOptions"]
