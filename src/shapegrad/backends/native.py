"""Native builds shared by the C and CUDA backends: run a compiler on generated source
under a time limit, keep the failed source, publish the library into the content-keyed
cache, and load only what was verified.

* :class:`BuildSpec` is everything that determines a library (source, compiler, flags,
  link line, how the language spells a shared build and the key symbol); its ``key``
  hashes those with the compiler's ``--version``, the CPU and the shapegrad version.
* Cache: ``$SHAPEGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/shapegrad`` (``_cache``). The
  library is ``<key>.so`` with its SHA-256 in ``<key>.sha256``; both are published
  atomically (``_cache.publish``), so concurrent processes never load half a library. A
  library whose checksum does not match (truncated, corrupted) is rebuilt. The key is
  also compiled into the library (``sg_key``) and checked after ``dlopen``.
* Loading: a cached library is opened once and checked through that descriptor (ours
  alone, checksum, complete ELF); what ``dlopen`` receives is a private name for that
  same file (a hard link whose inode is the checked one, else a copy of the checked
  bytes) in this process's ``.load-*`` directory, so swapping the cache entry after the
  check changes nothing. A cache on a read-only disk is read as it is; new libraries
  then go to the private fallback cache.
* A compiler that runs past ``BuildSpec.time_limit`` (``$SHAPEGRAD_COMPILE_TIMEOUT``) is
  stopped: the error names the kept source and the command.

The C backend's flags and link line are ``backends/c/toolchain.py``'s, nvcc's
``backends/cuda/toolchain.py``'s.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from shapegrad import _cache
from shapegrad._cache import CacheError as CacheError
from shapegrad._cache import CacheWarning as CacheWarning
from shapegrad._version import __version__

VERSION = __version__

# Counts compiler runs in this process (tests check cache hits with it): every run, and
# the runs that compiled one unit of a multi-unit library to an object file.
compile_count = 0
object_compile_count = 0


class CompilerNotFound(RuntimeError):
    """No compiler could be run."""


class CompileError(RuntimeError):
    """The compiler rejected generated source (or ran past its time limit); the message
    names the kept file."""


def missing_compiler_message(cc: str) -> str:
    return (
        f"C backend: no C compiler found (tried {cc!r}; set $CC to choose one). "
        "Install one (Debian/Ubuntu: `apt install gcc`; Fedora: `dnf install gcc`; "
        "macOS: `xcode-select --install`), or compile with backend='numpy', which needs none."
    )


@lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """The output of ``cc --version`` (part of the cache key; nvcc names its release on a
    later line, so the whole text counts).

    Memoised on disk by the compiler binary's path, size and mtime, so a process that
    only loads cached libraries never runs the compiler.
    """
    exe = shutil.which(shlex.split(cc)[0]) if cc else None
    if exe is None:
        raise CompilerNotFound(missing_compiler_message(cc))
    st = os.stat(exe)
    ident = f"{cc}|{os.path.realpath(exe)}|{st.st_size}|{st.st_mtime_ns}"
    name = "cc-" + hashlib.sha256(ident.encode()).hexdigest()[:24]
    for folder in library_dirs():
        remembered = _read_trusted(os.path.join(folder, name))
        if remembered is not None:
            return remembered.decode("utf-8", "replace")
    try:
        out = subprocess.run(
            [*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        raise CompilerNotFound(missing_compiler_message(cc)) from exc
    text = out.stdout or out.stderr
    version = text.strip() or cc
    with contextlib.suppress(OSError):  # best effort: it is only a memo
        _cache.atomic_write(os.path.join(library_dir(), name), version.encode("utf-8"))
    return version


@lru_cache(maxsize=1)
def cpu_identity() -> str:
    model = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("model name", "flags")):
                    model += "|" + line.strip()
    except OSError:
        pass
    return model


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``), as configured;
    :func:`library_dir` is the directory actually used."""
    return _cache.cache_home()


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines a library: source, compiler, flags, link line.

    The language fields let another C-family backend (CUDA through nvcc) build and cache
    its libraries with the same discipline: ``suffix`` of the source file, the flags
    that make a shared library, and how the key symbol is declared.
    """

    source: str
    cc: str
    flags: tuple[str, ...]
    link: tuple[str, ...]
    suffix: str = ".c"
    shared_flags: tuple[str, ...] = ("-fPIC", "-shared")
    key_decl: str = "const char sg_key[]"
    # Seconds the compiler may run before the build fails with an error that names the
    # kept source and the command (not part of the key: it does not change the library).
    time_limit: float = 600.0

    @property
    def language(self) -> str:
        """The backend's name for messages."""
        return "CUDA" if self.suffix == ".cu" else "C"

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for part in (
            self.source,
            compiler_version(self.cc),
            self.cc,
            " ".join(self.flags),
            " ".join(self.link),
            " ".join((self.suffix, *self.shared_flags, self.key_decl)),
            cpu_identity(),
            VERSION,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]


