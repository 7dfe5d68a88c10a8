"""One OpenMP region per step (``backends/c/schedule.py``): the generated structure, results
against NumPy with one and two threads, barriers only where data flows, arena aliasing,
and the error-flag contract (first failing check's code, rest skipped) inside the region."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c import generate
from shapegrad.backends.c.schedule import Tracker
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import C_TARGET
from shapegrad.dtypes import float32

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _graph(fn, *args, **kw):  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy").graph(*args)


def _body(source: str) -> str:
    start = source.index("static int sg_body(")
    return source[start : source.index("\n}\n", start)]


def _mlp_step(w1: sg.Tensor, w2: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
    def loss(w1: sg.Tensor, w2: sg.Tensor) -> sg.Tensor:
        return ((sg.relu(x @ w1) @ w2) ** 2).mean()

    value, (g1, g2) = sg.value_and_grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.01 * g1, w2 - 0.01 * g2, value


def test_a_step_is_one_region_with_orphaned_work_sharing() -> None:
    args = (_f32(256, 512), _f32(512, 64, seed=1), _f32(128, 256, seed=2))
    _, source = generate(_graph(_mlp_step, *args))
    body = _body(source)
    assert body.count("#pragma omp parallel") == 1
    assert "#pragma omp parallel for" not in body
    assert "#pragma omp for schedule(dynamic, 1) nowait" in body  # the split products
    assert "#pragma omp single nowait" in body


def test_small_programs_open_no_region() -> None:
    _, source = generate(_graph(lambda x: sg.tanh(x) * 2.0, _f32(10, 16)))
    assert "#pragma omp" not in _body(source)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_mlp_step_matches_numpy_at_any_team_size(threads: int) -> None:
    args = (_f32(256, 512), _f32(512, 64, seed=1), _f32(128, 256, seed=2))
    exe = sg.compile(_mlp_step, backend="c").lower(*args).executable
    exe.lib.sg_set_threads(threads, 0)
    try:
        got = exe(list(args))
    finally:
        exe.lib.sg_set_threads(2, 1)
    w1, w2, x = (a.astype(np.float64) for a in args)
    h = np.maximum(x @ w1, 0)
    out = h @ w2
    g_out = 2 * out / out.size
    g2 = h.T @ g_out
    g1 = x.T @ ((g_out @ w2.T) * (h > 0))
    np.testing.assert_allclose(got[0], w1 - 0.01 * g1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], w2 - 0.01 * g2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], (out**2).mean(), rtol=1e-4)


def _conv_step(w: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    return sg.value_and_grad(lambda w: (sg.relu(sg.conv2d(x, w, padding=1)) ** 2).mean())(w)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("case", ["mlp", "conv"])
def test_results_depend_on_the_thread_count_not_on_the_team_that_ran(
    threads: int, case: str
) -> None:
    """Blocks of split products and groups of summed partials are cut by the configured
    thread count, so a call that ran on one thread (the adaptive choice on a busy machine)
    gives the same bits as one that ran on the full team, run after run."""
    if case == "mlp":
        fn, args = _mlp_step, (_f32(256, 512), _f32(512, 64, seed=1), _f32(128, 256, seed=2))
    else:  # the weight gradient is a sum of products split over the batch
        fn, args = _conv_step, (_f32(32, 16, 3, 3), _f32(16, 16, 24, 24, seed=1))
    exe = sg.compile(fn, backend="c").lower(*args).executable
    results = []
    try:
        for policy in (0, 2, 0, 1, 2):  # full team, one thread, ..., adaptive
            exe.lib.sg_set_threads(threads, policy)
            results.append(exe(list(args)))
    finally:
        exe.lib.sg_set_threads(2, 1)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    if case == "conv":
        source = generate(_graph(fn, *args))[1]
        assert "const int ng = " in source  # the grouped sum is in the program


def test_independent_kernels_share_no_barrier_dependent_ones_do() -> None:
    def two(x: sg.Tensor, y: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return sg.tanh(x) * 2.0, sg.tanh(y) * 3.0

    def chain(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.tanh(x) @ w

    x, y = _f32(512, 1024), _f32(300, 1024, seed=1)  # other shapes: two loop nests
    body = _body(generate(_graph(two, x, y))[1])
    assert body.count("#pragma omp for") == 2 and "#pragma omp barrier" not in body
    got = sg.compile(two, backend="c")(sg.tensor(x), sg.tensor(y))
    np.testing.assert_allclose(got[0].numpy(), np.tanh(x) * 2, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got[1].numpy(), np.tanh(y) * 3, rtol=2e-6, atol=2e-6)
    w = _f32(1024, 64, seed=2)
    body = _body(generate(_graph(chain, x, w))[1])
    assert body.count("#pragma omp for") == 2 and body.count("#pragma omp barrier") == 1
    want = np.tanh(x.astype(np.float64)) @ w
    got1 = sg.compile(chain, backend="c")(sg.tensor(x), sg.tensor(w)).numpy()
    np.testing.assert_allclose(got1, want, rtol=1e-4, atol=1e-4)


def test_temps_sharing_arena_bytes_need_a_barrier() -> None:
    buffers = {
        "t1": L.BufferSpec("t1", float32, 100, "temp", offset=0),
        "t2": L.BufferSpec("t2", float32, 100, "temp", offset=256),
        "t3": L.BufferSpec("t3", float32, 100, "temp", offset=512),
        "in0": L.BufferSpec("in0", float32, 100, "input", slot=0),
    }
    tracker = Tracker(L.Program("p", buffers, []))
    tracker.add({"in0"}, {"t1"})
    assert not tracker.needs_barrier({"in0"}, {"t3"})  # bytes 512.. are untouched
    assert tracker.needs_barrier({"in0"}, {"t2"})  # t1 spans bytes 0..400: write after write
    assert tracker.needs_barrier({"t1"}, set())  # read after write
    assert tracker.needs_barrier(set(), {"in0"})  # write after read


def _gather_step(table: sg.Tensor, w: sg.Tensor, idx: sg.Tensor):  # type: ignore[no-untyped-def]
    def loss(table: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (sg.tanh(sg.take(table, idx, axis=0) @ w) ** 2).mean()

    value, (gt, gw) = sg.value_and_grad(loss, argnums=(0, 1))(table, w)
    return table - 0.1 * gt, w - 0.1 * gw, value


@pytest.mark.parametrize("hoisted", [True, False])
def test_out_of_range_index_inside_the_region_names_the_step(hoisted: bool) -> None:
    target = (
        C_TARGET if hoisted else C_TARGET.replace(skip_stages=frozenset({"hoist_bounds_checks"}))
    )
    table, w = _f32(64, 256), _f32(256, 256, seed=1)
    rng = np.random.default_rng(3)
    good = rng.integers(0, 64, (4, 256)).astype(np.int32)
    bad = good.copy()
    bad[2, 17] = 64  # step 2 of 4 is out of range
    fn = sg.compile(_gather_step, backend="c", donate_argnums=(0, 1), target=target)
    exe = fn.lower(table, w, good[0]).executable
    assert (
        _body(generate(_graph(_gather_step, table, w, good[0]))[1]).count("#pragma omp parallel")
        == 1
    )
    reference = exe.bind([table, w])
    reference.run_steps(good[:2])
    expected = [s.copy() for s in reference.state]
    bound = exe.bind([table, w])
    with pytest.raises(IndexError, match=r"at step 2 of 4 \(steps 0\.\.1 were applied"):
        bound.run_steps(bad)
    if hoisted:  # checked before any kernel: step 2 changed nothing
        for got, want in zip(bound.state, expected, strict=True):
            np.testing.assert_array_equal(got, want)
    bound = exe.bind([table, w])
    bound.run_steps(good)  # still usable; and equal to the reference's four steps
    reference.run_steps(good[2:])
    for got, want in zip(bound.state, reference.state, strict=True):
        np.testing.assert_array_equal(got, want)


def test_first_failing_check_wins_inside_the_region() -> None:
    def f(a: sg.Tensor, b: sg.Tensor, i: sg.Tensor, j: sg.Tensor) -> sg.Tensor:
        big = sg.tanh(a @ b)  # a shared unit between the two gathers
        return sg.take(a, i, axis=0).sum() + (big * sg.take(b, j, axis=0).sum()).sum()

    target = C_TARGET.replace(skip_stages=frozenset({"hoist_bounds_checks"}))
    a, b = _f32(256, 256), _f32(256, 256, seed=1)
    i, j = np.array([1, 2], np.int32), np.array([3, 4], np.int32)
    exe = sg.compile(f, backend="c", target=target).lower(a, b, i, j).executable
    body = _body(generate(_graph(f, a, b, i, j))[1])
    assert body.count("#pragma omp parallel") == 1
    codes = {message: code for code, message in exe.program.errors.items()}
    assert len(codes) == 2
    bad_i, bad_j = np.array([1, 999], np.int32), np.array([3, 999], np.int32)
    rcs = []
    for args in ([a, b, bad_i, j], [a, b, i, bad_j], [a, b, bad_i, bad_j]):
        with pytest.raises(IndexError) as info:
            exe(args)
        rcs.append(str(info.value))
    order = [
        s.code for k in exe.program.kernels for s in L.walk(k.body) if isinstance(s, L.CheckBounds)
    ]
    assert len(set(order)) == 2 and rcs[0] != rcs[1]
    # both out of range: the code of the check that runs first in program order
    first_is_i = exe.program.errors[order[0]] in rcs[0]
    assert rcs[2] == (rcs[0] if first_is_i else rcs[1])
    got = exe([a, b, i, j])[0]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64[i].sum() + (np.tanh(a64 @ b64) * b64[j].sum()).sum()
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_each_translation_unit_is_one_region_and_shares_the_team_policy() -> None:
    """Split into several units (``render_c_units``), every kernel unit with splittable work
    is one region of its own; the team size and policy set through the step unit's
    ``sg_set_threads`` reach every unit (one thread forced, full team: the same bits), and
    the values match the single-unit build and NumPy."""
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c import lower
    from shapegrad.backends.c.render import render_c_units

    args = (_f32(256, 512), _f32(512, 64, seed=1), _f32(128, 256, seed=2))
    program = lower(_graph(_mlp_step, *args), CompileOptions())
    units = render_c_units(program, unit_lines=20, split_min_lines=0)
    kernel_units = [u for u in units if u.name != "step"]
    assert len(kernel_units) >= 3
    assert sum("#pragma omp parallel num_threads" in u.source for u in kernel_units) >= 2
    assert all("SG_HIDDEN extern int sg_adaptive;" in u.source for u in units)
    one = sg.compile(_mlp_step, backend="c", split_min_lines=10**9).lower(*args).executable
    many = sg.compile(_mlp_step, backend="c", unit_lines=20, split_min_lines=0)
    exe = many.lower(*args).executable
    expected = one(list(args))
    try:
        for policy in (0, 2, 1):
            exe.lib.sg_set_threads(2, policy)
            for got, want in zip(exe(list(args)), expected, strict=True):
                np.testing.assert_array_equal(got, want)
    finally:
        exe.lib.sg_set_threads(2, 1)
    w1, w2, x = (a.astype(np.float64) for a in args)
    out = np.maximum(x @ w1, 0) @ w2
    np.testing.assert_allclose(expected[2], (out**2).mean(), rtol=1e-4)


def test_layer_loop_steps_pick_their_team_per_call_and_keep_their_bits() -> None:
    """A layer loop keeps fork mode (one ``parallel for`` per large statement, in the layer
    body's function too); each call of the step picks the team those statements open
    (``sg_team_now``: the adaptive choice) and is timed. One thread forced, the full team
    and the adaptive choice give the same bits, equal to a float64 NumPy loop."""

    def step(w: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        def loss(w: sg.Tensor) -> sg.Tensor:
            h, _ = sg.scan(lambda h, wl: (sg.tanh(h @ wl), None), x, w)
            return (h**2).mean()

        return sg.value_and_grad(loss)(w)

    w, x = _f32(3, 256, 256) * 0.05, _f32(128, 256, seed=1)
    source = generate(_graph(step, w, x))[1]
    assert "static int sg_fork_body(" in source and "sg_team_now = sg_pick ?" in source
    assert "num_threads(sg_team_now)" in source and "num_threads(sg_threads)" not in source
    exe = sg.compile(step, backend="c").lower(w, x).executable
    results = []
    try:
        for policy in (0, 2, 1, 1, 1, 0):
            exe.lib.sg_set_threads(2, policy)
            results.append(exe([w, x]))
    finally:
        exe.lib.sg_set_threads(2, 1)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    h = x.astype(np.float64)
    for layer in w.astype(np.float64):
        h = np.tanh(h @ layer)
    np.testing.assert_allclose(results[0][0], (h**2).mean(), rtol=1e-4)


def test_programs_without_splits_are_not_timed() -> None:
    """Nothing opens a team (a tiny step): no adaptive pick, no clock reads per call."""
    _, source = generate(_graph(lambda x: sg.tanh(x) * 2.0, _f32(10, 16)))
    assert "sg_team_pick()" not in source.split("static int sg_body(")[1]
    assert "sg_fork_body" not in source
