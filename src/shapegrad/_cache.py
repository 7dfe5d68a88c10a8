"""The on-disk cache's trust rules, shared by the C and ANE backends.

Nothing found in a cache is loaded unless it is the user's own: a shared library
in the cache runs its constructors in this process the moment it is ``dlopen``-ed,
so a directory or file another user can write to is never used.

* :func:`cache_home` is ``$SHAPEGRAD_CACHE_DIR`` when set, else
  ``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``): every backend's cache.
* :func:`private_dir` returns a directory that is ours alone (owned by this uid,
  not writable by group or others, and no ancestor directory another user could
  rename it in: every ancestor is owned by root or by us and is not writable by group
  or others unless it is sticky, like ``/tmp``), creating it with mode 0700. A
  directory that fails those checks, is not a directory or is not writable is
  bypassed with a :class:`CacheWarning` that names the path and the fix, and a
  private temporary directory (removed at exit) serves this process instead.
  :func:`readable_dir` accepts a trusted directory that cannot be written (a warm
  cache on a read-only disk is used as it is; new entries go to the fallback).
* :func:`read_trusted` opens one cache entry once (never following a link, never
  blocking on a FIFO), checks the opened descriptor and returns its bytes and identity;
  :func:`trusted_file` says whether an entry may be read.
* :func:`atomic_write` / :func:`publish`: the one way anything is written: a temp file
  in the same directory, flushed to disk, chmod-ed to its mode whatever the umask,
  renamed over the target, and (``checksum=True``) its SHA-256 written last, so a
  reader that sees the new checksum sees the new file. The temp file is removed on
  any failure.
* :func:`remove_stale_temps` deletes temp files of killed writers through a descriptor
  of the directory (``unlinkat``): a directory swapped for a symlink after it was
  opened, or an entry swapped for one, never redirects the deletion.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

# The uid whose files we trust. A module attribute so tests can pretend to be another user
# (the test machine runs as root, which owns everything it creates).
current_uid: Callable[[], int] = getattr(os, "getuid", lambda: -1)

STALE_SECONDS = 3600.0  # a temp file older than this belongs to a killed writer
_fallback: str | None = None
# Cache directories this process gave up writing to (warned once): new entries go to the
# fallback from then on; entries already there are still read (:func:`search_dirs`).
_bypassed: set[str] = set()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


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


def _ancestor_reason(folder: str, st: os.stat_result) -> str | None:
    """Why another user could rename entries of the ancestor ``folder`` (None: nobody can).

    Whoever may write a directory may rename what is in it, so a cache below a directory
    that others can write could be swapped for theirs between our check and our load:
    unless the directory is sticky (``/tmp``), where only an entry's owner may rename it.
    """
    uid = current_uid()
    if uid >= 0 and st.st_uid not in (0, uid):
        return f"its ancestor {folder!r} is owned by uid {st.st_uid} (neither root nor you)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (
            f"its ancestor {folder!r} is writable by group or others and not sticky "
            f"(mode {stat.S_IMODE(st.st_mode):o}), so another user could swap the cache"
        )
    return None


def _prefixes(path: str) -> list[str]:
    """Every directory above ``path`` (absolute), root first."""
    out: list[str] = []
    head = os.path.dirname(path)
    while True:
        out.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    return out[::-1]


def untrusted_ancestor(path: str) -> str | None:
    """Why an ancestor of ``path`` lets another user swap it (None: none does).

    Both the path as written and the path its links resolve to are checked: a symlink's
    target is only as safe as the directories above the target.
    """
    absolute = os.path.abspath(path)
    seen: set[str] = set()
    for chain in (_prefixes(absolute), _prefixes(os.path.realpath(absolute))):
        for folder in chain:
            if folder in seen:
                continue
            seen.add(folder)
            try:
                st = os.stat(folder)
            except OSError as exc:
                return f"its ancestor {folder!r} cannot be examined ({exc.strerror or exc})"
            reason = _ancestor_reason(folder, st)
            if reason is not None:
                return reason
    return None


@dataclass(frozen=True)
class TrustedFile:
    """The bytes of a cache entry read through one descriptor, and that file's identity."""

    data: bytes
    device: int
    inode: int


def read_trusted(
    path: str, limit: int | None = None, identity: tuple[int, int] | None = None
) -> TrustedFile | None:
    """The contents of ``path`` when it is a regular file that is ours alone (or, given
    ``identity``, exactly that file: the (device, inode) :func:`publish` returned), else None.

    The file is opened once (not following a final symlink, not blocking on a FIFO) and
    the checks are made on the open descriptor, so the bytes returned are the checked
    file's, whatever happens to the name meanwhile. At most its size at open (and at most
    ``limit``) bytes are read.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if identity is not None:
            trusted = (st.st_dev, st.st_ino) == identity
        else:
            trusted = untrusted_reason(st) is None
        if not stat.S_ISREG(st.st_mode) or not trusted:
            return None
        if limit is not None and st.st_size > limit:
            return None
        chunks: list[bytes] = []
        left = st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return TrustedFile(b"".join(chunks), st.st_dev, st.st_ino)
    except OSError:
        return None
    finally:
        os.close(fd)


def trusted_file(path: str) -> bool:
    """True when ``path`` is a regular file (not a symlink) that is ours alone."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and untrusted_reason(st) is None


