"""Checkpoints: parameters, optimizer state, step and extra training state in one ``.npz``.

Every array is stored under a readable name built from the ParamList names
(``params/w1``, ``optimizer/m/w1``, ``optimizer/step``, ``extra/scale``),
next to a JSON ``__metadata__`` entry (format version, step, and the name,
shape and dtype of every parameter). Loading never unpickles anything.

Writes are atomic (``_cache.atomic_write``): the file is written to a temporary
name in the same folder, flushed to disk, then moved over the target; a crash
mid-save leaves the previous checkpoint untouched, and its temp file is removed
by the next save or load of that checkpoint. Only regular files are written or
read: a path naming a device, a FIFO or a directory is refused before it is
touched (a save would replace the node, a load could read without end or block).
Loading opens the file once, validates names, shapes and dtypes against the
parameters you pass (and, through the ParamList, against its annotation) before
inflating anything, reads no more than the sizes declared, and raises
:class:`CheckpointError` saying what differs or what is damaged.

Example:
    >>> sg.save_checkpoint("run.npz", params, opt_state, step=50)
    >>> ckpt = sg.load_checkpoint("run.npz", params, opt_state)
    >>> ckpt.step, ckpt.params
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.lib.format as npformat
import numpy.typing as npt

from shapegrad import _cache, tree
from shapegrad.dtypes import bfloat16
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor

FORMAT = "shapegrad-checkpoint"
VERSION = 1
_META_KEY = "__metadata__"

PathLike = str | os.PathLike[str]
Arrays = dict[str, npt.NDArray[Any]]


class CheckpointError(ValueError):
    """A checkpoint is unreadable, or does not match the parameters / state it is loaded into."""


@dataclass
class Checkpoint:
    """The contents of a loaded checkpoint.

    Attributes:
        params: parameters in the structure (and ParamList type/flags) of ``params_like``.
        optimizer_state: the optimizer state (structure of ``optimizer_state_like``) or None.
        step: the step stored at save time.
        extra: extra state (structure of ``extra_like``) or None.
        metadata: the JSON metadata, including anything passed as ``metadata`` at save time.
    """

    params: Any
    optimizer_state: Any
    step: int
    extra: Any
    metadata: dict[str, Any] = field(default_factory=dict)


# --- naming -----------------------------------------------------------------------------


def param_names(params: Any) -> list[str]:
    """One name per parameter leaf: ParamList names, module fields, dict keys, or positions."""
    # Nested names: ParamList names and module fields at any depth (blocks.0.w_qkv).
    return tree.leaf_paths(params)


def _named(section: str, value: Any, names: list[str]) -> dict[str, Any]:
    """``{section/name: leaf}`` for a params-shaped tree, a tensor, or a dict of those."""
    if value is None:
        return {}
    if isinstance(value, Tensor | np.ndarray):
        return {section: value}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():  # each entry named by its own leaves' paths
            out.update(_named(f"{section}/{key}", sub, param_names(sub)))
        return out
    leaves, _ = tree.flatten(value)
    if len(leaves) != len(names):
        names = param_names(value)
    return {f"{section}/{n}": leaf for n, leaf in zip(names, leaves, strict=True)}


def _to_array(value: Any) -> npt.NDArray[Any]:
    return value.numpy() if isinstance(value, Tensor) else np.asarray(value)


# bfloat16 has no .npy type code: its arrays are stored as their uint16 bits (shapegrad has
# no uint16 dtype, so a uint16 entry can only be bfloat16) and viewed back when loaded.
_BF16_BITS = np.dtype(np.uint16)


def _stored(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return array.view(_BF16_BITS) if array.dtype == bfloat16.numpy else array


# --- saving ----------------------------------------------------------------------------


def save_checkpoint(
    path: PathLike,
    params: Any,
    optimizer_state: Any = None,
    *,
    step: int = 0,
    extra: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Atomically write a checkpoint.

    Args:
        path: target file (``.npz`` recommended; the name is used as given).
        params: a ParamList (names are taken from it), TList, list or dict of tensors.
        optimizer_state: e.g. ``opt.init(params)`` / ``trainer.optimizer_state()``.
        step: the training step (and schedule position) to record.
        extra: more state (dict of tensors), e.g. the loss-scale state.
        metadata: JSON-serialisable notes stored with the checkpoint.
    Returns:
        The path written.
    """
    names = param_names(params)
    leaves, _ = tree.flatten(params)
    arrays: Arrays = {
        k: _stored(_to_array(v))
        for k, v in {
            **_named("params", params, names),
            **_named("optimizer", optimizer_state, names),
            **_named("extra", extra, names),
        }.items()
    }
    info = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "params": [
            {"name": n, "shape": list(_to_array(x).shape), "dtype": str(_to_array(x).dtype)}
            for n, x in zip(names, leaves, strict=True)
        ],
        "user": dict(metadata or {}),
    }
    try:
        arrays[_META_KEY] = np.array(json.dumps(info))
    except (TypeError, ValueError) as exc:  # not JSON: an object, a circular reference
        raise CheckpointError(
            f"save_checkpoint: metadata must be JSON-serialisable (str, int, float, bool, "
            f"None, lists and dicts with str keys): {exc}"
        ) from exc
    target = Path(path)
    _refuse_special(target, "save_checkpoint: cannot write to")
    _atomic_write(target, arrays)
    return target


