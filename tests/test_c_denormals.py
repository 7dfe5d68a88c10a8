"""``flush_denormals=True`` (C backend option and ``ScalarTrainer`` keyword): results equal
the reference except values below FLT_MIN, which become zero, on every thread of the team;
the caller's floating-point mode (and the pool threads') is restored after each call."""

from __future__ import annotations

import os
import platform
import shutil

import numpy as np
import pytest

import shapegrad as sg

pytestmark = [
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH"),
    pytest.mark.skipif(
        platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
        reason="flush-to-zero is set through MXCSR (x86-64) or FPCR (aarch64) only",
    ),
]

TINY = np.finfo(np.float32).tiny  # FLT_MIN, the smallest normal float32


def _scaled(x: sg.Tensor, s: sg.Tensor) -> sg.Tensor:
    return x * s


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    # magnitudes from 1e-30 to 1e-50: every product x * 1e-8 from normal to denormal to 0
    x = np.logspace(-30, -45, n).astype(np.float32)
    x[1::2] *= -1
    return x, np.array(1e-8, np.float32)


@pytest.mark.parametrize("n", [64, 1 << 20])  # serial, and split across the team
def test_values_below_flt_min_flush_to_zero_and_the_rest_are_unchanged(n: int) -> None:
    x, s = _inputs(n)
    plain = sg.compile(_scaled, backend="c")(sg.tensor(x), sg.tensor(s)).numpy()
    flushed = sg.compile(_scaled, backend="c", flush_denormals=True)(
        sg.tensor(x), sg.tensor(s)
    ).numpy()
    want = x * s  # NumPy on this thread: IEEE gradual underflow
    small = np.abs(want) < TINY
    assert small.any() and (want[small] != 0).any()  # the case exists
    np.testing.assert_array_equal(plain, want)
    np.testing.assert_array_equal(flushed[~small], want[~small])
    assert (flushed[small] == 0).all()


def test_denormal_inputs_read_as_zero() -> None:
    x = np.full(8, 1e-40, np.float32)  # denormal inputs
    got = sg.compile(_scaled, backend="c", flush_denormals=True)(
        sg.tensor(x), sg.tensor(np.array(1e30, np.float32))
    ).numpy()
    assert (got == 0).all()  # DAZ: 1e-40 * 1e30 would be 1e-10 without it


def test_the_callers_mode_and_the_pool_threads_are_restored() -> None:
    x, s = _inputs(1 << 20)
    flushed = sg.compile(_scaled, backend="c", flush_denormals=True)
    plain = sg.compile(lambda x, s: x * s + 0.0, backend="c")
    flushed(sg.tensor(x), sg.tensor(s))
    # this thread: NumPy still underflows gradually
    assert np.float32(1e-38) * np.float32(1e-3) != 0
    # every thread of the OpenMP pool: a plain program split across it keeps denormals
    got = plain(sg.tensor(x), sg.tensor(s)).numpy()
    np.testing.assert_array_equal(got, x * s)
    exe = flushed.lower(x, s).executable
    bound = exe.bind()
    stacked = np.stack([x, x])
    bound.run_steps(stacked, np.stack([s, s]))  # the K-step entry point restores too
    assert np.float32(1e-38) * np.float32(1e-3) != 0
    np.testing.assert_array_equal(plain(sg.tensor(x), sg.tensor(s)).numpy(), x * s)


def test_generated_code_sets_the_mode_in_every_region() -> None:
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c import COptions, generate

    x, s = _inputs(1 << 20)
    graph = sg.compile(_scaled, backend="numpy").graph(x, s)
    _, source = generate(graph, CompileOptions(backend_options=COptions(denormals="flush")))
    assert "#define SG_FLUSH_DENORMALS 1" in source
    body = source[source.index("static int sg_body(") :]
    assert body.count("#pragma omp parallel") == body.count("SG_FP_ENTER;")  # every team
    assert body.count("SG_FP_CALL_ENTER;") == 2  # sg_run, sg_run_steps: the caller's mode
    _, plain = generate(graph)
    assert "SG_FLUSH_DENORMALS 1" not in plain


def test_trainer_keyword_reaches_the_compiled_step() -> None:
    def loss(p: list[sg.Tensor], x: sg.Tensor) -> sg.Tensor:
        return ((x * p[0]) ** 2).sum()

    w = np.full(4, 2e-38, np.float32)  # normal; one SGD step takes it to 0.2 * w, denormal
    x = np.ones(4, np.float32)
    result = {}
    for flush in (False, True):
        trainer = sg.ScalarTrainer(
            loss, [w], mode="compiled", backend="c", optimizer=sg.optim.SGD(lr=0.4),
            flush_denormals=flush,
        )  # fmt: skip
        trainer.step(x)
        result[flush] = np.asarray(trainer.get_params()[0])
    want = w - np.float32(0.4) * (np.float32(2) * w)
    assert (want != 0).all() and (np.abs(want) < TINY).all()
    np.testing.assert_array_equal(result[False], want)
    np.testing.assert_array_equal(result[True], np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="flush_denormals"):
        sg.ScalarTrainer(loss, [w], mode="eager", flush_denormals=True)


def test_pool_threads_born_in_a_flushed_call_do_not_keep_flushing() -> None:
    """In a fresh process whose first parallel call is a flushed one, the OpenMP pool
    threads are created inside it and inherit FTZ/DAZ from their creator: they must leave
    with the caller's mode, or every later program silently flushes on those threads."""
    import subprocess
    import sys

    script = (
        "import numpy as np, shapegrad as sg\n"
        "x = (np.arange(1 << 20, dtype=np.float32) % 7 + 1) * np.float32(1e-33)\n"
        "s = np.full(1 << 20, 1e-5, np.float32)\n"
        "f = sg.compile(lambda x, s: x * s + 0.0, backend='c', flush_denormals=True)\n"
        "p = sg.compile(lambda x, s: x * s + 0.0, backend='c')\n"
        "f(x, s)\n"
        "got = np.asarray(p(x, s))\n"
        "assert np.array_equal(got, x * s), int(np.sum(got != x * s))\n"
    )
    env = {**os.environ, "SHAPEGRAD_NUM_THREADS": "2", "SHAPEGRAD_ADAPTIVE_THREADS": "0"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
