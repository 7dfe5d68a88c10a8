"""The eager interpreter's slot for native kernels (dependency inversion).

The eager interpreter is core and may not import a backend. A higher layer
(``jit/eager_kernels.py``, installed by the package face) fills this slot with a
:class:`KernelProvider`. A composite marked with ``_fused.eager_kernel`` (a convolution,
a pooling, a norm, softmax, ...) asks it, in eager mode, for a :class:`CompositeKernel`
of its operand types: one native call for the forward and one for the VJP, compiled
from the composite itself (the same loop IR and renderer as ``sg.compile``). The eager
interpreter asks it for single primitives whose NumPy rule is slow (SCAN: a Python loop
over its body), forward only: their VJP rules are primitives again. The
provider may decline (no C compiler, an op it has not seen often enough, a kernel still
compiling in the background, an unusual operand); the composite then runs primitive by primitive on NumPy (``ops/reference.py``,
the reference), as it does for every op when no provider is installed or kernels are
switched off (``SHAPEGRAD_EAGER_KERNELS=0``, or :func:`enabled` ``(False)`` around a block).
``SHAPEGRAD_EAGER_KERNELS=sync`` keeps them on but asks the provider to compile in the
foreground (:func:`synchronous`): the call that triggers a compile then runs the kernel,
so which calls run native code does not depend on timing.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol

from shapegrad.ops.protocol import Attrs, AVal, Prim

ENV = "SHAPEGRAD_EAGER_KERNELS"


class CompositeKernel(Protocol):
    """A composite compiled for one operand signature (the provider's cache entry)."""

    single: bool  # one output array (else a pytree of them: ``rebuild``)

    def forward(self, arrays: Sequence[Any]) -> list[Any]:
        """The composite's outputs (NumPy arrays) from its tensor operands' arrays."""
        ...

    def rebuild(self, leaves: list[Any]) -> Any:
        """The composite's output structure around ``leaves`` (one per output array)."""
        ...

    def backward(
        self, arrays: Sequence[Any], cotangent: Any, needs: tuple[bool, ...]
    ) -> list[Any] | None:
        """Cotangents of the operands marked in ``needs`` (None for the others), or None
        when the provider cannot build this VJP (the caller then differentiates in Python)."""
        ...


class KernelProvider(Protocol):
    """Answers "a native kernel for this composite call?"; None keeps it on NumPy."""

    def composite(
        self,
        key: Hashable,
        fn: Callable[..., Any],
        inputs: Sequence[AVal],
        name: str,
        needs: tuple[bool, ...] | None = None,
    ) -> CompositeKernel | None:
        """The kernel of ``fn`` (a function of tensors ``inputs``; ``key`` names ``fn`` and
        every static argument it closes over; ``name`` is for people: errors the compiled
        code raises name it), or None. ``needs``: the call is recorded on a tape, and a
        backward pass will likely ask for the cotangents of these operands (a provider may
        then wait for that VJP's kernel before it answers with the forward's)."""
        ...

    def compiling(self, key: Hashable, needs: tuple[bool, ...] | None = None) -> bool:
        """Whether the kernel of ``key`` (or its VJP for ``needs``) is being compiled: the
        caller then runs the composite as written with kernels off, so that the composites
        it calls are not compiled for nothing."""
        ...

    def primitive(
        self, prim: Prim, inputs: Sequence[AVal], attrs: Attrs
    ) -> CompositeKernel | None:
        """The kernel of one primitive (keyed by its attributes' content, e.g. a SCAN's
        traced body, which is a new object at every trace), or None."""
        ...


def _env_mode() -> str:
    """``SHAPEGRAD_EAGER_KERNELS``: "background" (the default), "sync" or "off"."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return "background"
    if value == "sync":
        return "sync"
    if value in ("0", "false", "no", "off"):
        return "off"
    raise ValueError(
        f"{ENV}={value!r}: expected 1 (native eager kernels, compiled in the background: the "
        "default), sync (compiled before the call that needs them returns: deterministic) or "
        "0 (NumPy only)"
    )


def _env_enabled() -> bool:
    return _env_mode() != "off"


def synchronous() -> bool:
    """Whether ``SHAPEGRAD_EAGER_KERNELS=sync`` asks providers to compile in the foreground
    (the call that triggers a compile waits for it and runs the kernel), read at import."""
    return _ENV_SYNC


class _Switch(threading.local):
    def __init__(self) -> None:
        self.on = _ENV_ON


_ENV_MODE = _env_mode()
_ENV_ON = _ENV_MODE != "off"
_ENV_SYNC = _ENV_MODE == "sync"
_SWITCH = _Switch()
_PROVIDER: list[KernelProvider] = []


def install(provider: KernelProvider | None) -> None:
    """Make ``provider`` the process's kernel provider (None removes it)."""
    _PROVIDER.clear()
    if provider is not None:
        _PROVIDER.append(provider)


def installed() -> KernelProvider | None:
    """The installed provider, whether or not kernels are enabled."""
    return _PROVIDER[0] if _PROVIDER else None


def provider() -> KernelProvider | None:
    """The installed provider while kernels are enabled on this thread, else None."""
    return _PROVIDER[0] if _PROVIDER and _SWITCH.on else None


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Native eager kernels on (``True``) or off (NumPy only) within the block, this thread."""
    previous = _SWITCH.on
    _SWITCH.on = on
    try:
        yield
    finally:
        _SWITCH.on = previous