def compile_time_limit(default: float) -> float:
    """``$SHAPEGRAD_COMPILE_TIMEOUT`` (seconds) when set to a positive number, else ``default``."""
    text = os.environ.get("SHAPEGRAD_COMPILE_TIMEOUT", "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"SHAPEGRAD_COMPILE_TIMEOUT={text!r}: expected a positive number of seconds"
        )
    return value


def is_temp(name: str) -> bool:
    """Whether a cache entry is a writer's temp file (removed once stale)."""
    return _TEMP_NAME.match(name) is not None


_count_lock = threading.Lock()  # units are compiled from a thread pool


def count_compile() -> None:
    global compile_count
    with _count_lock:
        compile_count += 1


def count_object_compile() -> None:
    global object_compile_count
    with _count_lock:
        object_compile_count += 1


_TEMP_NAME = re.compile(r"^[0-9a-f]{32}-.+\.(c|cu|so|o|sha256)$|^\.tmp-|\.tmp$|^\.load-")
_MACHO_MAGICS = (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def library_is_complete(data: bytes) -> bool:
    """True when ``data`` is a whole shared library: an ELF file whose program headers,
    segments and section headers all lie inside it (Mach-O: the magic and a header).

    A truncated library whose checksum was (re)computed after the truncation passes the
    checksum; ``dlopen`` would then map pages past the end of the file and die of SIGBUS.
    """
    if data[:4] in _MACHO_MAGICS:
        return len(data) >= 32
    if data[:4] != b"\x7fELF" or len(data) < 52 or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    end = "<" if data[5] == 1 else ">"
    wide = data[4] == 2
    if wide and len(data) < 64:
        return False
    phoff, shoff = struct.unpack_from(end + ("QQ" if wide else "II"), data, 32 if wide else 28)
    phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 54 if wide else 42)
    size = len(data)
    if phnum == 0 or phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return False
    for k in range(phnum):
        if wide:
            _t, _f, offset, _v, _p, filesz = struct.unpack_from(
                end + "IIQQQQ", data, phoff + k * phentsize
            )
        else:
            _t, offset, _v, _p, filesz = struct.unpack_from(
                end + "IIIII", data, phoff + k * phentsize
            )
        if offset + filesz > size:
            return False
    return True


def _read_trusted(path: str) -> bytes | None:
    """The bytes of ``path`` when it is a regular file that is ours alone, else None."""
    found = _cache.read_trusted(path)
    return None if found is None else found.data


def load_path(final: str) -> str:
    """The private path to ``dlopen`` for the library just published at ``final``: the very
    file :func:`publish` moved there, else (a concurrent build of the same key replaced it)
    the file there when it is ours alone (see the module docstring).

    Raises:
        CacheError: ``final`` is neither, or not a complete library.
    """
    found = _cache.read_trusted(final, identity=_published.get(final))
    if found is None:  # another of our processes published the same key since: ours alone?
        found = _cache.read_trusted(final)
    if found is None or not library_is_complete(found.data):
        raise CacheError(
            f"C backend: the library {final!r} changed after it was built (it is not a "
            "complete library that is yours alone any more); not loaded"
        )
    return _private_copy(final, found)


# (device, inode) of every file this process published, by path: the library to load.
_published: dict[str, tuple[int, int]] = {}


def pinned_path(path: str) -> str:
    """A private name for the cache entry ``path`` (an object file about to be linked): the
    file this process published there, else one that is ours alone with a checksum that
    agrees. Like a library, an object is never used by its shared name after its check.

    Raises:
        CacheError: ``path`` is neither.
    """
    identity = _published.get(path)
    found = _cache.read_trusted(path, identity=identity) if identity is not None else None
    if found is None:
        found = _verified(path)
    if found is None:
        raise CacheError(f"C backend: the cache entry {path!r} changed after its check; not used")
    return _private_copy(path, found)


# Per cache directory, this process's directory of private names for the libraries it
# loads: each load gets a new name, because dlopen hands back the object already loaded
# for a name it has seen (a library rebuilt under the same name must load as itself).
_load_roots: dict[str, str] = {}
_load_lock = threading.Lock()
_load_count = 0


