"""The C backend against a gcc 12.2 wrong-code bug (issue 26).

Under ``-fassociative-math`` gcc 12.2 turned a fully unrolled small sum of products into a
basic-block SLP reduction in a permuted lane order and permuted only some of its operands:
two of them were vectors forwarded from an earlier kernel (exp) through the arena. The
program is defined C; see ``tests/data/gcc12_slp_reduction_miscompile.c`` and
docs/DESIGN.md (known debts). The renderer now opens every kernel block with a
compiler-only memory fence (``kernel_render.KERNEL_FENCE``), so no kernel receives another's
registers.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c import generate
from shapegrad.backends.c.kernel_render import KERNEL_FENCE
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


def _fenced(source: str) -> str:
    """The repro with the renderer's fence opening each kernel block, as render.py emits it."""
    opening = re.compile(r"(    /\* k\d+: root [^\n]*\n(?:    /\*   inlined[^\n]*\n)?    \{\n)")
    fenced, count = opening.subn(lambda m: m.group(1) + "        " + KERNEL_FENCE + "\n", source)
    assert count == 7, count  # the repro's kernels k1, k2, k4, k5, k6, k7, k9
    return fenced


def _run_repro(source: str, tmp_path: Path) -> list[float]:
    src, exe = tmp_path / "repro.c", tmp_path / "repro"
    src.write_text(source)
    flags = shlex.split(DEFAULT_CFLAGS)
    subprocess.run([compiler(), *flags, "-o", str(exe), str(src), "-lm"], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [float(v) for v in out.split()]


@pytest.mark.skipif(shutil.which(compiler()) is None, reason="no C compiler ($CC or cc)")
def test_reduced_gcc12_repro_is_right_with_kernel_fences(tmp_path: Path) -> None:
    """The reduced program, fenced as the renderer fences kernels and built with the
    backend's default flags, prints the -O0 answer. Unfenced, gcc 12.2 on x86-64 (AVX2 or
    AVX-512) prints t27[9] = -1.5632475057869157; other compilers may get it right anyway."""
    got = _run_repro(_fenced(REPRO.read_text()), tmp_path)
    np.testing.assert_allclose(got, [-1.1919463586369721, 0.19635577993896336], rtol=1e-12)


def test_rendered_kernels_open_with_the_fence() -> None:
    """Every kernel block of a rendered program starts with the fence."""
    x = sg.tensor(np.ones((2, 4, 3), np.float64))
    graph = sg.compile(lambda a: sg.softmax(a, axis=1).sum(axis=2) * 2.0, backend="numpy").graph(x)
    _, source = generate(graph)
    kernels = re.findall(r"/\* k\d+: root", source)
    assert len(kernels) >= 2 and source.count(KERNEL_FENCE) == len(kernels)
