"""Differential fuzzer: random well-typed programs, eager vs compiled numpy / C (/ CUDA) vs PyTorch.

Each program (see ``fuzz_programs.py``) mixes broadcasting, reductions, products, layout
ops, conv and pooling, norms, gathers and losses over random shapes (size-1 and size-0
dims included), float32 or float64, with transposed (non-contiguous) inputs. For each
program the outputs and the gradients of ``sum_k <output_k, cotangent_k>`` (random
cotangents) with respect to every input are compared across the execution modes, and
against PyTorch in float64 when it is installed.

Programs are compiled in groups (one C compile per group) to keep the default budget
near 30 seconds; the ``slow`` test runs thousands. A failure prints the seed and the
program, and ``FUZZ_SEED=<seed> pytest tests/test_fuzz.py -k one`` replays one seed
(``FUZZ_KIND=float16|int32|special`` for the numeric kinds: float16 programs, integer
programs, and programs whose inputs hold +-inf and NaN).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from fuzz_programs import Program, generate, make_inputs, run_sg, run_torch

GROUP = 8  # programs per compiled function
HAVE_CC = shutil.which("cc") is not None


def _scalar(program: Program) -> Any:
    def scalar(xs: list[Any], cots: list[Any]) -> Any:
        total = None
        for out, cot in zip(run_sg(program, xs), cots, strict=True):
            term = (out * cot).sum()
            total = term if total is None else total + term
        return total

    return scalar


def _group_fn(programs: Sequence[Program]) -> Any:
    """One function running every program: (outputs, grads) per program (no grads for
    int32 programs)."""

    def run(all_xs: list[list[Any]], all_cots: list[list[Any]]) -> Any:
        results = []
        for program, xs, cots in zip(programs, all_xs, all_cots, strict=True):
            outs = tuple(run_sg(program, xs))
            if program.dtype == "int32":
                results.append((outs, ()))
                continue
            results.append((outs, sg.grad(_scalar(program))(xs, cots)))
        return results

    return run


def _numpy(tree: Any) -> Any:
    if isinstance(tree, list | tuple):
        return [_numpy(t) for t in tree]
    return np.asarray(tree.numpy() if hasattr(tree, "numpy") else tree)


def _tolerance(dtype: str, versus_torch: bool = False) -> tuple[float, float]:
    if dtype == "int32":
        return (0.0, 0.0)
    if dtype == "float64":
        return (1e-7, 1e-9) if versus_torch else (1e-9, 1e-11)
    if dtype == "float16":  # 11-bit significand; each op rounds (C may keep more bits between)
        return (6e-2, 6e-3) if versus_torch else (2e-2, 2e-3)
    return (2e-3, 2e-4) if versus_torch else (5e-4, 5e-5)


def _close(
    got: Any,
    want: Any,
    dtype: str,
    what: str,
    versus_torch: bool = False,
    nan_may_cancel: bool = False,
) -> None:
    """``nan_may_cancel``: where ``want`` is NaN, ``got`` may be any value (C gradients of
    +-inf/NaN programs: gcc's ``-fassociative-math``, which the C backend's reductions need,
    folds a cancelling ``g - g`` to 0 even for a NaN ``g``)."""
    rtol, atol = _tolerance(dtype, versus_torch)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    if nan_may_cancel:
        got = np.where(np.isnan(want), want, got)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def _torch_reference(
    program: Program, xs: list[np.ndarray[Any, Any]], cots: list[np.ndarray[Any, Any]]
) -> tuple[list[Any], list[Any]]:
    torch = pytest.importorskip("torch")
    if program.dtype == "int32":  # exact in int64; compared where int32 holds the result
        outs = run_torch(torch, program, [torch.tensor(x.astype(np.int64)) for x in xs])
        return [o.numpy() for o in outs], []
    leaves = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in xs]
    outs = run_torch(torch, program, leaves)
    total = sum(
        (o * torch.tensor(c.astype(np.float64))).sum() for o, c in zip(outs, cots, strict=True)
    )
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    grads = [np.zeros(x.shape) if g is None else g.numpy() for g, x in zip(grads, xs, strict=True)]
    return [o.detach().numpy() for o in outs], grads


def check_group(seed: int, modes: Sequence[str], with_torch: bool, kind: str = "mixed") -> int:
    """Generate GROUP programs of ``kind`` (see ``fuzz_programs.generate``) from ``seed`` and
    compare them; returns how many ran. Programs with +-inf/NaN inputs compare gradients
    across shapegrad's modes only (PyTorch's subgradients at infinities are conventions)."""
    rng = np.random.default_rng(seed)
    programs = [generate(rng, kind) for _ in range(GROUP)]
    all_xs = [make_inputs(p, rng) for p in programs]
    # cotangents: the output shapes come from one eager run
    eager_outs = [
        run_sg(p, [sg.tensor(x) for x in xs]) for p, xs in zip(programs, all_xs, strict=True)
    ]
    all_cots = [
        [rng.standard_normal(o.shape).astype(p.dtype) for o in outs]
        for p, outs in zip(programs, eager_outs, strict=True)
    ]
    run = _group_fn(programs)
    eager = _numpy(
        run(
            [[sg.tensor(x) for x in xs] for xs in all_xs],
            [[sg.tensor(c) for c in cs] for cs in all_cots],
        )
    )
    for mode in modes:
        compiled = _numpy(sg.compile(run, backend=mode)(all_xs, all_cots))
        for k, program in enumerate(programs):
            for part, (got, want) in enumerate(zip(compiled[k], eager[k], strict=True)):
                for j, (g, w) in enumerate(zip(got, want, strict=True)):
                    what = (
                        f"seed {seed} program {k} {mode} vs eager, "
                        f"{'output' if part == 0 else 'grad'} {j}:\n{program.describe()}"
                    )
                    cancel = program.special and mode == "c" and part == 1
                    _close(g, w, program.dtype, what, nan_may_cancel=cancel)
    if with_torch:
        for k, program in enumerate(programs):
            t_outs, t_grads = _torch_reference(program, all_xs[k], all_cots[k])
            references = (
                (t_outs,) if program.special or program.dtype == "int32" else (t_outs, t_grads)
            )
            for part, ref in enumerate(references):
                for j, (g, w) in enumerate(zip(eager[k][part], ref, strict=True)):
                    if program.dtype == "int32" and np.abs(w).max(initial=0) >= 2**31:
                        continue  # int32 wraps like NumPy; int64 does not
                    what = (
                        f"seed {seed} program {k} eager vs torch, "
                        f"{'output' if part == 0 else 'grad'} {j}:\n{program.describe()}"
                    )
                    _close(g, w, program.dtype, what, versus_torch=True)
    return len(programs)


def _modes() -> list[str]:
    modes = ["numpy", "c"] if HAVE_CC else ["numpy"]
    return [*modes, "cuda"] if _HAVE_CUDA else modes


def _cuda_available() -> bool:
    from shapegrad.backends import BackendUnavailable, get_backend

    try:
        get_backend("cuda")
    except (BackendUnavailable, ValueError):
        return False
    return True


_HAVE_CUDA = _cuda_available()  # on a machine with a GPU the fuzzer checks CUDA too


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


FAST_SEEDS = range(10)  # 80 programs, one C compile per 8: about 20-30 s cold on the 2-core box


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_fuzz_fast_budget(seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN from mean of nothing, like NumPy
        check_group(seed, _modes(), _torch_available())


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(10))
def test_fuzz_slow_budget(chunk: int) -> None:
    """Thousands of programs: 10 chunks x 32 groups x 8 programs = 2,560 (compiled C every
    4th group to bound compile time; numpy and PyTorch on all)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)  # PyTorch: var with no degrees of freedom
        for g in range(32):
            seed = 1000 + chunk * 32 + g
            modes = _modes() if g % 4 == 0 else ["numpy"]
            check_group(seed, modes, _torch_available())


