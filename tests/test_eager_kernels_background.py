"""Eager kernels compiled in the background (``jit/eager_kernels.py``, ``jit/background.py``).

A key's second sighting traces it and, on a disk-cache miss, queues its compile; the op
runs on NumPy until the kernel is ready, then switches. Checked here against the NumPy
path (bit for bit while on NumPy, at the op table's tolerances once on the kernel): the
switch itself (forward and VJP), a compile that fails (NumPy results, a reason), a warm
disk cache (loaded at once), two Python threads at once, a fork with a compile pending,
and an interpreter exit with a compile pending (it does not wait). Every test gets an
empty kernel cache of its own, so its compiles are real misses.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _c_unavailable, _eager_call
from op_table import CASES
from shapegrad import _fused
from shapegrad.jit import eager_kernels
from shapegrad.ops import kernels

DRAIN_S = 300.0  # a compile takes 0.2-0.5 s quiet; the shared test machine may be loaded
CASE = next(c for c in CASES if c.name == "log_softmax")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty kernel cache of the test's own (every compile is a miss)."""
    reason = _c_unavailable()
    if reason:
        pytest.skip(reason)
    folder = tmp_path / "cache"
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", str(folder))
    return folder


def _provider(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Iterator[eager_kernels.CKernels]:
    previous = kernels.installed()
    provider = eager_kernels.CKernels(background=True, workers=1, **kwargs)
    monkeypatch.setattr(_fused, "MIN_ELEMENTS", 0)
    kernels.install(provider)
    try:
        with kernels.enabled(True):
            yield provider
    finally:
        provider.drain(DRAIN_S)
        kernels.install(previous)


@pytest.fixture
def bg(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[eager_kernels.CKernels]:
    """A background provider (one worker, second sighting) over the empty cache."""
    yield from _provider(monkeypatch)


def _numpy_path(fn: Any, *args: Any) -> Any:
    with kernels.enabled(False):
        return fn(*args)


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    """The op table's float32 tolerance for the case (as test_eager_kernels checks it)."""
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=CASE.rtol32, atol=CASE.atol32 * scale)


def test_background_compile_switches_forward_and_vjp(bg: eager_kernels.CKernels) -> None:
    arrays = [a.astype(np.float32) for a in CASE.arrays()]
    (want,) = _numpy_path(_eager_call, CASE.fn, arrays)
    for sighting in (1, 2):  # the second queues the compile; both run on NumPy
        (got,) = _eager_call(CASE.fn, arrays)
        np.testing.assert_array_equal(got, want)
        assert bg.calls == 0, sighting
    assert bg.drain(DRAIN_S), bg.declined
    assert (bg.compiles, bg.cache_loads, bg.declined) == (1, 0, [])
    (got,) = _eager_call(CASE.fn, arrays)
    assert bg.calls == 1, "the call after the compile runs the kernel"
    _close(got, want)

    # a tracked call: its VJP is queued, and the call runs as written until it is ready
    x = sg.tensor(arrays[0])
    w = sg.tensor(np.random.default_rng(1).standard_normal(want.shape).astype(np.float32))

    def loss(x: sg.Tensor) -> sg.Tensor:
        return (CASE.fn(x) * w).sum()

    want_g = _numpy_path(sg.grad(loss), x).numpy()
    got_g = sg.grad(loss)(x).numpy()
    assert (bg.calls, bg.vjp_calls) == (1, 0)
    np.testing.assert_array_equal(got_g, want_g)  # the NumPy path's own gradient
    assert bg.drain(DRAIN_S), bg.declined
    got_g = sg.grad(loss)(x).numpy()
    assert (bg.calls, bg.vjp_calls) == (2, 1), "forward and VJP kernels once both are ready"
    _close(got_g, want_g)
    assert bg.declined == []


def test_tracked_key_compiles_with_its_vjp_in_one_job(
    bg: eager_kernels.CKernels,
) -> None:
    """A key first seen twice under a tape is compiled with its VJP in one job: the first
    call after it runs both kernels."""
    x = sg.tensor(np.linspace(-2, 2, 40, dtype=np.float32).reshape(5, 8))
    w = sg.tensor(np.linspace(1, 2, 40, dtype=np.float32).reshape(5, 8))

    def loss(x: sg.Tensor) -> sg.Tensor:
        return (sg.gelu(x) * w).sum()

    want = _numpy_path(sg.grad(loss), x).numpy()
    for _ in range(2):
        np.testing.assert_array_equal(sg.grad(loss)(x).numpy(), want)
    assert bg.drain(DRAIN_S) and bg.calls == 0
    np.testing.assert_allclose(sg.grad(loss)(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert (bg.calls, bg.vjp_calls, bg.compiles) == (1, 1, 1)


def test_warm_disk_cache_loads_at_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel in the disk cache is loaded by the sighting that asks (no compile, no
    waiting): a fresh provider over a cache a first one filled."""
    x = sg.tensor(np.linspace(-3, 3, 96, dtype=np.float32).reshape(8, 12))
    for provider in _provider(monkeypatch):
        sg.gelu(x), sg.gelu(x)
        assert provider.drain(DRAIN_S) and provider.compiles == 1
    for provider in _provider(monkeypatch):
        sg.gelu(x)
        got = sg.gelu(x)
        assert (provider.calls, provider.compiles, provider.cache_loads) == (1, 1, 1)
        assert provider.pending() == 0
        want = _numpy_path(sg.gelu, x)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def _fake_cc(folder: Path, compile_action: str) -> str:
    """A C compiler command that is the real one for questions (``--version``, ``-dump*``)
    and runs ``compile_action`` (shell) instead of compiling."""
    real = os.environ.get("CC", "").strip() or "cc"
    script = folder / "fake-cc"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            for a in "$@"; do
              case "$a" in --version|-dump*|-print*) exec {real} "$@";; esac
            done
            {compile_action}
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_failing_compile_keeps_numpy_and_says_why(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", _fake_cc(tmp_path, 'echo "fake-cc: no code today" >&2; exit 1'))
    for provider in _provider(monkeypatch):
        x = sg.tensor(np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10))
        want = _numpy_path(sg.softmax, x).numpy()
        outs = [sg.softmax(x).numpy() for _ in range(2)]
        assert provider.drain(DRAIN_S)
        outs += [sg.softmax(x).numpy() for _ in range(3)]
        for got in outs:
            np.testing.assert_array_equal(got, want)  # NumPy's own results, every call
        assert (provider.calls, provider.compiles) == (0, 0)
        assert provider.unavailable is None
        (reason,) = provider.declined
        assert reason.startswith("softmax: CompileError") and "no code today" in reason
        assert provider.pending() == 0  # declined for good: no second compile


def test_failing_vjp_compile_differentiates_in_python(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VJP that fails to compile (here: a compiler that refuses any VJP's source) leaves
    the forward kernel in use and the composite's Python VJP, in a plain backward pass."""
    real = os.environ.get("CC", "").strip() or "cc"
    refuse_vjps = (
        'for a in "$@"; do case "$a" in *.c) if grep -q _vjp "$a"; then '
        'echo "fake-cc: no VJPs" >&2; exit 1; fi;; esac; done; exec ' + real + ' "$@"'
    )
    monkeypatch.setenv("CC", _fake_cc(tmp_path, refuse_vjps))
    rng = np.random.default_rng(2)
    x = sg.tensor(rng.standard_normal((6, 16)).astype(np.float32))
    w = sg.tensor(rng.standard_normal((6, 16)).astype(np.float32))

    def loss(x: sg.Tensor) -> sg.Tensor:
        return (sg.layer_norm(x) * w).sum()

    want = _numpy_path(sg.grad(loss), x).numpy()
    for provider in _provider(monkeypatch):
        for _ in range(2):
            sg.grad(loss)(x)
        assert provider.drain(DRAIN_S)
        got = [sg.grad(loss)(x).numpy() for _ in range(2)]
        assert (provider.calls, provider.vjp_calls, provider.compiles) == (2, 0, 1)
        (reason,) = provider.declined
        assert reason.startswith("layer_norm_vjp: CompileError") and "no VJPs" in reason
        for g in got:
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_composites_inside_a_compiling_one_are_not_compiled(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cross_entropy calls log_softmax: while cross_entropy's own kernel compiles (here a
    compiler that waits for a gate), it runs as written with kernels off, so log_softmax
    gets no sightings and no kernel of its own."""
    real = os.environ.get("CC", "").strip() or "cc"
    gate = tmp_path / "gate"
    monkeypatch.setenv(
        "CC", _fake_cc(tmp_path, f'while [ ! -e "{gate}" ]; do sleep 0.02; done; exec {real} "$@"')
    )
    logits = sg.tensor(np.linspace(-3, 3, 48, dtype=np.float32).reshape(8, 6))
    labels = sg.tensor(np.arange(8, dtype=np.int32) % 6)
    want = _numpy_path(sg.cross_entropy, logits, labels).numpy()
    for provider in _provider(monkeypatch):
        for _ in range(5):  # sighting 2 queues the compile, which waits for the gate
            np.testing.assert_array_equal(sg.cross_entropy(logits, labels).numpy(), want)
        assert provider.pending() == 1
        gate.touch()
        assert provider.drain(DRAIN_S)
        got = sg.cross_entropy(logits, labels).numpy()
        assert (provider.compiles, provider.calls, provider.declined) == (1, 1, [])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_two_python_threads_share_the_provider(bg: eager_kernels.CKernels) -> None:
    """Two threads run the same keys (and one key of their own) forward and backward while
    compiles finish in the background; every result equals the NumPy path's."""
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((16, 24)).astype(np.float32)
    own = [rng.standard_normal((8 + k, 24)).astype(np.float32) for k in range(2)]

    def loss(x: sg.Tensor) -> sg.Tensor:
        return (sg.layer_norm(sg.gelu(x)) * sg.softmax(x)).sum()

    vg = sg.value_and_grad(loss)
    wants = {id(a): _numpy_path(vg, sg.tensor(a)) for a in [shared, *own]}
    failures: list[str] = []

    def work(k: int, steps: int, start: threading.Barrier) -> None:
        try:
            start.wait()
            for _ in range(steps):
                for a in (shared, own[k]):
                    value, grad = vg(sg.tensor(a))
                    want_v, want_g = wants[id(a)]
                    np.testing.assert_allclose(value.numpy(), want_v.numpy(), rtol=1e-4)
                    np.testing.assert_allclose(grad.numpy(), want_g.numpy(), rtol=1e-4, atol=1e-5)
        except Exception as exc:  # reported by the main thread
            failures.append(f"thread {k}: {exc!r}")

    def both(steps: int) -> None:
        start = threading.Barrier(2)
        threads = [threading.Thread(target=work, args=(k, steps, start)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures

    both(6)  # forward kernels queued at the second sighting, maybe ready midway
    assert bg.drain(DRAIN_S)
    both(2)  # every forward on its kernel; their VJPs queued (unless already)
    assert bg.drain(DRAIN_S)
    calls, vjp_calls = bg.calls, bg.vjp_calls
    both(2)  # every forward and VJP on its kernel
    assert bg.declined == []
    # 3 composites at 3 shapes; each key compiled once however many threads asked
    assert bg.compiles == 9, bg.compiles
    assert bg.calls - calls == 2 * 2 * 2 * 3 and bg.vjp_calls - vjp_calls == 2 * 2 * 2 * 3


def _run_script(code: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


SLOW_COMPILE = """
import os, time
import numpy as np, shapegrad as sg
from shapegrad.jit import eager_kernels
p = eager_kernels.installed()
x = sg.tensor(np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64))
want = sg.log_softmax(x).numpy()   # sighting 1
got = sg.log_softmax(x).numpy()    # sighting 2: queued; the fake compiler sleeps
assert np.array_equal(got, want) and p.calls == 0
deadline = time.monotonic() + 60
def compilers_started(n):  # the fake compiler's processes write their pids
    while not os.path.exists(os.environ["PID_FILE"]) or len(open(os.environ["PID_FILE"]).read().split()) < n:
        assert time.monotonic() < deadline, "the background compile never started"
        time.sleep(0.05)
compilers_started(1)
assert p.pending() == 1
"""


def _slow_cc_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    pid_file = tmp_path / "cc.pids"  # one line per fake compiler process started
    cc = _fake_cc(tmp_path, f'echo $$ >> "{pid_file}"; exec sleep 60')
    env = {
        **os.environ,
        "CC": cc,
        "PID_FILE": str(pid_file),
        "SHAPEGRAD_CACHE_DIR": str(tmp_path / "cache"),
        kernels.ENV: "1",
    }
    return env, pid_file


def _end_fake_compilers(pid_file: Path) -> None:
    """The sleeping fake compilers outlive the script that started them: end them (by pid)."""
    if pid_file.exists():
        for line in pid_file.read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line), 9)


def test_exit_with_a_pending_compile_does_not_wait(tmp_path: Path) -> None:
    if _c_unavailable():
        pytest.skip(_c_unavailable() or "")
    env, pid_file = _slow_cc_env(tmp_path)
    t0 = time.monotonic()
    try:
        out = _run_script(SLOW_COMPILE + "print('exiting')\n", env, timeout=90)
    finally:
        _end_fake_compilers(pid_file)
    took = time.monotonic() - t0
    assert out.returncode == 0 and out.stdout.split() == ["exiting"], out.stdout + out.stderr
    assert took < 45, f"exit waited for the pending compile ({took:.1f} s; it sleeps 60 s)"


def test_fork_with_a_pending_compile(tmp_path: Path) -> None:
    """The child has no compiler thread: it forgets the parent's pending compile (no lock
    left held), keeps computing on NumPy, and may queue compiles of its own."""
    if _c_unavailable() or not hasattr(os, "fork"):
        pytest.skip(_c_unavailable() or "no os.fork")
    env, pid_file = _slow_cc_env(tmp_path)
    child = """
pid = os.fork()
if pid == 0:
    ok = p.pending() == 0 and p.drain(timeout=5)
    ok = ok and all(np.array_equal(sg.log_softmax(x).numpy(), want) for _ in range(2))
    ok = ok and p.pending() == 1  # the child asked again: a compile of its own queued
    compilers_started(2)  # (so that the test ends it)
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""
    try:
        out = _run_script(SLOW_COMPILE + child, env, timeout=90)
    finally:
        _end_fake_compilers(pid_file)
    assert out.returncode == 0 and out.stdout.split() == ["child", "0"], out.stdout + out.stderr
