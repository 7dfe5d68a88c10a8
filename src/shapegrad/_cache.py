"""The on-disk cache's trust rules, shared by the C and ANE backends.

Nothing found in a cache is loaded unless it is the user's own: a shared library
in the cache runs its constructors in this process the moment it is ``dlopen``-ed,
so a directory or file another user can write to is never used.

* :func:`cache_home` is ``$SHAPEGRAD_CACHE_DIR`` when set, else
  ``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``): every backend's cache.
* :func:`private_dir` returns a directory that is ours alone (owned by this uid,
  not writable by group or others), creating it with mode 0700. A directory that
  fails those checks, is not a directory or is not writable is bypassed with a
  :class:`CacheWarning` that names the path and the fix, and a private temporary
  directory (removed at exit) serves this process instead.
* :func:`trusted_file` says whether one cache entry may be read.
* :func:`write_private` writes a file atomically (temp file + rename) with mode
  0600/0700 whatever the umask, and removes its temp file on any failure.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable

# The uid whose files we trust. A module attribute so tests can pretend to be another user
# (the test machine runs as root, which owns everything it creates).
current_uid: Callable[[], int] = getattr(os, "getuid", lambda: -1)

STALE_SECONDS = 3600.0  # a temp file older than this belongs to a killed writer
_fallback: str | None = None


class CacheWarning(UserWarning):
    """A cache directory could not be used; a private temporary one is used instead."""


class CacheError(RuntimeError):
    """No usable cache directory (not even a private temporary one)."""


CACHE_ENV = "SHAPEGRAD_CACHE_DIR"


def cache_home() -> str:
    """The cache of every backend: ``$SHAPEGRAD_CACHE_DIR`` when set (non-empty), else
    ``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``)."""
    explicit = os.environ.get(CACHE_ENV, "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shapegrad")


def untrusted_reason(st: os.stat_result) -> str | None:
    """Why an entry with this ``stat`` must not be trusted, or None when it is ours alone."""
    uid = current_uid()
    if uid >= 0 and st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trusted_file(path: str) -> bool:
    """True when ``path`` is a regular file (not a symlink) that is ours alone."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and untrusted_reason(st) is None


def _make_dirs(path: str) -> None:
    """``mkdir -p`` with mode 0700 for every directory created (XDG asks 0700 for the base)."""
    missing: list[str] = []
    head = os.path.abspath(path)
    while not os.path.lexists(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)


def _problem(path: str) -> str | None:
    """Why ``path`` cannot serve as a private cache directory (None: it can)."""
    try:
        _make_dirs(path)
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be created ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    reason = untrusted_reason(st)
    if reason is not None:
        return reason
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def _fix_hint(path: str, problem: str) -> str:
    if "not a directory" in problem:
        return f"remove or rename the file {path!r}"
    if "owned by" in problem:
        return f"remove {path!r} (it belongs to another user) or set $XDG_CACHE_HOME"
    if "writable by group" in problem:
        return f"run `chmod 700 {path}` after checking its contents are yours"
    return f"make {path!r} writable or set $XDG_CACHE_HOME to a directory you own"


def fallback_dir() -> str:
    """This process's private temporary cache (mode 0700, removed at exit)."""
    global _fallback
    if _fallback is None or not os.path.isdir(_fallback):
        try:
            _fallback = tempfile.mkdtemp(prefix="shapegrad-cache-")
        except OSError as exc:
            raise CacheError(
                f"shapegrad cache: no usable cache directory, and no private temporary one "
                f"could be created in {tempfile.gettempdir()!r} ({exc.strerror or exc}); "
                "set $XDG_CACHE_HOME (or $TMPDIR) to a writable directory you own"
            ) from exc
        atexit.register(shutil.rmtree, _fallback, True)
    return _fallback


def bypass(path: str, problem: str) -> str:
    """Warn that ``path`` is unusable (naming the fix) and return the private fallback."""
    fallback = fallback_dir()
    warnings.warn(
        f"shapegrad cache: not using {path!r}: {problem}; to fix: {_fix_hint(path, problem)}. "
        f"Using a private temporary cache for this process instead ({fallback}).",
        CacheWarning,
        stacklevel=3,
    )
    return fallback


def private_dir(path: str) -> str:
    """``path`` when it is (or could be made) a directory that is ours alone, else the fallback.

    Example:
        >>> folder = private_dir(os.path.join(cache_home(), "c"))  # doctest: +SKIP
    """
    problem = _problem(path)
    return path if problem is None else bypass(path, problem)


def write_private(path: str, data: bytes, mode: int = 0o600) -> None:
    """Atomically write ``data`` to ``path`` (temp file in the same directory + rename).

    The file gets exactly ``mode`` whatever the umask; on any failure the temp file is
    removed and the error propagates.
    """
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def secure_tree(path: str) -> None:
    """Remove group/other write bits below ``path`` (tools may honour a lax umask)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(full, stat.S_IMODE(st.st_mode) & ~0o022)
    os.chmod(path, 0o700)


def remove_stale_temps(folder: str, is_temp: Callable[[str], bool]) -> int:
    """Delete temp files in ``folder`` (``is_temp(name)``) left by writers killed over
    :data:`STALE_SECONDS` ago; returns how many were removed. Younger ones may belong
    to a writer that is still running, so they are left alone."""
    removed = 0
    cutoff = time.time() - STALE_SECONDS
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        try:
            if is_temp(entry.name) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