def _private_copy(final: str, verified: _cache.TrustedFile) -> str:
    """A fresh path in this process's private ``.load-*`` directory naming exactly the
    ``verified`` file: a hard link when its inode is still the verified one, else a copy
    of the verified bytes. Whatever replaced ``final`` since the check is never used.

    The directory is in ``final``'s folder (a hard link costs no copy), else (a read-only
    or full disk) in the private fallback cache."""
    try:
        return _private_name(final, verified, os.path.dirname(final))
    except OSError:
        return _private_name(final, verified, _cache.fallback_dir())


def _private_name(final: str, verified: _cache.TrustedFile, where: str) -> str:
    global _load_count
    with _load_lock:
        _load_count += 1
        slot = os.path.join(_load_root(where), str(_load_count))
        os.mkdir(slot, 0o700)
    fresh = os.path.join(slot, os.path.basename(final))
    try:
        os.link(final, fresh, follow_symlinks=False)
        st = os.lstat(fresh)
        if (st.st_dev, st.st_ino) == (verified.device, verified.inode):
            return fresh
        os.unlink(fresh)  # the name now points at another file: not that one
    except OSError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(fresh, flags, 0o700)
    with os.fdopen(fd, "wb") as handle:
        handle.write(verified.data)
    return fresh


def _load_root(folder: str) -> str:
    """This process's ``.load-*`` directory in ``folder`` (made again if it was removed)."""
    root = _load_roots.get(folder)
    if root is None or not os.path.isdir(root):
        root = tempfile.mkdtemp(prefix=".load-", dir=folder)
        atexit.register(shutil.rmtree, root, True)
        _load_roots[folder] = root
    return root


def cached_library(spec: BuildSpec) -> str | None:
    """Path of a verified cached library for ``spec``, or None.

    Verified: the library and its checksum are regular files owned by this user and not
    writable by group/others, in a directory with the same property; the checksum covers
    every byte; the ELF headers say the file is complete. Anything else is rebuilt.
    """
    return cached_library_by_key(spec.key)


def cached_library_by_key(key: str) -> str | None:
    """:func:`cached_library` for a library known only by its key (a manifest names it):
    the private load path of the verified file (see the module docstring), or None."""
    if not _KEY.match(key):
        return None
    for folder in library_dirs():
        path = os.path.join(folder, key + ".so")
        found = _verified(path)
        if found is not None and library_is_complete(found.data):
            return _private_copy(path, found)
    return None


_KEY = re.compile(r"^[0-9a-f]{32}$")
_CHECKSUM_BYTES = 256  # a hex SHA-256 and a newline; anything longer is not one


def _verified(path: str) -> _cache.TrustedFile | None:
    """``path`` read once, when it and ``path.sha256`` are ours alone and agree."""
    found = _cache.read_trusted(path)
    expected = _cache.read_trusted(path + ".sha256", _CHECKSUM_BYTES)
    if found is None or expected is None:
        return None
    if hashlib.sha256(found.data).hexdigest() != expected.data.decode("ascii", "replace").strip():
        return None
    return found


def verified_bytes(path: str) -> bytes | None:
    """The bytes of ``path`` when it and ``path.sha256`` are ours alone and agree."""
    found = _verified(path)
    return None if found is None else found.data


def library_dir() -> str:
    """Where new libraries are written: :func:`cache_dir` when it is a usable private
    directory, else (with a :class:`CacheWarning`) this process's private temporary cache."""
    return _cache.private_dir(cache_dir())


def library_dirs() -> list[str]:
    """Where cached libraries are looked up: :func:`cache_dir` when it is trusted (even on
    a read-only disk, without a warning), then the private fallback when one is in use."""
    return _cache.search_dirs(cache_dir())


def cache_entry(path: str) -> str:
    """The cache entry behind a path handed out for ``dlopen`` (:func:`load_path`
    hands out a private link somewhere inside a ``.load-*`` scratch folder beside the
    entry)."""
    folder = os.path.dirname(path)
    while folder and folder != os.path.dirname(folder):
        if os.path.basename(folder).startswith(".load-"):
            return os.path.join(os.path.dirname(folder), os.path.basename(path))
        folder = os.path.dirname(folder)
    return path


def full_source(spec: BuildSpec) -> str:
    """The source actually compiled: the program plus its cache key symbol."""
    return spec.source + f'\n{spec.key_decl} = "{spec.key}";\n'