# float16, int32 and +-inf/NaN programs (issue 24): 3 groups of each by default.
NUMERIC_KINDS = ("float16", "int32", "special")
NUMERIC_FAST_SEEDS = range(3)


@pytest.mark.parametrize("kind", NUMERIC_KINDS)
@pytest.mark.parametrize("seed", NUMERIC_FAST_SEEDS)
def test_fuzz_numeric_kinds_fast_budget(kind: str, seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf - inf, 0 * inf: NaN, like NumPy
        warnings.simplefilter("ignore", UserWarning)
        check_group(500 + seed, _modes(), _torch_available(), kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", NUMERIC_KINDS)
@pytest.mark.parametrize("chunk", range(3))
def test_fuzz_numeric_kinds_slow_budget(kind: str, chunk: int) -> None:
    """3 kinds x 3 chunks x 16 groups x 8 programs = 1,152 programs (compiled C every 4th
    group; numpy and PyTorch on all)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        for g in range(16):
            seed = 5000 + chunk * 16 + g
            modes = _modes() if g % 4 == 0 else ["numpy"]
            check_group(seed, modes, _torch_available(), kind)


def test_fuzz_one_seed_from_the_environment() -> None:
    seed = os.environ.get("FUZZ_SEED")
    if seed is None:
        pytest.skip("set FUZZ_SEED=<seed> to replay one group of programs")
    check_group(int(seed), _modes(), _torch_available(), os.environ.get("FUZZ_KIND", "mixed"))


def test_generator_covers_the_op_families() -> None:
    rng = np.random.default_rng(0)
    ops = {step.op for _ in range(400) for step in generate(rng).steps}
    for family in (
        "add",
        "sum",
        "softmax",
        "transpose",
        "pad",
        "slice",
        "concat",
        "matmul",
        "take",
        "embedding",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "layer_norm",
        "cross_entropy",
        "mse",
        "einsum",
        "reshape",
    ):
        assert family in ops, family
    shapes = [s for _ in range(200) for s in generate(rng).inputs]
    assert any(0 in s for s in shapes) and any(1 in s for s in shapes)
