"""Turning a :class:`MilProgram` into a saved ``.mlpackage``, cached on disk by content hash.

The key hashes the MIL text, every constant's bytes, the compute precision,
deployment target, compute units and the coremltools / shapegrad versions.
Packages are written under a temporary name and renamed into place
(``_cache.publish_tree``), so a parallel process never opens half a package. Core ML
loads a package by its path, so a package is used only when it and every file and
directory in it are ours alone with no link anywhere (``_cache.trusted_tree``), in a
cache directory no other user can rename (``_cache.private_dir`` checks every ancestor). ``SHAPEGRAD_DEBUG=<dir>`` (or
``CompileOptions.debug_dir``) receives the MIL text of every compiled program.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shapegrad import _cache
from shapegrad._version import __version__

from ._errors import AneLoweringError
from ._mil import coremltools, target
from .lowering import MilProgram

DEPLOYMENT = "iOS16"  # = macOS 13, the first Core ML with fp16 I/O and the MIL ops we emit
DEBUG_ENV = "SHAPEGRAD_DEBUG"


def cache_root() -> Path:
    """``<cache home>/ane``: ``$SHAPEGRAD_CACHE_DIR/ane``, default
    ``$XDG_CACHE_HOME/shapegrad/ane`` (see ``_cache.cache_home``)."""
    return Path(_cache.cache_home()) / "ane"


def canonical_ops(mil: MilProgram) -> list[str]:
    """One line per op with coremltools' counter-based names replaced by positions.

    (Auto-generated MIL names like ``add_315`` depend on how many programs this
    process built before, so they must not reach the cache key.)
    """
    func = mil.program.functions["main"]
    names = {var.name: f"in{k}" for k, var in enumerate(func.inputs.values())}
    lines: list[str] = []
    for k, op in enumerate(mil.operations()):
        args = []
        for key, var in op.inputs.items():
            group = var if isinstance(var, list | tuple) else [var]
            args.append(f"{key}=" + ",".join(names.get(v.name, "?") for v in group))
        for j, out in enumerate(op.outputs):
            names[out.name] = f"v{k}.{j}"
        types = ",".join(f"{out.dtype}{list(out.shape)}" for out in op.outputs)
        lines.append(f"{op.op_type}({' '.join(args)}) -> {types}")
    lines.append("return " + ",".join(names[v.name] for v in func.outputs))
    return lines


def content_hash(mil: MilProgram) -> str:
    """A hex digest of everything that determines the compiled package."""
    ct = coremltools()
    digest = hashlib.sha256()
    parts = [*canonical_ops(mil), *mil.input_names, *mil.output_names, mil.precision]
    parts += [DEPLOYMENT, "CPU_AND_NE", ct.__version__, __version__]
    for part in parts:
        digest.update(part.encode() + b"\n")
    for op in mil.operations():
        if op.op_type == "const":
            value = op.val.val
            digest.update(str(getattr(value, "dtype", type(value))).encode())
            digest.update(value.tobytes() if hasattr(value, "tobytes") else repr(value).encode())
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class Package:
    """A saved ML program: where it is and what it took to build."""

    path: Path
    key: str
    cached: bool  # True when found on disk, not converted now
    convert_seconds: float
    mil_ops: int  # MIL ops (no consts) as lowered
    converted_ops: int  # MIL ops after coremltools' optimization passes (0 when cached)


def convert(mil: MilProgram) -> Any:
    """``ct.convert`` the program to an ML program model for CPU + Neural Engine.

    The program's own casts decide fp16 vs fp32, so coremltools is told to keep
    fp32 ops as they are. Note: coremltools rewrites ``mil.program`` in place.
    """
    ct = coremltools()
    try:
        return ct.convert(
            mil.program,
            convert_to="mlprogram",
            compute_units=ct.ComputeUnit.CPU_AND_NE,
            minimum_deployment_target=getattr(target(), DEPLOYMENT),
            compute_precision=ct.precision.FLOAT32,
        )
    except ValueError as exc:  # Core ML's limits (rank <= 5), said as our lowering says them
        if "rank" not in str(exc):
            raise
        raise AneLoweringError(
            "convert", f"{exc} (Core ML takes tensors of rank <= 5 only)"
        ) from exc


def build_package(mil: MilProgram, name: str = "fn", root: Path | None = None) -> Package:
    """The ``.mlpackage`` of ``mil``: from the cache, or converted, saved and cached now.

    Args:
        mil: the lowered program (consumed: conversion rewrites it).
        name: readable name, used in the package file name.
        root: cache directory (default :func:`cache_root`).
    Returns:
        a :class:`Package`.
    Example:
        >>> pkg = build_package(lower_to_mil(graph), "loss")   # doctest: +SKIP
        >>> pkg.path.suffix
        '.mlpackage'
    """
    key = content_hash(mil)
    # Only a directory (and package) that is ours alone is trusted: see shapegrad._cache.
    folder = Path(_cache.private_dir(str(root or cache_root())))
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in name) or "fn"
    final = folder / f"{safe}-{key}.mlpackage"
    lowered_ops = mil.op_count()
    if _trusted_package(final):
        return Package(final, key, True, 0.0, lowered_ops, 0)
    _discard(final)  # someone else's, group-writable or holding a link: replaced
    _cache.remove_stale_temps(str(folder), lambda entry: entry.startswith("."))
    start = time.perf_counter()
    model = convert(mil)
    seconds = time.perf_counter() - start
    scratch = Path(tempfile.mkdtemp(prefix=f".{safe}-", dir=folder))
    try:
        staged = scratch / final.name
        model.save(str(staged))
        # coremltools honours the umask, which may be 0: publish_tree makes it private
        _cache.publish_tree(str(staged), str(final))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Package(final, key, False, seconds, lowered_ops, mil.op_count())


def _trusted_package(path: Path) -> bool:
    """A saved package we may load: a real directory whose every entry is ours alone (not
    group/other-writable, no symlink anywhere in it)."""
    return _cache.trusted_tree(str(path))


def _discard(path: Path) -> None:
    """Remove an untrusted entry at ``path`` without following any link in it."""
    folder = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        st = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path.name, dir_fd=folder)
        else:
            os.unlink(path.name, dir_fd=folder)
    except FileNotFoundError:
        pass
    except (OSError, NotImplementedError):
        # Not removable safely here: leave it (never loaded); publishing over it then fails.
        pass
    finally:
        os.close(folder)


def dump_mil(mil: MilProgram, name: str, debug_dir: str | None) -> Path | None:
    """Write the MIL text to ``debug_dir`` (or ``$SHAPEGRAD_DEBUG``); returns the file or None."""
    folder = debug_dir or os.environ.get(DEBUG_ENV, "").strip() or None
    if folder is None:
        return None
    os.makedirs(folder, exist_ok=True)
    path = Path(folder) / f"{name}.mil.txt"
    header = f"# {name}: {mil.op_count()} MIL ops, precision {mil.precision}\n"
    header += "".join(f"# {prim}: {kind}\n" for prim, kind in mil.lowering.items())
    text = (header + mil.text() + "\n").encode("utf-8")
    _cache.atomic_write(str(path), text, 0o644, durable=False)  # a debug dump: readable
    return path
