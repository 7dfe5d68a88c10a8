"""The C backend: contractions (BLAS and loops), safety checks, errors, debug dumps, sanitizers.

The whole op table also runs in "c" mode through tests/test_ops.py (tests/modes.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import BackendUnavailable, CompileOptions
from shapegrad.backends.c import CBackend, CompileError, generate

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
ROOT = Path(__file__).resolve().parents[1]


def _f(*shape: int, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


SPECS = [
    ("ij,jk->ik", (5, 7), (7, 3)),
    ("ij,kj->ik", (5, 7), (3, 7)),  # B transposed
    ("ji,jk->ik", (7, 5), (7, 3)),  # A transposed
    ("ij,jk->ki", (5, 7), (7, 3)),  # output transposed: roles swapped
    ("bij,bjk->bik", (2, 5, 7), (2, 7, 3)),
    ("ij,bjk->bik", (5, 7), (2, 7, 3)),  # broadcast batch
    ("bohw,bckhw->ock", (2, 3, 4, 5), (2, 2, 3, 4, 5)),  # conv weight gradient: packs g
    ("abc,cd->abd", (2, 3, 4), (4, 6)),  # grouped m letters
]


@pytest.mark.parametrize("contract_min", [0, 10**9], ids=["blas", "loops"])
@pytest.mark.parametrize(("spec", "sa", "sb"), SPECS, ids=[s[0] for s in SPECS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_contractions_match_numpy(
    spec: str, sa: tuple[int, ...], sb: tuple[int, ...], contract_min: int, dtype: type
) -> None:
    a, b = _f(*sa, dtype=dtype), _f(*sb, seed=1, dtype=dtype)
    fn = sg.compile(lambda x, y: sg.einsum(spec, x, y), backend="c", contract_min=contract_min)
    got = fn(a, b).numpy()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, np.einsum(spec, a, b), rtol=tol * 10, atol=tol * 10)


def test_blas_is_used_for_large_matmuls_and_loops_for_small() -> None:
    big = sg.compile(lambda x, y: x @ y, backend="c").graph(_f(128, 256), _f(256, 64))
    small = sg.compile(lambda x, y: x @ y, backend="c").graph(_f(10, 16), _f(16, 16))
    assert "gemm" in generate(big)[1]
    assert "gemm" not in generate(small)[1]


def test_wrong_shape_dtype_and_layout_are_rejected_before_native_code() -> None:
    fn = sg.compile(lambda x: x * 2.0, backend="c")
    fn(_f(3, 4))
    exe = fn.lower(_f(3, 4)).executable
    with pytest.raises(sg.ShapeError, match="shape"):
        exe([_f(4, 3)])
    with pytest.raises(sg.DTypeError):
        exe([_f(3, 4, dtype=np.float64)])
    with pytest.raises(ValueError, match="contiguous"):
        exe([_f(4, 3).T])
    step = exe.bind()
    with pytest.raises(sg.ShapeError, match="shape"):
        step(_f(4, 3))


def test_gather_index_out_of_range_is_an_error_not_a_crash() -> None:
    fn = sg.compile(lambda x, i: sg.functional.take(x, i, axis=0), backend="c")
    x = _f(5, 3)
    ok = fn(x, np.array([0, 4, -1], np.int32)).numpy()
    np.testing.assert_array_equal(ok, x[[0, 4, -1]])
    with pytest.raises(IndexError, match="out of range"):
        fn(x, np.array([0, 5], np.int32))
    with pytest.raises(IndexError, match="out of range"):
        fn(x, np.array([-6], np.int32))


def test_missing_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    ok, reason = CBackend().is_available()
    assert not ok and "numpy" in reason and "install" in reason.lower()
    graph = sg.compile(lambda x: x + 1.0, backend="numpy").graph(_f(3))
    with pytest.raises(BackendUnavailable, match="numpy"):
        CBackend().compile(graph, CompileOptions(name="nocc"))


def test_compiler_errors_show_source_path_and_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SHAPEGRAD_CFLAGS", "-O2 -fno-such-flag-for-shapegrad")
    graph = sg.compile(lambda x: x + 1.0, backend="numpy").graph(_f(3))
    with pytest.raises(CompileError) as info:
        CBackend().compile(graph, CompileOptions(name="bad"))
    text = str(info.value)
    assert ".c" in text and "no-such-flag" in text
    path = next(p for p in text.split() if p.endswith(".c"))
    assert Path(path).exists()


def test_debug_dir_gets_loop_ir_and_c_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path))
    fn = sg.compile(lambda x, w: sg.relu(x @ w), backend="c", name="dumped")
    fn(_f(2, 3), _f(3, 4))
    loops = list(tmp_path.rglob("dumped.loops.txt"))
    sources = list(tmp_path.rglob("dumped.c"))
    assert loops and sources
    assert "kernel k0" in loops[0].read_text() and "sg_body" in sources[0].read_text()


def test_k_steps_in_one_call_equal_k_single_calls() -> None:
    def step(w: sg.Tensor, x: sg.Tensor, y: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        loss, g = sg.value_and_grad(lambda w: ((x @ w - y) ** 2).mean())(w)
        return w - 0.05 * g, loss

    w0, xs, ys = _f(3, 2), _f(7, 5, 3, seed=1), _f(7, 5, 2, seed=2)
    fn = sg.compile(step, backend="c", donate_argnums=0)
    exe = fn.lower(w0, xs[0], ys[0]).executable
    single = exe.bind([w0])
    losses = [float(single(xs[t], ys[t])[0]) for t in range(7)]
    multi = exe.bind([w0])
    (stacked,) = multi.run_steps(xs, ys)
    np.testing.assert_array_equal(stacked, np.array(losses, np.float32))
    np.testing.assert_array_equal(multi.state[0], single.state[0])
    # and both equal the protocol call path (which never mutates its arguments)
    w = w0.copy()
    for t in range(7):
        w, loss = (a for a in exe([w, xs[t], ys[t]]))
        assert float(loss) == losses[t]
    np.testing.assert_array_equal(w, single.state[0])


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SHAPEGRAD_SANITIZE") != "1",
    reason="opt-in (~5 min): SHAPEGRAD_SANITIZE=1 pytest -m slow tests/test_c_backend.py",
)
def test_op_table_under_address_and_undefined_behaviour_sanitizers(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc is not None
    libasan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True)
    if not os.path.isabs(libasan.stdout.strip()):
        pytest.skip("compiler has no libasan")
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=libasan.stdout.strip(),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        SHAPEGRAD_CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined "
        "-fno-sanitize-recover=undefined",
        XDG_CACHE_HOME=str(tmp_path),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests" / "test_ops.py"),
        "-k",
        "c]",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=3000)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert "ERROR: AddressSanitizer" not in tail and "runtime error" not in tail


def test_conv_weight_gradient_uses_accumulating_products_not_a_packed_copy() -> None:
    g, cols = _f(2, 3, 4, 5), _f(2, 2, 3, 4, 5, seed=1)
    fn = sg.compile(lambda a, b: sg.einsum("bohw,bckhw->ock", a, b), backend="c", contract_min=0)
    exe = fn.lower(g, cols).executable
    (kernel,) = exe.program.kernels
    (contract,) = kernel.body
    assert contract.sum_batch == 2 and contract.k == 20
    np.testing.assert_allclose(exe([g, cols])[0], np.einsum("bohw,bckhw->ock", g, cols), rtol=1e-5)


def test_parallel_loops_give_the_same_result_with_two_threads() -> None:
    x = _f(256, 1024)
    fn = sg.compile(lambda x: (sg.tanh(x) * 2.0 + 1.0).sum(axis=1), backend="c")
    exe = fn.lower(x).executable
    from shapegrad.backends.c.render import render_c

    assert "#pragma omp for schedule(dynamic" in render_c(exe.program)
    want = (np.tanh(x.astype(np.float64)) * 2 + 1).sum(axis=1)
    for threads in (2, 1):
        exe.lib.sg_set_threads(threads, 0)
        np.testing.assert_allclose(exe([x])[0], want, rtol=1e-4)


def test_mixing_protocol_calls_and_bound_calls_keeps_results_apart() -> None:
    fn = sg.compile(lambda x: x * 2.0, backend="c")
    x1, x2 = _f(3), _f(3, seed=1)
    exe = fn.lower(x1).executable
    step = exe.bind()
    (first,) = step(x1)
    np.testing.assert_array_equal(first, x1 * 2)
    (fresh,) = exe([x2])
    np.testing.assert_array_equal(fresh, x2 * 2)
    (again,) = step(x1)  # same x1 object: must not reuse the protocol call's input pointer
    np.testing.assert_array_equal(again, x1 * 2)
    np.testing.assert_array_equal(fresh, x2 * 2)  # the protocol result was not overwritten


@pytest.mark.parametrize("spec", ["ij,jk->ik", "ji,jk->ik", "bij,bjk->bik"])
def test_large_products_split_across_threads_match_numpy(spec: str) -> None:
    shapes = {"ij,jk->ik": ((130, 70), (70, 120)), "ji,jk->ik": ((70, 130), (70, 120))}
    sa, sb = shapes.get(spec, ((3, 101, 64), (3, 64, 90)))
    a, b = _f(*sa), _f(*sb, seed=1)
    fn = sg.compile(lambda x, y: sg.einsum(spec, x, y), backend="c")
    exe = fn.lower(a, b).executable
    from shapegrad.backends.c.render import render_c

    assert "part * " in render_c(exe.program)  # the row-block split
    for threads in (2, 3, 1):
        exe.lib.sg_set_threads(threads, 0)
        np.testing.assert_allclose(exe([a, b])[0], np.einsum(spec, a, b), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("batch_gemm", ["blas", "auto"])
def test_many_large_products_run_in_parallel_over_the_batch(
    batch_gemm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole products per thread: a loop of library calls, or (``$SHAPEGRAD_BATCH_GEMM``,
    ``backends/c/batch_gemm.py``) one ``sg_sgemm_batch`` call that shares them out."""
    monkeypatch.setenv("SHAPEGRAD_BATCH_GEMM", batch_gemm)
    a, b = _f(10, 64, 48), _f(10, 48, 70, seed=1)
    fn = sg.compile(lambda x, y: x @ y, backend="c", name=f"batch_{batch_gemm}")
    exe = fn.lower(a, b).executable
    from shapegrad.backends.c.render import render_c

    source = render_c(exe.program)
    split = "for (int64_t bi = 0; bi < 10; ++bi)" if batch_gemm == "blas" else "sg_sgemm_batch(1,"
    assert split in source and "part * " not in source
    for threads in (2, 1):
        exe.lib.sg_set_threads(threads, 0)
        np.testing.assert_allclose(exe([a, b])[0], a @ b, rtol=2e-5, atol=2e-5)


