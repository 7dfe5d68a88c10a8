"""C backend scheduling and code-generation choices of issue 12, checked on the generated
code and against the NumPy reference: no OpenMP region inside a serial loop, row reductions
split across threads with unchanged summation order, the runtime learning rate fused into
the product, im2col patch tests split per kernel position, vectorized transcendentals."""

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
from shapegrad.backends.c import COptions, generate
from shapegrad.backends.c.toolchain import has_vector_math
from shapegrad.compiler import loops as L

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _graph(fn, *args):  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy").graph(*args)


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _no_region_inside_a_serial_loop(source: str) -> bool:
    """True when every ``#pragma omp parallel`` sits outside any open ``for`` loop."""
    depth_of_loops: list[int] = []
    depth = 0
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#pragma omp parallel") and depth_of_loops:
            return False
        if text.startswith("for (") and text.endswith("{"):
            depth_of_loops.append(depth)
        depth += text.count("{") - text.count("}")
        while depth_of_loops and depth <= depth_of_loops[-1]:
            depth_of_loops.pop()
    return True


def test_bias_gradient_splits_the_row_not_the_batch_loop() -> None:
    x = _f32(2048, 128)
    f = lambda x: (x * 2.0).sum(axis=0)  # noqa: E731  (a bias gradient's shape)
    _, source = generate(_graph(f, x))
    assert "j0 = part * 128 / sg_threads" in source
    assert _no_region_inside_a_serial_loop(source)
    got = sg.compile(f, backend="c")(sg.tensor(x)).numpy()
    serial = np.zeros(128, np.float32)
    for r in range(2048):  # the serial order the split keeps per element
        serial += x[r] * np.float32(2.0)
    np.testing.assert_array_equal(got, serial)