def trusted_tree(path: str) -> bool:
    """True when ``path`` is a directory whose every entry (recursively) is a regular file
    or directory that is ours alone, with no symlink anywhere (a saved package)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or untrusted_reason(st) is not None:
        return False
    try:
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                entry = os.lstat(os.path.join(root, name))
                if not (stat.S_ISDIR(entry.st_mode) or stat.S_ISREG(entry.st_mode)):
                    return False
                if untrusted_reason(entry) is not None:
                    return False
    except OSError:
        return False
    return True


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


def _trust_problem(path: str) -> str | None:
    """Why the existing ``path`` cannot be trusted as a cache directory (None: it can)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    reason = untrusted_reason(st)
    return reason if reason is not None else untrusted_ancestor(path)


def _problem(path: str) -> str | None:
    """Why ``path`` cannot serve as a private cache directory (None: it can)."""
    try:
        _make_dirs(path)
    except OSError as exc:
        return f"it cannot be created ({exc.strerror or exc})"
    reason = _trust_problem(path)
    if reason is not None:
        return reason
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def _fix_hint(path: str, problem: str) -> str:
    if "not a directory" in problem:
        return f"remove or rename the file {path!r}"
    if "ancestor" in problem:
        return "set $XDG_CACHE_HOME to a directory no other user can rename (e.g. in your home)"
    if "owned by" in problem:
        return f"remove {path!r} (it belongs to another user) or set $XDG_CACHE_HOME"
    if "writable by group" in problem:
        return f"run `chmod 700 {path}` after checking its contents are yours"
    return f"make {path!r} writable or set $XDG_CACHE_HOME to a directory you own"


def fallback_dir() -> str:
    """This process's private temporary cache (mode 0700, removed at exit)."""
    global _fallback
    if _fallback is None or not os.path.isdir(_fallback):
        parent = tempfile.gettempdir()
        problem = untrusted_ancestor(os.path.join(parent, "x"))
        try:
            if problem is not None:
                raise OSError(errno.EPERM, problem)
            _fallback = tempfile.mkdtemp(prefix="shapegrad-cache-")
        except OSError as exc:
            raise CacheError(
                f"shapegrad cache: no usable cache directory, and no private temporary one "
                f"could be created in {parent!r} ({exc.strerror or exc}); "
                "set $XDG_CACHE_HOME (or $TMPDIR) to a writable directory you own"
            ) from exc
        atexit.register(shutil.rmtree, _fallback, True)
    return _fallback


def active_fallback() -> str | None:
    """The private temporary cache when this process made one, else None."""
    return _fallback if _fallback is not None and os.path.isdir(_fallback) else None


def bypass(path: str, problem: str) -> str:
    """Warn that ``path`` is unusable (naming the fix) and return the private fallback,
    which serves this process's writes for ``path`` from now on."""
    fallback = fallback_dir()
    _bypassed.add(path)
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
    if path in _bypassed:
        return fallback_dir()
    problem = _problem(path)
    return path if problem is None else bypass(path, problem)


def readable_dir(path: str) -> str | None:
    """``path`` when it is an existing directory we may read entries from (ours alone,
    every ancestor safe), writable or not; None otherwise (no warning: nothing is lost)."""
    return path if os.path.isdir(path) and _trust_problem(path) is None else None


def search_dirs(path: str) -> list[str]:
    """Where cached entries of ``path`` may be found: ``path`` itself when it is readable,
    then this process's private fallback (where entries go when ``path`` cannot be
    written)."""
    found = [d for d in (readable_dir(path), active_fallback()) if d is not None]
    return list(dict.fromkeys(found))


def out_of_space(folder: str, output: str = "") -> bool:
    """Whether a failed write to ``folder`` is a full disk (or quota): the tool's
    ``output`` says so, or the file system has (almost) no room left."""
    if any(os.strerror(code) in output for code in (errno.ENOSPC, errno.EDQUOT)):
        return True
    try:
        vfs = os.statvfs(folder)
    except (OSError, AttributeError):
        return False
    return vfs.f_bavail * vfs.f_frsize < (64 << 10)


def raise_if_out_of_space(folder: str, output: str) -> None:
    """Raise ``OSError(ENOSPC)`` when a failed compile into ``folder`` was a full disk (the
    caller then moves to the private cache, as for any write that fails)."""
    if out_of_space(folder, output):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), folder)


def atomic_write(
    path: str,
    content: bytes | Callable[[BinaryIO], None],
    mode: int = 0o600,
    *,
    prefix: str = ".tmp-",
    suffix: str = "",
    checksum: bool = False,
    durable: bool = True,
) -> None:
    """Atomically write ``content`` (bytes, or a function writing to a binary handle) to
    ``path``: a temp file (``prefix``...``suffix``) in the same directory, then
    :func:`publish`. On any failure the temp file is removed and the error propagates.

    Example:
        >>> atomic_write(os.path.join(folder, "entry"), b"data", checksum=True)  # doctest: +SKIP
    """
    tmp = _temp_file(os.path.dirname(path) or ".", content, prefix, suffix)
    publish(tmp, path, mode, checksum=checksum, durable=durable)


