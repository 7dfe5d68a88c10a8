"""The C backend's default flags against a gcc 12.2 wrong-code bug (issue 26).

Under ``-fassociative-math`` gcc 12.2 turns a fully unrolled small sum of products into a
basic-block SLP reduction in a permuted lane order and permutes only some of its operands
(one operand was a vector forwarded from an earlier kernel through the arena). The
program is defined C; see ``tests/data/gcc12_slp_reduction_miscompile.c`` and
docs/DESIGN.md (known debts). ``DEFAULT_CFLAGS`` no longer has ``-fassociative-math``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c.toolchain import DEFAULT_CFLAGS, compiler

REPRO = Path(__file__).parent / "data" / "gcc12_slp_reduction_miscompile.c"


def _ce_jvp_both(shape: tuple[int, ...], axis: int, seed: int) -> tuple[np.ndarray, ...]:
    """(eager value, eager tangent, C value, C tangent) of the jvp of cross_entropy."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    classes = shape[axis]
    label_shape = shape[:axis] + shape[axis + 1 :]
    y = sg.tensor(rng.integers(0, classes, label_shape).astype(np.int32))
    t = rng.standard_normal(shape)

    def f(a: sg.Tensor, b: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return sg.jvp(lambda z: sg.cross_entropy(z, y, axis=axis), (a,), (b,))

    args = (sg.tensor(x, dtype="float64"), sg.tensor(t, dtype="float64"))
    ev, et = f(*args)
    cv, ct = sg.compile(f, backend="c")(*args)
    return ev.numpy(), et.numpy(), cv.numpy(), ct.numpy()


def test_cross_entropy_nd_jvp_in_c_matches_eager() -> None:
    """The exact program of the report: [2, 4, 3, 2] float64, classes on axis 1, the
    inputs of /tmp/x26_gcc_miscompile_run.py. Under the old flags the C tangent was
    -0.04264 against eager's -0.03493."""
    ev, et, cv, ct = _ce_jvp_both((2, 4, 3, 2), 1, 1)
    np.testing.assert_allclose(et, -0.03492752460740719, rtol=1e-12)  # eager, pinned
    np.testing.assert_allclose(cv, ev, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ct, et, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "shape,axis,seed",
    [((2, 4, 3, 2), 1, 2), ((3, 5, 2), 1, 3), ((2, 3, 4, 2), 2, 4), ((4, 2, 6), 1, 5)],
)
def test_cross_entropy_jvp_over_a_middle_axis_in_c(
    shape: tuple[int, ...], axis: int, seed: int
) -> None:
    """The same bug class (exp kernel, then small unrolled row sums of products that reuse
    its result) on other shapes and data."""
    ev, et, cv, ct = _ce_jvp_both(shape, axis, seed)
    np.testing.assert_allclose(cv, ev, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ct, et, rtol=1e-12, atol=1e-15)


@pytest.mark.skipif(shutil.which(compiler()) is None, reason="no C compiler ($CC or cc)")
def test_reduced_gcc12_repro_is_right_under_default_cflags(tmp_path: Path) -> None:
    """The reduced program, built with the backend's default flags, prints the -O0 answer.
    With ``-fassociative-math`` added, gcc 12.2 on x86-64 (AVX2 or AVX-512) prints
    t27[9] = -1.5632475057869157; other compilers/targets may pass either way."""
    exe = tmp_path / "repro"
    flags = shlex.split(DEFAULT_CFLAGS)
    subprocess.run([compiler(), *flags, "-o", str(exe), str(REPRO), "-lm"], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = [float(v) for v in out.split()]
    np.testing.assert_allclose(got, [-1.1919463586369721, 0.19635577993896336], rtol=1e-12)
    assert "-fassociative-math" not in flags
