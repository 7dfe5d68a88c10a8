"""The compile cache as an attacker or a broken disk meets it (issue 17, items 1 and 10).

The machine running the tests is root, which owns every file it creates: foreign ownership
is made real with ``os.chown`` to uid 65534 where we can, and simulated by pretending to be
another uid (``_cache.current_uid``) for the directory check.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import _cache
from shapegrad.backends import native
from shapegrad.backends.base import CompileOptions
from shapegrad.backends.c import generate, toolchain
from shapegrad.backends.c.render import uses_blas

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
ROOT = Path(__file__).resolve().parents[1]
FOREIGN_UID = 65534  # "nobody"


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    yield tmp_path / "xdg" / "shapegrad"


def _program() -> tuple[Callable[[sg.Tensor], sg.Tensor], float]:
    """A program no other test compiles (so no in-process library memo can hide a load)."""
    scale = 1.0 + (uuid.uuid4().int % 10**6) / 10**6
    return (lambda x: sg.tanh(x * scale).sum(axis=0)), scale


X = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


def _key(fn: Callable[[sg.Tensor], sg.Tensor]) -> str:
    graph = sg.compile(fn, backend="numpy").graph(X)
    program, source = generate(graph, CompileOptions(name="<lambda>"))
    return toolchain.make_spec(source, uses_blas(program), "omp declare simd" in source).key


def _check(fn: Callable[[sg.Tensor], sg.Tensor], scale: float) -> None:
    got = sg.compile(fn, backend="c")(X).numpy()
    np.testing.assert_allclose(got, np.tanh(X * np.float32(scale)).sum(axis=0), rtol=1e-5)


def _plant(folder: Path, key: str, marker: Path) -> Path:
    """A library with a valid key and checksum whose constructor writes ``marker``."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder.parent / "evil.c"
    src.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void evil(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("pwned", f); fclose(f); }}\n'
        "}\n"
        f'const char sg_key[] = "{key}";\n'
    )
    lib = folder / f"{key}.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    Path(str(lib) + ".sha256").write_text(hashlib.sha256(lib.read_bytes()).hexdigest())
    return lib


def test_library_planted_in_a_world_writable_cache_is_never_loaded(cache: Path) -> None:
    fn, scale = _program()
    marker = cache.parent.parent / "constructor-ran"
    lib = _plant(cache, _key(fn), marker)
    for path in (lib, Path(str(lib) + ".sha256")):
        os.chown(path, FOREIGN_UID, FOREIGN_UID)
    cache.chmod(0o777)
    with pytest.warns(_cache.CacheWarning, match=r"writable by group or others.*chmod 700"):
        _check(fn, scale)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["foreign-owner", "other-writable", "symlink"])
def test_untrusted_entry_in_a_private_cache_is_rebuilt_not_loaded(cache: Path, damage: str) -> None:
    fn, scale = _program()
    marker = cache.parent.parent / "constructor-ran"
    lib = _plant(cache, _key(fn), marker)
    cache.chmod(0o700)
    if damage == "foreign-owner":
        os.chown(lib, FOREIGN_UID, FOREIGN_UID)
    elif damage == "other-writable":
        lib.chmod(0o666)
    else:
        elsewhere = cache.parent / "elsewhere.so"
        lib.rename(elsewhere)
        lib.symlink_to(elsewhere)
    before = native.compile_count
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cache.CacheWarning)
        _check(fn, scale)
    assert native.compile_count == before + 1
    assert not marker.exists()
    assert _cache.trusted_file(str(lib))


def test_cache_directory_owned_by_another_user_is_bypassed(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fn, scale = _program()
    marker = cache.parent.parent / "constructor-ran"
    _plant(cache, _key(fn), marker)
    cache.chmod(0o700)
    real = os.getuid()
    monkeypatch.setattr(_cache, "current_uid", lambda: real + 4242)  # we are someone else now
    with pytest.warns(_cache.CacheWarning, match=r"owned by uid .*not by you"):
        _check(fn, scale)
    assert not marker.exists()


def test_files_and_directories_are_private_whatever_the_umask(cache: Path) -> None:
    fn, scale = _program()
    old = os.umask(0)
    try:
        _check(fn, scale)
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700  # created by us: 0700 too
    entries = list(cache.iterdir())
    assert any(p.suffix == ".so" for p in entries)
    for path in entries:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


# A child process: compile, check the value, report compiler runs (the crash cases must not
# take the test runner down with them).
CHILD = """
import sys
import numpy as np
import shapegrad as sg
from shapegrad.backends import native
from shapegrad.backends.c import toolchain
seed = float(sys.argv[1])
x = np.arange(12, dtype=np.float32).reshape(3, 4)
fn = sg.compile(lambda x: (sg.tanh(x * seed) @ x.T).sum(axis=0), backend="c")
got = fn(x).numpy()
want = (np.tanh(x * np.float32(seed)) @ x.T).sum(axis=0)
assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)
print("compiles", native.compile_count)
"""


def _child(xdg: Path, seed: float) -> subprocess.Popen[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg), PYTHONPATH=str(ROOT / "src"))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(seed)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _compiles(proc: subprocess.Popen[str]) -> int:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {err[-2000:]}"
    return int(out.split("compiles")[-1])


