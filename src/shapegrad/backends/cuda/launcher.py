"""The host-launcher library's ABI (cffi, ABI mode): what ``render.py``'s host code exports."""

from __future__ import annotations

from typing import Any

from shapegrad.backends.base import lazy_ffi

_CDEF = """
int sg_enqueue_steps(void **io, char *arena, int *err, void *stream, void *blas,
                     int64_t k, const int64_t *step);
int sg_graph_build(void **io, char *arena, int *err, void *stream, void *blas,
                   int64_t k, const int64_t *step, void **exec);
int sg_graph_launch(void *exec, void *stream);
void sg_graph_free(void *exec);
int sg_blas_create(void **handle);
int sg_mpi_bind(void **fns, const int64_t *handles, const int64_t *comms);
extern const char sg_key[];
"""

ffi = lazy_ffi(_CDEF)  # the launcher's cffi FFI (ABI mode)


def load_launcher(path: str, key: str) -> Any:
    """``dlopen`` a launcher library and check its embedded key."""
    lib = ffi().dlopen(path)
    found = ffi().string(lib.sg_key).decode()
    if found != key:
        raise OSError(f"{path}: key {found!r} does not match {key!r}")
    return lib
