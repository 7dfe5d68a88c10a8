"""Executors of compiled graphs: one Backend protocol, several implementations."""

from shapegrad.backends.base import (
    Backend,
    BackendUnavailable,
    CompileOptions,
    Executable,
    available_backends,
    backend_status,
    get_backend,
    known_backends,
    register_backend,
    validate_inputs,
)

__all__ = [
    "Backend",
    "BackendUnavailable",
    "CompileOptions",
    "Executable",
    "available_backends",
    "backend_status",
    "get_backend",
    "known_backends",
    "register_backend",
    "validate_inputs",
]