def _temp_file(
    folder: str, content: bytes | Callable[[BinaryIO], None], prefix: str, suffix: str
) -> str:
    """A new temp file in ``folder`` holding ``content`` (removed again on any failure)."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def publish(
    tmp: str, final: str, mode: int, *, checksum: bool = False, durable: bool = True
) -> tuple[int, int]:
    """Move the complete temp file ``tmp`` (in ``final``'s directory) to ``final``.

    ``mode`` is set whatever the umask (compilers honour it, and it may be 0);
    ``durable`` flushes the file to disk before the rename and the directory after it, so
    a crash leaves the old file or the new one; ``checksum`` writes the SHA-256 to
    ``final + ".sha256"``, prepared before and renamed right after the file: file first,
    checksum second, so a reader that sees the new checksum sees the new file (and two
    processes publishing the same name leave a pair that agrees, but for a moment). ``tmp``
    is gone afterwards, whatever happens. Returns the (device, inode) of the file
    published (to load exactly that one).
    """
    folder = os.path.dirname(final) or "."
    sums: str | None = None
    try:
        os.chmod(tmp, mode)
        digest = _sync_and_hash(tmp, durable, checksum)
        if digest is not None:
            sums = _temp_file(folder, digest.encode("ascii"), ".tmp-", "")
            os.chmod(sums, 0o600)
            _sync_and_hash(sums, durable, False)
        st = os.lstat(tmp)
        os.replace(tmp, final)
        if sums is not None:
            try:
                os.replace(sums, final + ".sha256")
            except BaseException:
                unlink_quietly(final)
                raise
    except BaseException:
        unlink_quietly(tmp)
        if sums is not None:
            unlink_quietly(sums)
        raise
    if durable:
        _sync_dir(folder)
    return st.st_dev, st.st_ino


def _sync_and_hash(path: str, sync: bool, digest: bool) -> str | None:
    if not (sync or digest):
        return None
    fd = os.open(path, _READ_FLAGS)
    try:
        if sync:
            os.fsync(fd)
        if not digest:
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def _sync_dir(folder: str) -> None:
    """Flush a directory's entries (the rename) to disk; best effort (not every system
    can open a directory for it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish_tree(staged: str, final: str) -> bool:
    """Rename the finished directory ``staged`` to ``final`` (same parent directory), after
    removing group/other write bits below it. Returns False when another process
    published ``final`` first and it is trusted (its package is kept; ``staged`` is left
    to the caller); an untrusted ``final`` in the way re-raises the rename's error."""
    secure_tree(staged)
    try:
        os.rename(staged, final)  # atomic; fails if another process already won
    except OSError:
        if not trusted_tree(final):
            raise
        return False
    _sync_dir(os.path.dirname(final) or ".")
    return True


def secure_tree(path: str) -> None:
    """Remove group/other write bits below ``path`` (tools may honour a lax umask)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(full, stat.S_IMODE(st.st_mode) & ~0o022)
    os.chmod(path, 0o700)


def remove_stale_temps(
    folder: str,
    is_temp: Callable[[str], bool],
    pid_of: Callable[[str], int | None] | None = None,
    *,
    folder_may_be_link: bool = False,
) -> int:
    """Delete temp entries in ``folder`` (``is_temp(name)``) that killed writers left;
    returns how many were removed.

    An entry is stale when it is older than :data:`STALE_SECONDS`, or when ``pid_of``
    names the process that writes it and that process is gone. Younger entries may belong
    to a writer that is still running, so they are left alone. Nothing is followed: the
    directory is opened once (without following a link, unless ``folder_may_be_link``: a
    user's own folder, not a cache), and every entry is examined and removed relative to
    that descriptor (a symlink entry is removed, not its target).
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | (0 if folder_may_be_link else _NOFOLLOW)
    try:
        dir_fd = os.open(folder, flags)
    except OSError:
        return 0
    removed = 0
    try:
        cutoff = time.time() - STALE_SECONDS
        for name in os.listdir(dir_fd):
            if not is_temp(name):
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                pid = pid_of(name) if pid_of is not None else None
                if not (st.st_mtime < cutoff or (pid is not None and not process_alive(pid))):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    _remove_dir_at(dir_fd, name)
                else:
                    os.unlink(name, dir_fd=dir_fd)
                removed += 1
            except OSError:
                continue
    finally:
        os.close(dir_fd)
    return removed


def _remove_dir_at(dir_fd: int, name: str) -> None:
    """``rm -r`` of the entry ``name`` of ``dir_fd``, never following a link."""
    try:
        shutil.rmtree(name, dir_fd=dir_fd)
    except NotImplementedError:  # no descriptor-relative removal here: leave it
        raise OSError(errno.ENOTSUP, "cannot remove a directory safely here") from None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (ours or not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: it exists, owned by someone else
        return True
    return True


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
