"""A library built from several translation units: objects compiled in parallel, each
cached by its own content, then linked.

One giant C function makes gcc's time grow faster than the program (the 64-layer MLP
step: 3900 lines, 1.9 s at ``-O2`` as one unit). Split into units (``render_c_units``),
each unit is compiled to ``<unit key>.o`` in the private cache, with up to one compiler
process per CPU; a unit whose source and flags did not change is not compiled again, so
editing one kernel recompiles one unit. The link step also compiles the one-line unit
holding ``sg_key`` (the library's key, checked after ``dlopen``), so no object needs to
know the key of the library it ends up in.

Keys: an object's key hashes its source, flags, compiler identity, CPU and the shapegrad
version (as :class:`~shapegrad.backends.c.native.BuildSpec` does for a library); the
library's key hashes its objects' keys, the compiler and the link line. Objects and the
library are written atomically with a SHA-256 next to them and are read only when they
are ours alone (the rules of ``_cache.py``); the linker gets a private name for each
checked object (``native.pinned_path``), never the shared one.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shapegrad import _cache
from shapegrad.backends import native
from shapegrad.backends.native import CacheError, CompileError


@dataclass(frozen=True)
class UnitSpec:
    """One translation unit: its name (for error messages), source and compiler flags."""

    name: str
    source: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class LinkSpec:
    """Everything that determines a multi-unit library: its units, compiler, link line."""

    units: tuple[UnitSpec, ...]
    cc: str
    link: tuple[str, ...]
    link_flags: tuple[str, ...] = ("-fPIC", "-shared", "-fopenmp")

    def object_key(self, unit: UnitSpec) -> str:
        return _digest(
            unit.source,
            native.compiler_version(self.cc),
            self.cc,
            " ".join(unit.flags),
            "-fPIC -c",
            native.cpu_identity(),
            native.VERSION,
        )

    @property
    def key(self) -> str:
        return _digest(
            "multi-unit",
            *(self.object_key(u) for u in self.units),
            self.cc,
            " ".join(self.link_flags),
            " ".join(self.link),
        )

    def sources(self) -> str:
        """Every unit's source, for a debug dump (each headed by its name)."""
        return "".join(f"/* ===== unit {u.name} ===== */\n{u.source}" for u in self.units)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def workers() -> int:
    """Compiler processes run at once: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def library_for(spec: LinkSpec) -> tuple[str, bool]:
    """(path, was_cached): the verified cached library for ``spec``, else a fresh link of
    its objects (each from the cache or compiled now, in parallel).

    Raises:
        CompilerNotFound / CompileError / CacheError: as ``native.build_library``.
    """
    found = native.cached_library_by_key(spec.key)
    if found is not None:
        return found, True
    folder = native.library_dir()
    try:
        return _build_in(spec, folder), False
    except OSError as exc:
        if folder == _cache.fallback_dir():
            raise CacheError(
                f"C backend: cannot write to {folder!r} ({exc.strerror or exc}); "
                "set $XDG_CACHE_HOME to a writable directory you own"
            ) from exc
        fallback = _cache.bypass(folder, f"writing to it failed ({exc.strerror or exc})")
        try:
            return _build_in(spec, fallback), False
        except OSError as again:
            raise CacheError(
                f"C backend: cannot write to {fallback!r} ({again.strerror or again})"
            ) from again


def remove_library(key: str) -> None:
    """Drop a cached library (it failed to load although its checksum matched)."""
    path = os.path.join(native.library_dir(), key + ".so")
    _cache.unlink_quietly(path + ".sha256")
    _cache.unlink_quietly(path)


def _build_in(spec: LinkSpec, folder: str) -> str:
    _cache.remove_stale_temps(folder, native.is_temp)
    objects = [os.path.join(folder, spec.object_key(u) + ".o") for u in spec.units]
    missing = [
        (u, path)
        for u, path in zip(spec.units, objects, strict=True)
        if native.verified_bytes(path) is None
    ]
    # Largest first: the pool's last task is then a small one.
    missing.sort(key=lambda item: -len(item[0].source))
    # Threads only wait for compiler processes: this is a pool of up to workers() of them.
    with ThreadPoolExecutor(max_workers=max(1, min(workers(), len(missing)))) as pool:
        for future in [pool.submit(_compile_object, spec, u, p) for u, p in missing]:
            future.result()  # re-raises the first failure (the others still finish)
    return _link(spec, objects, folder)


def _compile_object(spec: LinkSpec, unit: UnitSpec, final: str) -> None:
    """Compile ``unit`` to ``final`` (atomically, with its checksum)."""
    folder, key = os.path.dirname(final), os.path.basename(final)[:-2]
    with native.build_dir(folder) as work:
        tmp_c, tmp_o = os.path.join(work, key + ".c"), os.path.join(work, key + ".o")
        with open(tmp_c, "w", encoding="utf-8") as handle:
            handle.write(unit.source)
        cmd = [*shlex.split(spec.cc), *unit.flags, "-fPIC", "-c", tmp_c, "-o", tmp_o]
        limit = native.compile_time_limit(600.0)
        proc = native.run_compiler(
            cmd, spec.cc, limit, tmp_c, os.path.join(folder, key + ".failed.c")
        )
        native.count_object_compile()
        if proc.returncode != 0:
            _cache.raise_if_out_of_space(folder, proc.stderr)  # full disk: private cache
            kept = os.path.join(folder, key + ".failed.c")
            os.replace(tmp_c, kept)
            raise CompileError(
                f"C backend: {cmd[0]} failed on unit {unit.name} ({kept}, exit "
                f"{proc.returncode}):\n{proc.stderr.strip()[-4000:]}"
            )
        native.publish(tmp_o, final, 0o600)


def _link(spec: LinkSpec, objects: list[str], folder: str) -> str:
    """Link ``objects`` (plus the key unit) into the cached library; returns its load path.
    The linker reads each object through a private name for the file that was checked."""
    key = spec.key
    final = os.path.join(folder, key + ".so")
    objects = [native.pinned_path(path) for path in objects]
    with native.build_dir(folder) as work:
        tmp_c, tmp_so = os.path.join(work, key + ".c"), os.path.join(work, key + ".so")
        with open(tmp_c, "w", encoding="utf-8") as handle:
            handle.write(f'const char sg_key[] = "{key}";\n')
        cmd = [
            *shlex.split(spec.cc),
            *spec.link_flags,
            *objects,
            tmp_c,
            "-o",
            tmp_so,
            *spec.link,
        ]
        limit = native.compile_time_limit(600.0)
        proc = native.run_compiler(
            cmd, spec.cc, limit, tmp_c, os.path.join(folder, key + ".failed.c")
        )
        if proc.returncode != 0:
            _cache.raise_if_out_of_space(folder, proc.stderr)
            raise CompileError(
                f"C backend: linking {len(objects)} units with {cmd[0]} failed (exit "
                f"{proc.returncode}):\n{proc.stderr.strip()[-4000:]}"
            )
        native.publish(tmp_so, final, 0o700)
    return native.load_path(final)