def _truncate_keeping_checksum(lib: Path) -> None:
    data = lib.read_bytes()[: lib.stat().st_size // 2]
    lib.write_bytes(data)
    Path(str(lib) + ".sha256").write_text(hashlib.sha256(data).hexdigest())


def test_truncated_library_with_a_matching_checksum_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    assert _compiles(_child(tmp_path, 7.5)) == 1
    (lib,) = (tmp_path / "shapegrad").glob("*.so")
    _truncate_keeping_checksum(lib)  # the old code died of SIGBUS in dlopen here, forever
    assert _compiles(_child(tmp_path, 7.5)) == 1
    assert _compiles(_child(tmp_path, 7.5)) == 0


def test_concurrent_compiles_over_a_damaged_entry_all_succeed(tmp_path: Path) -> None:
    assert _compiles(_child(tmp_path, 8.25)) == 1
    (lib,) = (tmp_path / "shapegrad").glob("*.so")
    _truncate_keeping_checksum(lib)
    procs = [_child(tmp_path, 8.25) for _ in range(3)]
    assert all(_compiles(p) in (0, 1) for p in procs)
    data = lib.read_bytes()
    assert hashlib.sha256(data).hexdigest() == Path(str(lib) + ".sha256").read_text().strip()
    assert native.library_is_complete(data)
    assert sorted(p.suffix for p in (tmp_path / "shapegrad").iterdir() if p.suffix != "") == [
        ".manifest",  # the keyed cache's entry (backends/c/manifest.py)
        ".sha256",
        ".so",
    ]


def test_library_rebuilt_in_the_same_process_loads_from_a_fresh_path(cache: Path) -> None:
    # Entry B holds a complete library with a valid checksum, but it is A's (a renamed entry):
    # the key check after dlopen rejects it and B is rebuilt under the same name. dlopen of
    # that name again would hand back the library already loaded, i.e. A's.
    fn_a, scale_a = _program()
    fn_b, scale_b = _program()
    _check(fn_a, scale_a)
    lib_a = cache / f"{_key(fn_a)}.so"
    lib_b = cache / f"{_key(fn_b)}.so"
    shutil.copyfile(lib_a, lib_b)
    shutil.copyfile(str(lib_a) + ".sha256", str(lib_b) + ".sha256")
    before = native.compile_count
    _check(fn_b, scale_b)
    assert native.compile_count == before + 1


def test_cache_path_that_is_a_file_falls_back_to_a_private_temp_cache(cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("not a directory")
    fn, scale = _program()
    with pytest.warns(_cache.CacheWarning, match=r"not a directory.*remove or rename"):
        _check(fn, scale)
    assert cache.read_text() == "not a directory"


def test_read_only_cache_falls_back_with_a_warning(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # root ignores permission bits, so "read-only" is simulated at the access check.
    cache.mkdir(parents=True, mode=0o700)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p) == str(cache) else real_access(p, m)
    )
    fn, scale = _program()
    with pytest.warns(_cache.CacheWarning, match="not writable"):
        _check(fn, scale)
    assert list(cache.iterdir()) == []


def test_full_disk_leaves_no_partial_files_and_falls_back(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every cache write is published through _cache.publish, whose flush to disk is where a
    # full disk (delayed allocation) reports ENOSPC.
    real_sync = _cache._sync_and_hash

    def full(path: str, sync: bool, digest: bool) -> str | None:
        if path.startswith(str(cache)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_sync(path, sync, digest)

    monkeypatch.setattr(_cache, "_sync_and_hash", full)
    fn, scale = _program()
    with pytest.warns(_cache.CacheWarning, match="No space left on device"):
        _check(fn, scale)
    assert [p.name for p in cache.iterdir()] == []


def test_stale_temp_files_of_killed_builds_are_removed(cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o700)
    stale = [cache / ("0" * 32 + "-abc.c"), cache / ("1" * 32 + "-abc.so"), cache / ".tmp-xyz"]
    fresh = cache / ("2" * 32 + "-def.c")  # a build still running in another process
    for path in [*stale, fresh]:
        path.write_text("partial")
    for path in stale:
        os.utime(path, (1, 1))
    fn, scale = _program()
    _check(fn, scale)
    assert not any(p.exists() for p in stale)
    assert fresh.exists()


def test_complete_library_check_rejects_every_truncation(cache: Path) -> None:
    fn, scale = _program()
    _check(fn, scale)
    (lib,) = (p for p in cache.glob("*.so") if p.name.startswith(_key(fn)))
    data = lib.read_bytes()
    assert native.library_is_complete(data)
    for cut in (0, 3, 40, 63, 64, len(data) // 4, len(data) // 2, len(data) - 1):
        assert not native.library_is_complete(data[:cut]), cut


def test_ane_cache_honours_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shapegrad.backends.ane.package import cache_root

    monkeypatch.delenv("SHAPEGRAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "shapegrad" / "ane"
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_root() == tmp_path / "explicit" / "ane"


def test_ane_package_cache_trusts_only_private_packages(tmp_path: Path) -> None:
    pytest.importorskip("coremltools", reason="the ane backend builds packages with coremltools")
    from ane_support import traced_graph
    from shapegrad.backends.ane import build_package, lower_to_mil

    x = np.ones((2, 3), np.float32)

    def mil() -> Any:
        return lower_to_mil(traced_graph(lambda x: sg.tanh(x) * 2.0, [x]))

    root = tmp_path / "ane"
    old = os.umask(0)
    try:
        first = build_package(mil(), "fn", root)
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for path in [first.path, *first.path.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0, path  # never world-writable
    assert build_package(mil(), "fn", root).cached
    first.path.chmod(0o777)  # group/other-writable: someone may have changed it
    rebuilt = build_package(mil(), "fn", root)
    assert not rebuilt.cached and stat.S_IMODE(rebuilt.path.stat().st_mode) & 0o022 == 0
    root.chmod(0o777)
    with pytest.warns(_cache.CacheWarning, match="writable by group or others"):
        elsewhere = build_package(mil(), "fn", root)
    assert not elsewhere.path.is_relative_to(root)


# --- issue 24, item 1: the cache swap attack ----------------------------------------------


def _as_foreign_user(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the shell ``script`` as uid/gid 65534 (a real other user; needs root)."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(FOREIGN_UID)
        os.setuid(FOREIGN_UID)

    return subprocess.run(
        ["/bin/sh", "-c", script, "sh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=drop,
        cwd="/",
    )


needs_root = pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0,
    reason="acting as another user (setuid) and mounting need root",
)


@pytest.fixture
def traversable_tmp() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is below a 0700 directory)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="sg-shared-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_cache_below_a_directory_others_can_write_is_bypassed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, traversable_tmp: Path
) -> None:
    shared = traversable_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by everyone, not sticky
    xdg = shared / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    cache = xdg / "shapegrad"
    fn, scale = _program()
    marker = tmp_path / "constructor-ran"
    lib = _plant(cache, _key(fn), marker)  # what a swap would put under the checked name
    cache.chmod(0o700)
    xdg.chmod(0o700)
    # The threat is real: another user can rename our private cache away and put theirs.
    moved = _as_foreign_user('mv "$1" "$2" && mv "$2" "$1"', str(xdg), str(shared / "theirs"))
    assert moved.returncode == 0, moved.stderr
    with pytest.warns(_cache.CacheWarning, match=r"ancestor .*shared.* not sticky"):
        _check(fn, scale)
    assert not marker.exists()
    assert lib.exists()  # bypassed, not touched


def test_cache_below_a_sticky_world_writable_directory_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others may not rename what is ours
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "xdg"))
    fn, scale = _program()
    before = native.compile_count
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cache.CacheWarning)
        _check(fn, scale)
    assert native.compile_count == before + 1
    assert (shared / "xdg" / "shapegrad" / f"{_key(fn)}.so").exists()


@needs_root
def test_cache_below_a_directory_of_another_user_is_bypassed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, FOREIGN_UID, FOREIGN_UID)  # they may rename anything in it
    monkeypatch.setenv("XDG_CACHE_HOME", str(theirs / "xdg"))
    (theirs / "xdg" / "shapegrad").mkdir(parents=True, mode=0o700)
    fn, scale = _program()
    with pytest.warns(_cache.CacheWarning, match=r"ancestor .*theirs.* owned by uid 65534"):
        _check(fn, scale)
    assert list((theirs / "xdg" / "shapegrad").iterdir()) == []


def _good_and_evil(cache: Path, tmp_path: Path) -> tuple[str, Path, Path]:
    """A verified cached library for a fresh program, and an evil one with the same key
    and a constructor that writes a marker; returns (key, evil library, marker)."""
    fn, scale = _program()
    key = _key(fn)
    _check(fn, scale)  # the genuine library, in the cache
    marker = tmp_path / "constructor-ran"
    evil = _plant(tmp_path / "attacker", key, marker)
    return key, evil, marker


@pytest.mark.parametrize("swap", ["file", "directory"])
def test_library_swapped_after_its_check_is_not_the_one_loaded(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    import ctypes

    key, evil, marker = _good_and_evil(cache, tmp_path)
    final = cache / f"{key}.so"
    good = hashlib.sha256(final.read_bytes()).hexdigest()
    real_read = _cache.read_trusted

    def read_then_swap(path: str, *args: Any, **kwargs: Any) -> Any:
        found = real_read(path, *args, **kwargs)
        if path == f"{final}.sha256" and found is not None:  # both read: now swap
            if swap == "file":
                os.replace(evil, final)
            else:
                cache.rename(cache.parent / "mine")
                cache.symlink_to(evil.parent, target_is_directory=True)
        return found

    monkeypatch.setattr(_cache, "read_trusted", read_then_swap)
    path = native.cached_library_by_key(key)
    monkeypatch.undo()
    assert path is not None
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == good
    lib = ctypes.CDLL(path)
    assert (ctypes.c_char * 33).in_dll(lib, "sg_key").value == key.encode()
    assert not marker.exists()


def test_freshly_built_library_swapped_before_loading_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fn, scale = _program()
    key = _key(fn)
    marker = tmp_path / "constructor-ran"
    evil = _plant(tmp_path / "attacker", key, marker)
    os.chown(evil, FOREIGN_UID, FOREIGN_UID)  # the attacker's own file
    real_publish = native.publish

    def publish_then_swap(tmp: str, final: str, mode: int) -> None:
        real_publish(tmp, final, mode)
        if final.endswith(f"{key}.so"):
            os.replace(evil, final)

    monkeypatch.setattr(native, "publish", publish_then_swap)
    with pytest.raises(_cache.CacheError, match="changed after it was built"):
        sg.compile(fn, backend="c")(X)
    assert not marker.exists()


@needs_root
def test_object_swapped_for_another_users_before_the_link_is_never_linked(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shapegrad.backends.c import units

    flags = ("-O2", "-fPIC")
    tag = uuid.uuid4().hex[:8]  # a fresh library (no in-process memo)
    spec = units.LinkSpec(
        (
            units.UnitSpec("a", f"int sg_a_{tag}(void) {{ return 7; }}\n", flags),
            units.UnitSpec(
                "b",
                f"int sg_a_{tag}(void);\nint total(void) {{ return sg_a_{tag}() + 1; }}\n",
                flags,
            ),
        ),
        "cc",
        (),
    )
    marker = tmp_path / "constructor-ran"
    ctor = tmp_path / "ctor.c"
    ctor.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("pwned", f); fclose(f); }}\n}}\n'
    )
    subprocess.run(["cc", "-c", "-fPIC", str(ctor), "-o", str(tmp_path / "ctor.o")], check=True)
    real_link = units._link

    def swap_then_link(spec_: Any, objects: list[str], folder: str) -> str:
        # The genuine object plus a constructor, with a matching checksum, owned by them.
        evil = tmp_path / "evil.o"
        subprocess.run(
            ["ld", "-r", objects[0], str(tmp_path / "ctor.o"), "-o", str(evil)], check=True
        )
        Path(objects[0] + ".sha256").write_text(hashlib.sha256(evil.read_bytes()).hexdigest())
        os.chown(evil, FOREIGN_UID, FOREIGN_UID)
        os.replace(evil, objects[0])
        return real_link(spec_, objects, folder)

    monkeypatch.setattr(units, "_link", swap_then_link)
    with pytest.raises(_cache.CacheError, match="changed after its check"):
        units.library_for(spec)
    assert not marker.exists()
    assert list(cache.glob("*.so")) == []