def test_sgd_update_of_a_product_is_one_accumulating_library_call() -> None:
    w, x, g = _f(70, 40), _f(128, 70, seed=1), _f(128, 40, seed=2)

    def step(w: sg.Tensor, x: sg.Tensor, g: sg.Tensor) -> sg.Tensor:
        return w - 0.05 * sg.einsum("bi,bo->io", x, g)

    fn = sg.compile(step, backend="c", donate_argnums=0)
    exe = fn.lower(w, x, g).executable
    from shapegrad.compiler import loops as L

    calls = [s for k in exe.program.kernels for s in k.body if isinstance(s, L.Contract)]
    assert [(c.alpha, c.beta) for c in calls] == [(pytest.approx(-0.05), 1.0)]
    assert len(exe.program.kernels) == 1  # no product temp, no separate update pass
    want = w.astype(np.float64) - 0.05 * (x.astype(np.float64).T @ g)
    bound = exe.bind([w])
    bound(x, g)
    np.testing.assert_allclose(bound.state[0], want, rtol=1e-5, atol=1e-5)
    bound(x, g)  # the state was updated in place: a second step applies it again
    twice = want - 0.05 * (x.astype(np.float64).T @ g)
    np.testing.assert_allclose(bound.state[0], twice, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("donate", [False, True])
def test_large_sum_of_products_split_over_the_summed_axis_matches_numpy(donate: bool) -> None:
    g, cols, w = _f(8, 16, 16, 16), _f(8, 8, 9, 16, 16, seed=1), _f(16, 8, 9, seed=2)
    spec = "bohw,bckhw->ock"

    def plain(g: sg.Tensor, cols: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.einsum(spec, g, cols)

    def update(g: sg.Tensor, cols: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return w - 0.5 * sg.einsum(spec, g, cols)  # beta = 1: partials add onto w

    fn = sg.compile(update if donate else plain, backend="c")
    exe = fn.lower(g, cols, w).executable
    from shapegrad.backends.c.render import render_c

    assert "omp barrier" in render_c(exe.program)
    product = np.einsum(spec, g.astype(np.float64), cols)
    want = w - 0.5 * product if donate else product
    for threads in (2, 3, 1):
        exe.lib.sg_set_threads(threads, 0)
        np.testing.assert_allclose(exe([g, cols, w])[0], want, rtol=2e-5, atol=2e-4)


def test_large_im2col_patches_are_built_per_image_inside_the_products() -> None:
    import shapegrad.functional as F

    def conv_loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        xp = F.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = F.stack([xp[:, :, i : i + 20, j : j + 20] for i in range(3) for j in range(3)], 2)
        out = F.einsum("bckhw,ock->bohw", cols, w)
        return (sg.relu(out) * out).sum()

    w, x = _f(8, 16, 9) * 0.2, _f(6, 16, 20, 20, seed=1)
    step = sg.value_and_grad(conv_loss, argnums=(0, 1))
    exe = sg.compile(step, backend="c").lower(w, x).executable
    from shapegrad.compiler import loops as L

    fused = [s for k in exe.program.kernels for s in k.body if isinstance(s, L.BatchFused)]
    # patches rebuilt per image for the forward product and the weight gradient; the
    # input gradient's patch gradient is consumed (col2im) per image right after its product
    assert sorted((f.operand, f.contract.sum_batch) for f in fused) == [
        ("b", 1),
        ("b", 6),
        ("c", 1),
    ]
    value, (gw, gx) = step(sg.tensor(w), sg.tensor(x))
    for threads in (2, 3, 1):
        exe.lib.sg_set_threads(threads, 0)
        got_value, got_gw, got_gx = exe([w, x])
        np.testing.assert_allclose(got_value, value.numpy(), rtol=1e-4)
        np.testing.assert_allclose(got_gw, gw.numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(got_gx, gx.numpy(), rtol=1e-4, atol=1e-4)


def test_pad_rows_are_split_into_range_loops_without_per_element_tests() -> None:
    import shapegrad.functional as F

    x = _f(3, 5, 7)
    pads = ((0, 0), (2, 1), (3, 0))
    fn = sg.compile(lambda x: F.pad(sg.relu(x) + 1.0, pads), backend="c")
    exe = fn.lower(x).executable
    from shapegrad.backends.c.render import render_c

    source = render_c(exe.program)
    # each padded axis runs as segments (the window of the last axis is its own loop)
    # on which the range tests are constant: none is left in the generated code
    assert re.search(r"for \(int64_t (\w+) = 3; \1 < 10; \+\+\1\)", source)
    assert "0 <= (" not in source.split("sg_body")[1]
    np.testing.assert_array_equal(exe([x])[0], np.pad(np.maximum(x, 0) + 1.0, pads))