def _refuse_special(target: Path, what: str) -> None:
    """Raise when ``target`` exists and is not a regular file (or a link to one)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CheckpointError(f"{what} {target}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{what} {target}: it is {_kind(mode)}, not a regular file")


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _write_npz(handle: IO[bytes], arrays: Arrays) -> None:
    """Serialise ``arrays`` into ``handle`` (a separate function so tests can inject a crash)."""
    np.savez(handle, **arrays)  # type: ignore[arg-type]


def _atomic_write(target: Path, arrays: Arrays) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    # The temp name carries our pid, so a later save or load knows when it is stale.
    _cache.atomic_write(
        str(target),
        lambda handle: _write_npz(handle, arrays),
        0o600,
        prefix=f"{_temp_prefix(target)}{os.getpid()}.",
        suffix=".tmp",
    )


# --- loading ---------------------------------------------------------------------------

# An .npy header is a few hundred bytes; NumPy refuses headers over 10 000 by default.
_HEADER_ALLOWANCE = 1 << 16
_METADATA_LIMIT = 16 << 20  # the JSON metadata (user notes included)
_SECTIONS = ("params", "optimizer", "extra")
# What a damaged file makes the zip reader raise: besides the usual, an unknown compression
# method or zip version (NotImplementedError), the encryption flag (RuntimeError
# "encrypted"), bad extra fields (struct.error). .npy headers: _HEADER_ERRORS.
_READ_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    RuntimeError,  # NotImplementedError and RecursionError included
    struct.error,
    OverflowError,
)


def load_checkpoint(
    path: PathLike,
    params_like: Any,
    optimizer_state_like: Any = None,
    extra_like: Any = None,
) -> Checkpoint:
    """Read a checkpoint and validate it against the given structures.

    Nothing is decompressed before it is known to be expected: member names are checked
    against the structures passed, and every member's declared size and ``.npy`` header
    (shape, dtype) against the expected array before its data is read.

    Args:
        path: a file written by :func:`save_checkpoint`.
        params_like: parameters with the expected names/shapes/dtypes (e.g. the ParamList
            being trained); the loaded params come back in its structure.
        optimizer_state_like: expected optimizer state structure, or None to skip it.
        extra_like: expected extra state structure, or None to skip it.
    Returns:
        A :class:`Checkpoint`.
    Raises:
        CheckpointError: unreadable/corrupted/malformed file, or a name, shape or dtype
            mismatch (the message names the entry, the expected and the stored value).
    """
    source = Path(path)
    handle = _open_regular(source)
    remove_stale_temps(source)
    try:
        with handle, zipfile.ZipFile(_directory_checked(source, handle)) as archive:
            members = _members(source, archive)
            info = _metadata(source, archive, members)
            names = param_names(params_like)
            stored = [entry["name"] for entry in info["params"]]
            if stored != names:
                missing = [n for n in names if n not in stored]
                unexpected = [n for n in stored if n not in names]
                raise CheckpointError(
                    f"{source}: parameter names do not match: checkpoint has {stored}, "
                    f"expected {names} (missing {missing}, unexpected {unexpected})"
                )
            _check_declared(source, info["params"], params_like, names)
            reader = _Reader(source, archive, members)
            params = reader.restore("params", params_like, names)
            opt = reader.restore("optimizer", optimizer_state_like, names)
            extra = reader.restore("extra", extra_like, names)
    except CheckpointError:
        raise
    except _READ_ERRORS as exc:
        raise _unreadable(source, exc) from exc
    return Checkpoint(params, opt, info["step"], extra, info)


def _open_regular(source: Path) -> IO[bytes]:
    """``source`` opened for reading, once, when it is a regular file: a device or a FIFO
    is refused before anything is read (opening does not block on a FIFO)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(source, flags)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {source} does not exist") from None
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint {source} cannot be opened: {exc.strerror or exc}"
        ) from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                f"checkpoint {source} is {_kind(mode)}, not a regular file; not read"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_DIRECTORY_LIMIT = 64 << 20  # the zip's table of contents: ~100 bytes per array