def _stale(path: Path, data: str = "old") -> Path:
    path.write_text(data)
    os.utime(path, (1, 1), follow_symlinks=False)
    return path


def test_cleanup_of_a_folder_swapped_for_a_symlink_deletes_nothing_of_the_victim(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    theirs = _stale(victim / ".tmp-precious")
    ours = _stale(folder / ".tmp-precious")

    def swapping_is_temp(name: str) -> bool:
        # The swap lands between listing the folder and deleting from it.
        if folder.is_dir() and not folder.is_symlink():
            folder.rename(tmp_path / "cache-moved")
            folder.symlink_to(victim, target_is_directory=True)
        return name.startswith(".tmp-")

    assert _cache.remove_stale_temps(str(folder), swapping_is_temp) == 1
    assert theirs.read_text() == "old"
    assert not (tmp_path / "cache-moved" / ours.name).exists()  # ours, through our descriptor
    # A folder that is a symlink when cleanup starts is not entered at all.
    assert _cache.remove_stale_temps(str(folder), lambda n: n.startswith(".tmp-")) == 0
    assert theirs.read_text() == "old"


def test_cleanup_removes_links_not_what_they_point_to(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    precious = _stale(victim / "precious")
    (folder / ".tmp-link").symlink_to(precious)
    os.utime(folder / ".tmp-link", (1, 1), follow_symlinks=False)
    load_dir = folder / ".load-abc"
    load_dir.mkdir()
    (load_dir / "inside").symlink_to(victim, target_is_directory=True)
    os.utime(load_dir, (1, 1))
    assert _cache.remove_stale_temps(str(folder), native.is_temp) == 2
    assert list(folder.iterdir()) == []
    assert precious.read_text() == "old" and sorted(os.listdir(victim)) == ["precious"]


# --- issue 24, item 13: full and read-only disks (real mounts; root only) ------------------


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip()}): the real-disk case needs it")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs, unmounted afterwards."""
    point = tmp_path / "disk"
    point.mkdir()
    _mount("-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(point))
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until only ``leave`` bytes (about) remain free."""
    vfs = os.statvfs(disk)
    free = vfs.f_bavail * vfs.f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


@needs_root
def test_full_cache_disk_falls_back_to_the_private_cache(
    tiny_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tiny_disk))
    fn, scale = _program()
    key = _key(fn)
    cache = Path(native.library_dir())
    assert cache == tiny_disk / "shapegrad"
    # Room for the source (about 8 KB) but not for the library (about 16 KB): the compiler
    # itself fails, writing its output.
    _fill(tiny_disk, 12 << 10)
    before = set(os.listdir(cache))
    with pytest.warns(_cache.CacheWarning, match="No space left on device"):
        _check(fn, scale)
    left = set(os.listdir(cache)) - before
    assert left == set(), left  # no .failed.c, no temp file, no partial library
    assert not (cache / f"{key}.so").exists()


@needs_root
def test_warm_cache_on_a_read_only_disk_is_used_as_it_is(tmp_path: Path) -> None:
    assert _compiles(_child(tmp_path, 9.5)) == 1
    cache = tmp_path / "shapegrad"
    entries = sorted(os.listdir(cache))
    _mount("--bind", str(cache), str(cache))
    try:
        _mount("-o", "remount,bind,ro", str(cache))
        warm = _child(tmp_path, 9.5)
        out, err = warm.communicate(timeout=300)
        assert warm.returncode == 0, err[-2000:]
        assert int(out.split("compiles")[-1]) == 0  # no recompile
        assert "CacheWarning" not in err
        cold = _child(tmp_path, 10.5)  # a program the read-only cache does not hold
        out, err = cold.communicate(timeout=300)
        assert cold.returncode == 0, err[-2000:]
        assert int(out.split("compiles")[-1]) == 1
        assert "CacheWarning" in err and "not writable" in err
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)
    assert sorted(os.listdir(cache)) == entries


def test_ane_package_with_a_link_or_a_writable_file_inside_is_not_trusted(tmp_path: Path) -> None:
    from shapegrad.backends.ane.package import _discard, _trusted_package

    package = tmp_path / "fn-abc.mlpackage"
    (package / "Data").mkdir(parents=True, mode=0o700)
    package.chmod(0o700)
    weights = package / "Data" / "weights.bin"
    weights.write_bytes(b"w")
    weights.chmod(0o600)
    assert _trusted_package(package)
    weights.chmod(0o666)  # anyone may rewrite the weights Core ML loads by path
    assert not _trusted_package(package)
    weights.chmod(0o600)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    (package / "Data" / "model").symlink_to(victim, target_is_directory=True)
    assert not _trusted_package(package)
    _discard(package)  # removes the package and the link in it, never what it points to
    assert not package.exists() and (victim / "precious").read_text() == "keep"
    package.symlink_to(victim, target_is_directory=True)  # the entry itself is a link
    assert not _trusted_package(package)
    _discard(package)
    assert not package.is_symlink() and (victim / "precious").read_text() == "keep"