def test_layer_norm_gradient_has_no_region_inside_a_serial_loop() -> None:
    def loss(x: sg.Tensor, g: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
        return (sg.layer_norm(x, g, b) ** 2).sum()

    args = (_f32(2048, 128), _f32(128, seed=1), _f32(128, seed=2))
    _, source = generate(_graph(sg.grad(loss, argnums=(0, 1, 2)), *args))
    assert _no_region_inside_a_serial_loop(source)


def test_runtime_learning_rate_update_is_one_product() -> None:
    def step(w: sg.Tensor, x: sg.Tensor, lr: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        loss, g = sg.value_and_grad(lambda w: ((x @ w) ** 2).mean())(w)
        return w - lr * g, loss

    w, x, lr = _f32(256, 128), _f32(64, 256, seed=1), np.array(0.01, np.float32)
    fn = sg.compile(step, backend="c", donate_argnums=0)
    exe = fn.lower(w, x, lr).executable
    updates = [
        s
        for k in exe.program.kernels
        for s in L.walk(k.body)
        if isinstance(s, L.Contract) and s.alpha_buffer is not None
    ]
    assert len(updates) == 1 and updates[0].alpha == -1.0 and updates[0].beta == 1.0
    ref = sg.compile(step, backend="numpy")(sg.tensor(w), sg.tensor(x), sg.tensor(lr))
    got = fn(sg.tensor(w), sg.tensor(x), sg.tensor(lr))
    np.testing.assert_allclose(got[0].numpy(), ref[0].numpy(), rtol=1e-5, atol=1e-6)


def test_conv_patch_tests_split_per_kernel_position() -> None:
    def conv(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return sg.relu(sg.conv2d(x, w, padding=1)).mean()

    args = (_f32(8, 4, 3, 3), _f32(16, 4, 12, 12, seed=1))
    _, source = generate(_graph(sg.value_and_grad(conv, argnums=(0, 1)), *args))
    chains = max(line.count("?") for line in source.splitlines() if "sg_" not in line)
    assert chains <= 3  # was a 9-way nested select on 3*kh + kw per element
    got = sg.compile(sg.value_and_grad(conv, argnums=(0, 1)), backend="c")(*map(sg.tensor, args))
    ref = sg.compile(sg.value_and_grad(conv, argnums=(0, 1)), backend="numpy")(
        *map(sg.tensor, args)
    )
    for a, b in zip(got[1], ref[1], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not has_vector_math(), reason="no glibc libmvec (not Linux x86-64)")
def test_transcendentals_use_vector_math_within_tolerance() -> None:
    x = np.linspace(-6, 6, 1 << 16, dtype=np.float32)
    f = lambda x: sg.tanh(x) + sg.exp(x * 0.5) * sg.log(sg.abs(x) + 1.0)  # noqa: E731
    _, source = generate(_graph(f, x))
    assert re.search(r"omp declare simd notinbranch\nfloat tanhf", source)
    got = sg.compile(f, backend="c")(sg.tensor(x)).numpy()
    x64 = x.astype(np.float64)
    want = np.tanh(x64) + np.exp(x64 * 0.5) * np.log(np.abs(x64) + 1.0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_thread_count_follows_shapegrad_then_openmp_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shapegrad.backends.c.executable import num_threads

    monkeypatch.delenv("SHAPEGRAD_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert num_threads() == 3
    monkeypatch.setenv("SHAPEGRAD_NUM_THREADS", "1")
    assert num_threads() == 1


def test_openmp_spinning_is_bounded_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from shapegrad.backends.c.executable import configure_openmp_waiting

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    configure_openmp_waiting()
    assert os.environ["GOMP_SPINCOUNT"] == "2000"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    configure_openmp_waiting()
    assert "GOMP_SPINCOUNT" not in os.environ and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize("policy", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "INFINITY")])
def test_a_process_whose_openmp_threads_spin_exits_cleanly(
    policy: tuple[str, str], tmp_path: Path
) -> None:
    """Idle OpenMP threads that spin (the user's choice) while the interpreter exits: cffi
    closes the compiled library at exit, and the OpenMP runtime must stay mapped under
    the spinning threads (it was unmapped with the library: SIGSEGV after the last line)."""
    script = tmp_path / "spin.py"
    script.write_text(
        "import numpy as np\n"
        "import shapegrad as sg\n"
        "f = sg.compile(lambda a, b: (a @ b).sum(), backend='c', name='spin_exit')\n"
        "a = np.ones((300, 300), np.float32)\n"
        "print(float(f(a, a)))\n"
    )
    variable, value = policy
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({variable: value, "SHAPEGRAD_NUM_THREADS": "2", "PYTHONFAULTHANDLER": "1"})
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    assert float(run.stdout) == 300.0 * 300.0 * 300.0


# --- the team plan as a function of the program, and the tuning record ----------------------


def _mlp_step_graph():  # type: ignore[no-untyped-def]
    def step(w1: sg.Tensor, w2: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, ...]:
        def loss(w1: sg.Tensor, w2: sg.Tensor) -> sg.Tensor:
            return ((sg.relu(x @ w1) @ w2) ** 2).mean()

        value, (g1, g2) = sg.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.01 * g1, w2 - 0.01 * g2, value

    args = (_f32(256, 512), _f32(512, 64, seed=1), _f32(128, 256, seed=2))
    return step, args, _graph(step, *args)


def test_team_plan_is_a_pure_function_printed_as_planned() -> None:
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c import lower
    from shapegrad.backends.c.render import c_tuning, render_c
    from shapegrad.backends.c.schedule import plan_region

    _, _, graph = _mlp_step_graph()
    program = lower(graph, CompileOptions())
    tuning = c_tuning()
    plan = plan_region(program, program.kernels, tuning)
    assert plan == plan_region(program, program.kernels, tuning)  # no hidden state
    assert plan.groups and any(g.shared for g in plan.groups)
    source = render_c(program, tuning=tuning)
    assert source == render_c(program, tuning=tuning)
    body = source[source.index("static int sg_body(") :]
    barriers = sum(g.barrier for g in plan.groups) + sum(g.flag >= 0 for g in plan.groups)
    assert body.count("#pragma omp barrier") == barriers
    assert body.count("#pragma omp single nowait") == sum(not g.shared for g in plan.groups)
    assert body.count("(shared) */") == sum(g.shared for g in plan.groups)
    assert f"num_threads(sg_pick ? {plan.team} : 1)" in body
    text = plan.format(tuning)
    assert text.startswith("one region, team sg_threads")
    assert text.count("  shared") == sum(g.shared for g in plan.groups)


def test_threading_constants_come_from_the_target_tuning() -> None:
    from dataclasses import replace

    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c.render import c_tuning
    from shapegrad.compiler.target import C_TARGET, CTuning, Target

    x = _f32(512, 1024)
    wide = _graph(lambda x: sg.tanh(x) * 3.0, x)  # one flat loop: chunks of chunk_work stores
    pattern = r"schedule\(dynamic, (\d+)\) nowait"
    assert re.findall(pattern, generate(wide)[1]) == [str(1 << 15)]
    small = C_TARGET.replace(tuning=replace(c_tuning(), chunk_work=1 << 12))
    assert re.findall(
        pattern, generate(wide, CompileOptions(backend_options=COptions(target=small)))[1]
    ) == [str(1 << 12)]
    got = sg.compile(lambda x: sg.tanh(x) * 3.0, backend="c", target=small)(sg.tensor(x))
    np.testing.assert_allclose(got.numpy(), np.tanh(x) * 3.0, rtol=1e-5, atol=1e-6)
    step, args, graph = _mlp_step_graph()
    never = replace(c_tuning(), region_min_work=1 << 62, omp_min_work=1 << 62)
    never = replace(never, contract_split_macs=1 << 62)
    serial_target = C_TARGET.replace(tuning=never)
    serial = generate(graph, CompileOptions(backend_options=COptions(target=serial_target)))
    assert "#pragma omp" not in serial[1].split("static int sg_body(")[1].split("int sg_run(")[0]
    want = sg.compile(step, backend="numpy")(*map(sg.tensor, args))
    for target in (C_TARGET, C_TARGET.replace(tuning=never)):
        outs = sg.compile(step, backend="c", target=target)(*map(sg.tensor, args))
        for a, b in zip(outs, want, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    assert c_tuning(Target(name="c")) == CTuning()  # a base record gets the C defaults


def test_runtime_header_is_packaged_and_inlined_into_every_unit() -> None:
    import tomllib
    from importlib import resources

    from shapegrad.backends.c.render import render_c_units

    runtime = resources.files("shapegrad.backends.c").joinpath("runtime.h").read_text()
    assert "sg_team_pick" in runtime and "#include" in runtime
    _, _, graph = _mlp_step_graph()
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c import lower

    program = lower(graph, CompileOptions())
    units = render_c_units(program, unit_lines=20, split_min_lines=0)
    assert len(units) > 1 and all(runtime in u.source for u in units)  # text, not a path
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as handle:
        data = tomllib.load(handle)["tool"]["setuptools"]["package-data"]["shapegrad"]
    assert "backends/c/runtime.h" in data


def test_a_step_split_into_units_decides_its_team_once_per_call() -> None:
    """A step rendered as several kernel units picks the adaptive team once per call, in
    its step unit, and times the whole call; the kernel units follow that pick
    (``SG_FOLLOW_STEP``). Units that decided alone could disagree, and then every call of
    each paid a switch. One timed call per step, and the same bits as the full team."""
    import cffi

    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.c import compile_units, load, lower
    from shapegrad.backends.c.executable import CExecutable
    from shapegrad.backends.c.manifest import RuntimeInfo
    from shapegrad.backends.c.render import render_c_units

    _, args, graph = _mlp_step_graph()
    program = lower(graph, CompileOptions())
    units = render_c_units(program, unit_lines=20, split_min_lines=0)
    step, kernels = units[0], units[1:]
    assert step.name == "step" and kernels
    body = step.source.split("static int sg_body(")[1]
    assert "sg_step_pick = sg_team_pick();" in body and "sg_team_record(sg_step_pick" in body
    assert "#define SG_FOLLOW_STEP" not in step.source
    assert all(u.source.startswith("#define SG_FOLLOW_STEP 1\n") for u in kernels)
    library = compile_units([(u.name, u.source) for u in units], program, COptions())
    lib = load(library)
    exe = CExecutable(graph, RuntimeInfo.of(program, library.key), lib, library.path, program)
    ffi = cffi.FFI()
    ffi.cdef("void sg_team_counts(unsigned long long *out);")
    counts = ffi.new("unsigned long long[2]")
    lib.sg_set_threads(2, 0)
    want = exe(list(args))
    try:
        lib.sg_set_threads(2, 1)
        ffi.dlopen(library.path).sg_team_counts(counts)
        before = int(counts[0])
        for _ in range(40):
            got = exe(list(args))
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)
        ffi.dlopen(library.path).sg_team_counts(counts)
        assert int(counts[0]) - before == 40  # one timed call per step, not one per unit
    finally:
        lib.sg_set_threads(2, 1)
