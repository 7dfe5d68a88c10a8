"""Executors of compiled graphs: one Backend protocol, several implementations."""

from shapegrad.backends.base import (
    Backend,
    BackendUnavailable,
    CompileOptions,
    Executable,
    available_backends,
    get_backend,
    register_backend,
    validate_inputs,
)

__all__ = [
    "Backend",
    "BackendUnavailable",
    "CompileOptions",
    "Executable",
    "available_backends",
    "get_backend",
    "register_backend",
    "validate_inputs",
]