_END = struct.Struct("<4s4H2LH")  # end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


def _directory_checked(source: Path, handle: IO[bytes]) -> IO[bytes]:
    """``handle`` (rewound) once the size its zip end record declares for the table of
    contents is sane: the zip reader reads that many bytes at once."""
    size = handle.seek(0, os.SEEK_END)
    tail_start = max(0, size - (_END.size + 0xFFFF + _END64_LOCATOR.size))
    handle.seek(tail_start)
    tail = handle.read()
    at = tail.rfind(b"PK\x05\x06")
    declared = 0
    if at >= 0 and at + _END.size <= len(tail):
        declared = _END.unpack_from(tail, at)[5]
        locator = at - _END64_LOCATOR.size
        if declared == 0xFFFFFFFF and locator >= 0:  # zip64: the size is in its own record
            sig, _disk, offset, _disks = _END64_LOCATOR.unpack_from(tail, locator)
            if sig == b"PK\x06\x07" and offset + _END64.size <= size:
                handle.seek(offset)
                record = handle.read(_END64.size)
                if record[:4] == b"PK\x06\x06":
                    declared = _END64.unpack(record)[8]
    if declared > _DIRECTORY_LIMIT:
        raise CheckpointError(
            f"{source}: its zip directory declares {declared} bytes (more than "
            f"{_DIRECTORY_LIMIT}); not a shapegrad checkpoint, or damaged"
        )
    handle.seek(0)
    return handle


def _check_declared(
    source: Path, entries: list[dict[str, Any]], params_like: Any, names: list[str]
) -> None:
    """The metadata's shape and dtype of every parameter must be the expected ones."""
    leaves, _ = tree.flatten(params_like)
    for entry, name, leaf in zip(entries, names, leaves, strict=True):
        want = _to_array(leaf)
        if entry["shape"] != list(want.shape) or entry["dtype"] != str(want.dtype):
            raise CheckpointError(
                f"{source}: 'params/{name}' is {entry['dtype']}{entry['shape']} in the "
                f"checkpoint (metadata) but {want.dtype}{list(want.shape)} is expected"
            )


def _unreadable(source: Path, exc: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{source} is not a readable shapegrad checkpoint (corrupted or truncated?): "
        f"{type(exc).__name__}: {exc}"
    )


