"""Executors of compiled graphs: one Backend protocol, several implementations."""

from shapegrad.backends.base import (
    Backend,
    BackendUnavailable,
    BuildsArtifacts,
    CompileOptions,
    Executable,
    Generated,
    GeneratesSource,
    available_backends,
    backend_status,
    get_backend,
    known_backends,
    options_type,
    register_backend,
    validate_inputs,
)
from shapegrad.backends.options import BackendOptions, NoOptions

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendUnavailable",
    "BuildsArtifacts",
    "CompileOptions",
    "Executable",
    "Generated",
    "GeneratesSource",
    "NoOptions",
    "available_backends",
    "backend_status",
    "get_backend",
    "known_backends",
    "options_type",
    "register_backend",
    "validate_inputs",
]
