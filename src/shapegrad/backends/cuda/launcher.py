"""The host-launcher library's ABI (cffi, ABI mode): what ``render.py``'s host code exports."""

from __future__ import annotations

import importlib
from typing import Any

_CDEF = """
int sg_enqueue_steps(void **io, char *arena, int *err, void *stream, void *blas,
                     int64_t k, const int64_t *step);
int sg_graph_build(void **io, char *arena, int *err, void *stream, void *blas,
                   int64_t k, const int64_t *step, void **exec);
int sg_graph_launch(void *exec, void *stream);
void sg_graph_free(void *exec);
int sg_blas_create(void **handle);
extern const char sg_key[];
"""

_FFI: Any = None


def ffi() -> Any:
    global _FFI
    if _FFI is None:
        cffi = importlib.import_module("cffi")  # untyped third-party module
        _FFI = cffi.FFI()
        _FFI.cdef(_CDEF)
    return _FFI


def load_launcher(path: str, key: str) -> Any:
    """``dlopen`` a launcher library and check its embedded key."""
    lib = ffi().dlopen(path)
    found = ffi().string(lib.sg_key).decode()
    if found != key:
        raise OSError(f"{path}: key {found!r} does not match {key!r}")
    return lib