def _members(source: Path, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """``{entry name: zip member}``; only ``__metadata__`` and ``params/ optimizer/ extra/``
    entries, each stored once as ``.npy``, are allowed."""
    members: dict[str, zipfile.ZipInfo] = {}
    for member in archive.infolist():
        key = member.filename.removesuffix(".npy")
        allowed = key == _META_KEY or (
            key.split("/", 1)[0] in _SECTIONS and member.filename.endswith(".npy")
        )
        if not allowed or key in members or member.is_dir():
            raise CheckpointError(
                f"{source} is not a shapegrad checkpoint: unexpected member {member.filename!r}"
            )
        members[key] = member
    if _META_KEY not in members:
        raise CheckpointError(f"{source} is not a shapegrad checkpoint (no '{FORMAT}' metadata)")
    return members


def _metadata(
    source: Path, archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo]
) -> dict[str, Any]:
    """The JSON metadata, with the type of every field the loader relies on checked."""
    raw = _read_npy(source, archive, members[_META_KEY], _META_KEY, None, None, _METADATA_LIMIT)
    if raw.dtype.kind != "U" or raw.shape != ():
        raise CheckpointError(f"{source}: malformed metadata (a {raw.dtype} array)")
    try:
        info = json.loads(str(raw))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{source}: malformed metadata: {exc}") from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(f"{source} is not a shapegrad checkpoint (no '{FORMAT}' metadata)")
    version: Any = info.get("version")
    step: Any = info.get("step", 0)
    params: Any = info.get("params")
    if not _is_int(version):
        raise CheckpointError(f"{source}: malformed metadata: version {version!r} is not an int")
    if version > VERSION:
        raise CheckpointError(
            f"{source} has checkpoint format version {version}, newer than this "
            f"shapegrad ({VERSION}); upgrade shapegrad"
        )
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"{source}: malformed metadata: step {step!r} is not an int >= 0")
    if not isinstance(params, list) or not all(_is_param_entry(p) for p in params):
        raise CheckpointError(
            f"{source}: malformed metadata: 'params' must be a list of "
            '{"name": str, "shape": [int >= 0, ...], "dtype": str} entries'
        )
    return info


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_param_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return False
    shape, dtype = entry.get("shape"), entry.get("dtype")
    shape_ok = isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)
    return shape_ok and isinstance(dtype, str)


def _read_npy(
    source: Path,
    archive: zipfile.ZipFile,
    member: zipfile.ZipInfo,
    key: str,
    shape: tuple[int, ...] | None,
    dtype: np.dtype[Any] | None,
    limit: int,
) -> npt.NDArray[Any]:
    """One ``.npy`` member, checked against (shape, dtype) before its data is inflated.

    The declared (uncompressed) size bounds what the zip reader inflates, so it is
    checked first; then the header; then exactly the bytes the header promises are read.
    """
    if member.file_size > limit + _HEADER_ALLOWANCE:
        raise CheckpointError(
            f"{source}: entry {key!r} declares {member.file_size} bytes, more than the "
            f"{limit + _HEADER_ALLOWANCE} an array of its expected shape and dtype needs"
        )
    with archive.open(member) as handle:
        got_shape, fortran, got_dtype = _npy_header(source, key, handle)
        if got_dtype.hasobject:
            raise CheckpointError(f"{source}: entry {key!r} holds Python objects; not loaded")
        if shape is not None and dtype is not None and (got_shape, got_dtype) != (shape, dtype):
            raise CheckpointError(
                f"{source}: {key!r} is {got_dtype}{list(got_shape)} in the checkpoint but "
                f"{dtype}{list(shape)} is expected"
            )
        nbytes = math.prod(got_shape) * got_dtype.itemsize  # exact: never wraps around
        if nbytes > limit:
            raise CheckpointError(f"{source}: entry {key!r} declares {nbytes} bytes of data")
        data = handle.read(nbytes)
    if len(data) != nbytes:
        raise CheckpointError(f"{source}: entry {key!r} is truncated (corrupted file?)")
    flat = np.frombuffer(data, dtype=got_dtype)
    return flat.reshape(got_shape, order="F" if fortran else "C").copy()


