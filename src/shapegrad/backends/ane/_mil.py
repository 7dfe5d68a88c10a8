"""The one place that imports coremltools (lazily: it costs ~2 s and is optional).

coremltools ships no type information, so its objects are ``Any`` here and
the rest of the ANE backend goes through these accessors.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from typing import Any

Var = Any  # a coremltools MIL Var
FP16_MAX = 65504.0
_OPTIONAL_FRONTENDS = (
    "torch",
    "torchvision",
    "torchaudio",
    "tensorflow",
    "sklearn",
    "xgboost",
    "libsvm",
    "executorch",
    "torchao",
    "transformers",
)


class CoremltoolsMissing(ImportError):
    """coremltools is not installed; the ANE backend needs it even to build programs."""


@functools.cache
def coremltools() -> Any:
    """The ``coremltools`` module, imported once (quietly: it logs about optional extras)."""
    quiet = [logging.getLogger(n) for n in ("coremltools", "root")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    # coremltools probes its optional frontends at import (torch alone can cost ~20 s).
    # We build MIL directly and need none of them, so frameworks not already imported
    # are hidden during this import; a process that imported torch first keeps it.
    hidden = [name for name in _OPTIONAL_FRONTENDS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # makes `import name` fail fast
    try:
        ct = importlib.import_module("coremltools")
    except ImportError as exc:
        raise CoremltoolsMissing(
            "the ane backend needs coremltools: pip install 'shapegrad[ane]'"
        ) from exc
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return ct


def _mil_attr(module: str, name: str) -> Any:
    coremltools()  # the friendly error when missing
    return getattr(importlib.import_module(module), name)


def builder() -> Any:
    """coremltools' MIL builder (``mb``)."""
    return _mil_attr("coremltools.converters.mil", "Builder")


def types_module() -> Any:
    """coremltools' MIL type module (``types.fp16``, ``types.bool``...)."""
    return _mil_attr("coremltools.converters.mil.mil", "types")


def function_class() -> Any:
    return _mil_attr("coremltools.converters.mil.mil", "Function")


def program_class() -> Any:
    return _mil_attr("coremltools.converters.mil.mil", "Program")


def target() -> Any:
    """``coremltools.target`` (deployment targets: iOS16 = macOS 13)."""
    return coremltools().target
