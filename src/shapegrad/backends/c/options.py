"""The C backend's options: ``sg.compile(f, backend="c", **options)``, validated at the call."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from shapegrad.backends.options import BackendOptions
from shapegrad.compiler.target import C_TARGET, Target

Denormals = Literal["keep", "flush"]


@dataclass(frozen=True)
class COptions(BackendOptions):
    """Options of backend ``"c"`` (None: the default the description names).

    Attributes:
        target: a :class:`~shapegrad.compiler.target.Target` replacing ``C_TARGET``.
        contract_min: smallest matrix product, in multiply-adds, sent to BLAS (shorthand
            for the target's ``contract_min_macs``).
        fuse_epilogues: shorthand for the target's ``fuse_epilogues``.
        vector_math: call libmvec's vector ``exp``/``tanh``/... (default: where it exists).
        denormals: the floating-point mode of each call: ``"keep"`` (IEEE denormals, the
            default) or ``"flush"`` (denormal floats flushed to zero on every thread, the
            caller's mode restored after; x86-64 FTZ/DAZ, aarch64 FZ).
        profile: per-kernel wall time, read with ``CExecutable.profile()``.
        cflags: compiler flags replacing ``$SHAPEGRAD_CFLAGS`` and the defaults
            (``toolchain.DEFAULT_CFLAGS``); a string is split like a shell would.
        unit_lines / split_min_lines: how the C is split into translation units (see
            ``render.render_c_units``; defaults ``render.UNIT_LINES`` /
            ``render.SPLIT_MIN_LINES``).

    ``flush_denormals=True/False`` is the old spelling of ``denormals="flush"/"keep"``
    (still accepted).
    """

    backend: ClassVar[str] = "c"

    target: Target | None = None
    contract_min: int | None = None
    fuse_epilogues: bool | None = None
    vector_math: bool | None = None
    denormals: Denormals = "keep"
    profile: bool = False
    cflags: tuple[str, ...] | None = None
    unit_lines: int | None = None
    split_min_lines: int | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [*super().names(), "flush_denormals"]

    @classmethod
    def renamed(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "flush_denormals" in kwargs:
            flush = kwargs.pop("flush_denormals")
            if "denormals" in kwargs:
                raise TypeError(
                    "sg.compile(backend='c'): give 'denormals' only ('flush_denormals' is its "
                    "old spelling)"
                )
            if not isinstance(flush, bool):
                raise TypeError(
                    "sg.compile(backend='c'): option 'flush_denormals' must be a bool, got "
                    f"{type(flush).__name__} {flush!r} (or say denormals='flush' / 'keep')"
                )
            kwargs["denormals"] = "flush" if flush else "keep"
        if isinstance(kwargs.get("cflags"), str):
            kwargs["cflags"] = tuple(shlex.split(kwargs["cflags"]))
        return kwargs

    def check(self) -> None:
        if self.contract_min is not None and self.contract_min < 0:
            raise self.fail("contract_min", f"must be >= 0 multiply-adds, got {self.contract_min}")
        for name in ("unit_lines", "split_min_lines"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise self.fail(name, f"must be >= 0 lines, got {value}")
        if self.cflags is not None and any(not flag.strip() for flag in self.cflags):
            raise self.fail("cflags", f"must not hold empty flags, got {self.cflags!r}")

    @property
    def flush(self) -> bool:
        """Whether calls run with denormals flushed to zero."""
        return self.denormals == "flush"

    def resolved_target(self) -> Target:
        """``C_TARGET`` (or ``target``) with the shorthands applied."""
        target = self.target or C_TARGET
        if self.contract_min is not None:
            target = target.replace(contract_min_macs=self.contract_min)
        if self.fuse_epilogues is not None:
            target = target.replace(fuse_epilogues=self.fuse_epilogues)
        return target


__all__ = ["COptions", "Denormals"]
