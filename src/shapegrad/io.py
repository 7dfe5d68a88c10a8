"""Checkpoints: parameters, optimizer state, step and extra training state in one ``.npz``.

Every array is stored under a readable name built from the ParamList names
(``params/w1``, ``optimizer/m/w1``, ``optimizer/step``, ``extra/scale``),
next to a JSON ``__metadata__`` entry (format version, step, and the name,
shape and dtype of every parameter). Loading never unpickles anything.

Writes are atomic: the file is written to a temporary name in the same
folder, flushed to disk, then moved over the target with ``os.replace``; a
crash mid-save leaves the previous checkpoint untouched. Loading validates
names, shapes and dtypes against the parameters you pass (and, through the
ParamList, against its annotation) and raises :class:`CheckpointError`
saying what differs.

Example:
    >>> sg.save_checkpoint("run.npz", params, opt_state, step=50)
    >>> ckpt = sg.load_checkpoint("run.npz", params, opt_state)
    >>> ckpt.step, ckpt.params
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from shapegrad import tree
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
        k: _to_array(v)
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
    arrays[_META_KEY] = np.array(json.dumps(info))
    target = Path(path)
    _atomic_write(target, arrays)
    return target


def _write_npz(handle: IO[bytes], arrays: Arrays) -> None:
    """Serialise ``arrays`` into ``handle`` (a separate function so tests can inject a crash)."""
    np.savez(handle, **arrays)  # type: ignore[arg-type]


def _atomic_write(target: Path, arrays: Arrays) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            _write_npz(handle, arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        # Never leave a half-written temp file behind; the old checkpoint is untouched.
        Path(tmp_name).unlink(missing_ok=True)
        raise


# --- loading ---------------------------------------------------------------------------


def load_checkpoint(
    path: PathLike,
    params_like: Any,
    optimizer_state_like: Any = None,
    extra_like: Any = None,
) -> Checkpoint:
    """Read a checkpoint and validate it against the given structures.

    Args:
        path: a file written by :func:`save_checkpoint`.
        params_like: parameters with the expected names/shapes/dtypes (e.g. the ParamList
            being trained); the loaded params come back in its structure.
        optimizer_state_like: expected optimizer state structure, or None to skip it.
        extra_like: expected extra state structure, or None to skip it.
    Returns:
        A :class:`Checkpoint`.
    Raises:
        CheckpointError: unreadable/corrupted file, or a name, shape or dtype mismatch
            (the message names the entry, the expected and the stored value).
    """
    source = Path(path)
    arrays, info = _read(source)
    names = param_names(params_like)
    stored = [entry["name"] for entry in info.get("params", [])]
    if stored != names:
        missing = [n for n in names if n not in stored]
        unexpected = [n for n in stored if n not in names]
        raise CheckpointError(
            f"{source}: parameter names do not match: checkpoint has {stored}, expected {names}"
            f" (missing {missing}, unexpected {unexpected})"
        )
    params = _restore(source, "params", params_like, arrays, names)
    opt = _restore(source, "optimizer", optimizer_state_like, arrays, names)
    extra = _restore(source, "extra", extra_like, arrays, names)
    return Checkpoint(params, opt, int(info.get("step", 0)), extra, info)


def _read(source: Path) -> tuple[Arrays, dict[str, Any]]:
    if not source.exists():
        raise CheckpointError(f"checkpoint {source} does not exist")
    try:
        with np.load(source, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        info = json.loads(str(arrays.pop(_META_KEY)))
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        zipfile.BadZipFile,
        json.JSONDecodeError,
    ) as exc:
        raise CheckpointError(
            f"{source} is not a readable shapegrad checkpoint (corrupted or truncated?): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(f"{source} is not a shapegrad checkpoint (no '{FORMAT}' metadata)")
    if int(info.get("version", -1)) > VERSION:
        raise CheckpointError(
            f"{source} has checkpoint format version {info.get('version')}, newer than this "
            f"shapegrad ({VERSION}); upgrade shapegrad"
        )
    return arrays, info


def _restore(source: Path, section: str, like: Any, arrays: Arrays, names: list[str]) -> Any:
    """``like`` with every leaf replaced by the stored array of the same name (validated)."""
    if like is None:
        return None
    expected = _named(section, like, names)
    present = sorted(k for k in arrays if k == section or k.startswith(section + "/"))
    missing = [k for k in expected if k not in arrays]
    unexpected = [k for k in present if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: {section} entries do not match: missing {missing}, unexpected "
            f"{unexpected} (was it saved with a different model or optimizer?)"
        )
    loaded: dict[str, Tensor] = {}
    for key, ref in expected.items():
        want = _to_array(ref)
        got = arrays[key]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise CheckpointError(
                f"{source}: {key!r} is {got.dtype}{list(got.shape)} in the checkpoint but "
                f"{want.dtype}{list(want.shape)} is expected"
            )
        loaded[key] = tensor(got)
    return _rebuild(like, section, names, loaded)


def _rebuild(like: Any, section: str, names: list[str], loaded: dict[str, Tensor]) -> Any:
    if isinstance(like, Tensor | np.ndarray):
        return loaded[section]
    if isinstance(like, Mapping):
        return {k: _rebuild(v, f"{section}/{k}", param_names(v), loaded) for k, v in like.items()}
    leaves, treedef = tree.flatten(like)
    keys = list(_named(section, like, names))
    return tree.unflatten(treedef, [loaded[k] for k in keys[: len(leaves)]])


__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "param_names", "save_checkpoint"]