# A damaged .npy header (a Python literal NumPy evaluates) can fail in any of these.
_HEADER_ERRORS = (ValueError, TypeError, SyntaxError, tokenize.TokenError, RecursionError)


def _npy_header(source: Path, key: str, handle: IO[bytes]) -> tuple[Any, bool, np.dtype[Any]]:
    """(shape, fortran order, dtype) from the ``.npy`` header at ``handle``'s position."""
    version = npformat.read_magic(handle)
    if version not in ((1, 0), (2, 0)):
        raise CheckpointError(f"{source}: entry {key!r} has unsupported .npy version {version}")
    try:
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(handle)
        else:
            shape, fortran, dtype = npformat.read_array_header_2_0(handle)
    except _HEADER_ERRORS as exc:
        raise CheckpointError(
            f"{source}: entry {key!r} has a damaged .npy header: {type(exc).__name__}: {exc}"
        ) from exc
    return shape, bool(fortran), dtype


@dataclass
class _Reader:
    """Reads the members of one section, validated against the structure passed."""

    source: Path
    archive: zipfile.ZipFile
    members: dict[str, zipfile.ZipInfo]

    def restore(self, section: str, like: Any, names: list[str]) -> Any:
        """``like`` with every leaf replaced by the stored array of the same name."""
        if like is None:
            return None
        expected = _named(section, like, names)
        present = sorted(k for k in self.members if k == section or k.startswith(section + "/"))
        missing = [k for k in expected if k not in self.members]
        unexpected = [k for k in present if k not in expected]
        if missing or unexpected:
            raise CheckpointError(
                f"{self.source}: {section} entries do not match: missing {missing}, unexpected "
                f"{unexpected} (was it saved with a different model or optimizer?)"
            )
        loaded: dict[str, Tensor] = {}
        for key, ref in expected.items():
            want = _to_array(ref)
            got = _read_npy(
                self.source,
                self.archive,
                self.members[key],
                key,
                want.shape,
                _stored(want).dtype,
                want.nbytes,
            )
            value = got.view(want.dtype) if got.dtype != want.dtype else got
            # a tensor leaf's dtype comes back as saved (an int64 array alone would be int32)
            loaded[key] = tensor(value, dtype=ref.dtype if isinstance(ref, Tensor) else None)
        return _rebuild(like, section, names, loaded)


def _rebuild(like: Any, section: str, names: list[str], loaded: dict[str, Tensor]) -> Any:
    if isinstance(like, Tensor | np.ndarray):
        return loaded[section]
    if isinstance(like, Mapping):
        return {k: _rebuild(v, f"{section}/{k}", param_names(v), loaded) for k, v in like.items()}
    leaves, treedef = tree.flatten(like)
    keys = list(_named(section, like, names))
    return tree.unflatten(treedef, [loaded[k] for k in keys[: len(leaves)]])


# --- temp files of killed saves --------------------------------------------------------


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def remove_stale_temps(target: Path) -> int:
    """Remove temp files that saves of ``target`` killed mid-write left behind.

    A temp name carries its writer's pid (``.<name>.<pid>.<random>.tmp``): it is stale
    when that process is gone, or (names without a pid, pids reused) when it is over
    an hour old (``_cache.remove_stale_temps``, which never follows a link). Returns how
    many were removed.
    """
    prefix = _temp_prefix(target)

    def is_temp(name: str) -> bool:
        return name.startswith(prefix) and name.endswith(".tmp")

    def pid_of(name: str) -> int | None:
        text = name[len(prefix) :].split(".", 1)[0]
        return int(text) if text.isdigit() else None

    # The folder is the user's choice and may be a link; its entries are never followed.
    return _cache.remove_stale_temps(str(target.parent), is_temp, pid_of, folder_may_be_link=True)


__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "param_names", "save_checkpoint"]
