"""The C backend's disk cache: hits across processes, corruption recovery, concurrent builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shapegrad.backends import native
from shapegrad.backends.c import toolchain

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
ROOT = Path(__file__).resolve().parents[1]

# A child process: compile a small program (seeded so parallel children build the same one),
# run it, check the value against NumPy, report how many compiler runs it needed.
CHILD = """
import sys
import numpy as np
import shapegrad as sg
from shapegrad.backends import native
from shapegrad.backends.c import toolchain
seed = int(sys.argv[1])
x = np.arange(12, dtype=np.float32).reshape(3, 4)
fn = sg.compile(lambda x: (sg.tanh(x * float(seed)) @ x.T).sum(axis=0), backend="c")
got = fn(x).numpy()
want = (np.tanh(x * seed) @ x.T).sum(axis=0)
assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)
print("compiles", native.compile_count)
"""


def _child(cache: Path, seed: int, **env: str) -> subprocess.Popen[str]:
    environ = dict(os.environ, XDG_CACHE_HOME=str(cache), **env)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(seed)],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _compiles(proc: subprocess.Popen[str]) -> int:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return int(out.split("compiles")[-1])


def _libraries(cache: Path) -> list[Path]:
    return sorted((cache / "shapegrad").glob("*.so"))


def test_second_process_hits_the_cache_without_running_the_compiler(tmp_path: Path) -> None:
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "logging-cc"
    real = shutil.which("cc")
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    cache = tmp_path / "cache"
    assert _compiles(_child(cache, 3, CC=str(wrapper))) == 1
    first = log.read_text()
    assert "-shared" in first
    (lib,) = _libraries(cache)
    assert _compiles(_child(cache, 3, CC=str(wrapper))) == 0
    assert log.read_text() == first  # the compiler was not run at all (not even --version)
    assert _libraries(cache) == [lib]


def test_truncated_library_is_detected_and_rebuilt(tmp_path: Path) -> None:
    assert _compiles(_child(tmp_path, 4)) == 1
    (lib,) = _libraries(tmp_path)
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 3])
    assert _compiles(_child(tmp_path, 4)) == 1
    assert lib.read_bytes() == data or lib.stat().st_size > len(data) // 3
    assert _compiles(_child(tmp_path, 4)) == 0


def test_corrupted_bytes_with_intact_size_are_detected(tmp_path: Path) -> None:
    assert _compiles(_child(tmp_path, 5)) == 1
    (lib,) = _libraries(tmp_path)
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    assert _compiles(_child(tmp_path, 5)) == 1


def test_two_processes_compiling_the_same_program_at_once_both_succeed(tmp_path: Path) -> None:
    procs = [_child(tmp_path, 6) for _ in range(2)]
    counts = [_compiles(p) for p in procs]
    assert all(c in (0, 1) for c in counts)
    (lib,) = _libraries(tmp_path)
    checksum = Path(str(lib) + ".sha256").read_text().strip()
    import hashlib

    assert hashlib.sha256(lib.read_bytes()).hexdigest() == checksum
    leftovers = [p for p in (tmp_path / "shapegrad").iterdir() if p.name.endswith((".c", ".tmp"))]
    assert leftovers == []


def test_builds_of_one_key_are_byte_identical(tmp_path: Path) -> None:
    """The compiler records the source's name in the library: sources are written under
    their key's name, so two builds agree byte for byte (and two processes publishing one
    key leave a library and checksum that agree)."""
    libraries = []
    for run in ("a", "b"):
        assert _compiles(_child(tmp_path / run, 7)) == 1
        (lib,) = _libraries(tmp_path / run)
        libraries.append(lib.read_bytes())
        assert [p.name for p in (tmp_path / run / "shapegrad").iterdir() if p.is_dir()] == []
    assert libraries[0] == libraries[1]


def test_cache_key_depends_on_source_flags_and_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    base = toolchain.make_spec("int f(void) { return 1; }\n", blas=False)
    other_src = toolchain.make_spec("int f(void) { return 2; }\n", blas=False)
    monkeypatch.setenv("SHAPEGRAD_CFLAGS", "-O1")
    other_flags = toolchain.make_spec("int f(void) { return 1; }\n", blas=False)
    assert len({base.key, other_src.key, other_flags.key}) == 3
    assert np.array(other_flags.flags).tolist() == ["-O1"]


def test_cache_dir_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native.cache_dir() == str(tmp_path / "shapegrad")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert native.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "shapegrad")


def test_tracing_the_same_function_twice_gives_identical_source() -> None:
    import shapegrad as sg
    from shapegrad.backends.c import generate

    def f(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.relu(x @ w).sum()

    x, w = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    first = generate(sg.compile(f, backend="numpy").graph(x, w))[1]
    second = generate(sg.compile(f, backend="numpy").graph(x, w))[1]
    assert first == second