def build_library(spec: BuildSpec) -> str:
    """Compile ``spec`` into the cache (atomically) and return the path to ``dlopen``.

    A cache that cannot be written (full, read-only) is bypassed with a
    :class:`CacheWarning` for a private temporary one; no partial file is left behind.

    Raises:
        CompilerNotFound: no compiler.
        CompileError: the compiler failed; the message has the source path and its output.
        CacheError: not even the private temporary cache could be written.
    """
    folder = library_dir()
    try:
        return _build_in(spec, folder)
    except OSError as exc:
        if folder == _cache.fallback_dir():
            raise CacheError(
                f"C backend: cannot write the compiled library to {folder!r} "
                f"({exc.strerror or exc}); set $XDG_CACHE_HOME to a writable directory you own"
            ) from exc
        fallback = _cache.bypass(folder, f"writing to it failed ({exc.strerror or exc})")
        return build_library_in(spec, fallback)


def build_library_in(spec: BuildSpec, folder: str) -> str:
    try:
        return _build_in(spec, folder)
    except OSError as exc:
        raise CacheError(
            f"C backend: cannot write the compiled library to {folder!r} "
            f"({exc.strerror or exc}); set $XDG_CACHE_HOME to a writable directory you own"
        ) from exc


def run_compiler(
    cmd: list[str], cc: str, time_limit: float, source: str, kept: str, language: str = "C"
) -> subprocess.CompletedProcess[str]:
    """Run one compiler command (counted in :data:`compile_count`).

    Raises:
        CompilerNotFound: the compiler cannot be run.
        CompileError: it ran longer than ``time_limit`` seconds: it is stopped, ``source``
            is kept as ``kept``, and the message names both and the command.
    """
    global compile_count
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit)
    except OSError as exc:
        raise CompilerNotFound(missing_compiler_message(cc)) from exc
    except subprocess.TimeoutExpired as exc:
        os.replace(source, kept)
        raise CompileError(
            f"{language} backend: the compiler ran longer than {time_limit:g} s and was "
            f"stopped (set $SHAPEGRAD_COMPILE_TIMEOUT to allow more); source kept at "
            f"{kept}; command: {shlex.join(cmd).replace(source, kept)}"
        ) from exc
    with _count_lock:
        compile_count += 1
    return proc


@contextlib.contextmanager
def build_dir(folder: str) -> Iterator[str]:
    """A private directory in the cache ``folder`` for one build's temp files (a ``.tmp-``
    name: :func:`is_temp`, so a killed build's is removed once stale), removed afterwards.

    Sources are written there under their key's own name, not a random temp name: the
    compiler records the source's name in the object's symbol table, so with a random
    name two builds of one key differed in a few bytes, and two processes publishing the
    same key at once could leave a library beside the other's checksum."""
    path = tempfile.mkdtemp(prefix=".tmp-build-", dir=folder)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _build_in(spec: BuildSpec, folder: str) -> str:
    _cache.remove_stale_temps(folder, is_temp)
    key = spec.key
    final = os.path.join(folder, key + ".so")
    with build_dir(folder) as work:
        tmp_c = os.path.join(work, key + spec.suffix)
        tmp_so = os.path.join(work, key + ".so")
        with open(tmp_c, "w", encoding="utf-8") as handle:
            handle.write(full_source(spec))
        cmd = [
            *shlex.split(spec.cc),
            *spec.flags,
            *spec.shared_flags,
            tmp_c,
            "-o",
            tmp_so,
            *spec.link,
        ]
        proc = run_compiler(
            cmd, spec.cc, spec.time_limit, tmp_c, os.path.join(folder, key + ".failed" + spec.suffix),
            spec.language,
        )  # fmt: skip
        if proc.returncode != 0:
            _cache.raise_if_out_of_space(folder, proc.stderr)  # full disk: private cache
            kept = os.path.join(folder, key + ".failed" + spec.suffix)
            os.replace(tmp_c, kept)
            raise CompileError(
                f"{spec.language} backend: {' '.join(cmd[:1])} failed on {kept} "
                f"(exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}"
            )
        publish(tmp_so, final, 0o700)
    return load_path(final)


def publish(tmp: str, final: str, mode: int) -> None:
    """Move a freshly built ``tmp`` to ``final`` with ``mode`` and write its checksum
    (``_cache.publish``: file first, checksum second)."""
    _published[final] = _cache.publish(tmp, final, mode, checksum=True)


def library_for(spec: BuildSpec) -> tuple[str, bool]:
    """(path, was_cached): a verified cached library, else a fresh build."""
    found = cached_library(spec)
    if found is not None:
        return found, True
    return build_library(spec), False
