"""Every primitive's JVP and batching rule against ``torch.func.jvp`` / ``torch.func.vmap``,
eagerly and compiled (numpy and C), in float64.

One row per primitive (``ROWS``: a shapegrad function that uses it, the same function in
PyTorch, and inputs); a primitive only meaningful in context (a comparison, a source)
appears inside a differentiable expression. Eagerly each row is its own check; compiled,
all rows form one function per transform (one build per backend: the C build is the
slow part). ``test_every_primitive_has_a_row`` keeps the table complete: a new primitive
needs a row here. The op table's rows are checked against finite differences and a loop
of examples in ``test_transforms.py`` and ``test_vmap.py``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import references as R
import shapegrad as sg
from shapegrad.ops import prims as P
from shapegrad.ops.protocol import COLLECTIVES, Prim

torch = pytest.importorskip("torch", reason="torch.func is the reference")
F = torch.nn.functional
BATCH = 3
MODES = ["eager", "numpy", "c"]


@dataclass(frozen=True)
class Row:
    prim: Prim
    ours: Callable[..., Any]
    theirs: Callable[..., Any]
    inputs: Sequence[Callable[[np.random.Generator], np.ndarray]]

    @property
    def name(self) -> str:
        return self.prim.value

    def arrays(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.asarray(gen(rng)) for gen in self.inputs]


def normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def positive(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def away(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Normal values at least 0.2 from zero (|x|, division, sign-dependent rules)."""
    return lambda rng: rng.choice([-1.0, 1.0], shape) * rng.uniform(0.2, 2.0, shape)


def ints(hi: int, *shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(0, hi, shape).astype(np.int32)


_CONST = [1.0, -2.0, 3.0]
_RANDOM = R.uniform((2, 3), 11)

ROWS = [
    Row(Prim.NEG, lambda x: -x, lambda x: -x, [normal(2, 3)]),
    Row(Prim.EXP, sg.exp, torch.exp, [normal(2, 3)]),
    Row(Prim.LOG, sg.log, torch.log, [positive(2, 3)]),
    Row(Prim.SIN, sg.sin, torch.sin, [normal(2, 3)]),
    Row(Prim.COS, sg.cos, torch.cos, [normal(2, 3)]),
    Row(Prim.SQRT, sg.sqrt, torch.sqrt, [positive(2, 3)]),
    Row(Prim.TANH, sg.tanh, torch.tanh, [normal(2, 3)]),
    Row(Prim.ERF, sg.erf, torch.erf, [normal(2, 3)]),
    Row(Prim.ABS, sg.abs, torch.abs, [away(2, 3)]),
    Row(Prim.ADD, lambda x, y: x + y, lambda x, y: x + y, [normal(2, 3), normal(2, 3)]),
    Row(Prim.SUB, lambda x, y: x - y, lambda x, y: x - y, [normal(2, 3), normal(2, 3)]),
    Row(Prim.MUL, lambda x, y: x * y, lambda x, y: x * y, [normal(2, 3), normal(2, 3)]),
    Row(Prim.DIV, lambda x, y: x / y, lambda x, y: x / y, [normal(2, 3), away(2, 3)]),
    Row(Prim.POW, lambda x, y: x**y, lambda x, y: x**y, [positive(2, 3), normal(2, 3)]),
    Row(Prim.MAX, sg.maximum, torch.maximum, [normal(2, 3), normal(2, 3)]),
    Row(Prim.MIN, sg.minimum, torch.minimum, [normal(2, 3), normal(2, 3)]),
    # comparisons select between differentiable branches (WHERE's row is LT's)
    Row(Prim.LT, lambda x, y: sg.where(x < y, x * 2.0, y), lambda x, y: torch.where(x < y, x * 2.0, y), [normal(2, 3), normal(2, 3)]),
    Row(Prim.LE, lambda x, y: sg.where(x <= y, x, y * 3.0), lambda x, y: torch.where(x <= y, x, y * 3.0), [normal(2, 3), normal(2, 3)]),
    Row(Prim.EQ, lambda x, y: sg.where(x == y, x, y * x), lambda x, y: torch.where(x == y, x, y * x), [normal(2, 3), normal(2, 3)]),
    Row(Prim.NE, lambda x, y: sg.where(x != x * 0.0, x * y, y), lambda x, y: torch.where(x != x * 0.0, x * y, y), [away(2, 3), normal(2, 3)]),
    Row(Prim.WHERE, lambda c, x, y: sg.where(c > 0.0, x, y), lambda c, x, y: torch.where(c > 0.0, x, y), [away(2, 3), normal(2, 3), normal(3)]),
    Row(Prim.REDUCE_SUM, lambda x: x.sum(axis=1), lambda x: x.sum(1), [normal(2, 3)]),
    Row(Prim.REDUCE_MAX, lambda x: x.max(axis=0), lambda x: x.amax(0), [normal(4, 3)]),
    # ARGSORT is non-differentiable; sort's values are a gather of its positions.
    Row(Prim.ARGSORT, lambda x: sg.sort(x, axis=-1, descending=True), lambda x: torch.sort(x, dim=-1, descending=True, stable=True).values, [normal(3, 5)]),
    Row(Prim.EINSUM, lambda a, b: sg.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b), [normal(2, 3), normal(3, 4)]),
    Row(Prim.RESHAPE, lambda x: x.reshape((3, 2)) * 1.5, lambda x: x.reshape(3, 2) * 1.5, [normal(2, 3)]),
    Row(Prim.PERMUTE, lambda x: P.permute(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), [normal(2, 3, 4)]),
    Row(Prim.BROADCAST, lambda x: P.broadcast_in_dim(x, (3, 2, 4), (0, 2)), lambda x: x[:, None, :].expand(3, 2, 4), [normal(3, 1)]),
    Row(Prim.SLICE, lambda x: P.slice_(x, [1, 0], [6, 3], [2, 3]), lambda x: x[1:6:2, 0:3:3], [normal(7, 4)]),
    Row(Prim.PAD, lambda x: P.pad(x, [0, 2], [1, 0], value=-1.0), lambda x: F.pad(x, (2, 0, 0, 1), value=-1.0), [normal(3, 2)]),
    Row(Prim.CONCAT, lambda x, y: sg.concat([x, y], 1), lambda x, y: torch.cat([x, y], 1), [normal(2, 3), normal(2, 1)]),
    Row(Prim.CAST, lambda x: (x * 3.0).astype("float32").astype("float64"), lambda x: (x * 3.0).float().double(), [normal(2, 3)]),
    Row(Prim.GATHER, lambda x, i: P.gather(x, i, 1), lambda x, i: x.index_select(1, i.reshape(-1).long()).reshape(x.shape[0], *i.shape), [normal(3, 5), ints(5, 2, 3)]),
    Row(Prim.SCATTER_ADD, lambda u, i: P.scatter_add(u, i, 1, 3), lambda u, i: u.new_zeros((u.shape[0], 3, u.shape[2])).index_add(1, i.long(), u), [normal(2, 5, 3), ints(3, 5)]),
    Row(Prim.CONSTANT, lambda x: x * P.constant(_CONST, x.dtype, like=x), lambda x: x * torch.tensor(_CONST, dtype=x.dtype), [normal(2, 3)]),
    Row(Prim.IOTA, lambda x: x * P.iota((2, 3), 1, x.dtype, like=x), lambda x: x * torch.arange(3, dtype=x.dtype).expand(2, 3), [normal(2, 3)]),
    Row(Prim.RANDOM, lambda x: x * P.random_uniform(x.shape, 11, x.dtype, like=x), lambda x: x * torch.from_numpy(_RANDOM), [normal(2, 3)]),
    Row(Prim.STOP_GRADIENT, lambda x: sg.stop_gradient(x) * x, lambda x: x.detach() * x, [normal(2, 3)]),
]  # fmt: skip

# INPUT exists only inside graphs; SCAN is structured (jvp/vmap of scans vs torch and loops:
# test_transforms.py, test_vmap.py); collectives have no batching rule by design.
EXEMPT = {Prim.INPUT, Prim.SCAN} | COLLECTIVES


def test_every_primitive_has_a_row() -> None:
    covered = {row.prim for row in ROWS}
    missing = sorted(p.value for p in set(Prim) - EXEMPT - covered)
    assert not missing, f"primitives without a jvp/vmap row against torch.func: {missing}"
    assert len(covered) == len(ROWS)


def _draw(row: Row, batch: int | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(row.name.encode()))
    if batch is None:
        return row.arrays(rng)
    draws = [row.arrays(rng) for _ in range(batch)]
    return [np.stack(parts) for parts in zip(*draws, strict=True)]


def _ours(a: np.ndarray) -> sg.Tensor:
    return sg.tensor(a, dtype="float64") if a.dtype.kind == "f" else sg.tensor(a)


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


# --- jvp ----------------------------------------------------------------------------------


def _jvp_case(row: Row) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    arrays = _draw(row)
    positions = [k for k, a in enumerate(arrays) if _is_float(a)]
    rng = np.random.default_rng(7)
    tangents = [rng.standard_normal(arrays[k].shape) for k in positions]
    return arrays, tangents, positions


def _partial(fn: Callable[..., Any], fixed: list[Any], positions: list[int]) -> Callable[..., Any]:
    def partial(*xs: Any) -> Any:
        full = list(fixed)
        for k, x in zip(positions, xs, strict=True):
            full[k] = x
        return fn(*full)

    return partial


def _torch_jvp(row: Row) -> tuple[np.ndarray, np.ndarray]:
    arrays, tangents, positions = _jvp_case(row)
    fixed = [torch.from_numpy(a.copy()) for a in arrays]
    out, tangent = torch.func.jvp(
        _partial(row.theirs, fixed, positions),
        tuple(fixed[k] for k in positions),
        tuple(torch.from_numpy(t) for t in tangents),
    )
    return out.numpy(), tangent.numpy()


def _our_jvp(row: Row, primals: Sequence[sg.Tensor], tangents: Sequence[sg.Tensor]) -> Any:
    arrays, _, positions = _jvp_case(row)
    fixed = [_ours(a) for a in arrays]
    return sg.jvp(_partial(row.ours, fixed, positions), tuple(primals), tuple(tangents))


def _jvp_inputs(row: Row) -> tuple[list[sg.Tensor], list[sg.Tensor]]:
    arrays, tangents, positions = _jvp_case(row)
    return [_ours(arrays[k]) for k in positions], [_ours(t) for t in tangents]


def _close(got: Any, want: np.ndarray, what: str) -> None:
    got = got.numpy() if isinstance(got, sg.Tensor) else np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != torch's {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_jvp_matches_torch_func_jvp_eagerly(row: Row) -> None:
    out, tangent = _our_jvp(row, *_jvp_inputs(row))
    want_out, want_tangent = _torch_jvp(row)
    _close(out, want_out, f"{row.name} primal")
    _close(tangent, want_tangent, f"{row.name} tangent")


@pytest.mark.parametrize("mode", ["numpy", "c"])
def test_jvp_of_every_primitive_compiled_matches_torch(mode: str) -> None:
    """All rows in one compiled function: each row's (primal, tangent) pair."""
    inputs = [_jvp_inputs(row) for row in ROWS]
    counts = [len(p) for p, _ in inputs]

    def all_rows(*flat: sg.Tensor) -> tuple[sg.Tensor, ...]:
        results: list[sg.Tensor] = []
        at = 0
        for row, n in zip(ROWS, counts, strict=True):
            primals, tangents = flat[at : at + n], flat[at + n : at + 2 * n]
            results.extend(_our_jvp(row, primals, tangents))
            at += 2 * n
        return tuple(results)

    flat = [t for primals, tangents in inputs for t in (*primals, *tangents)]
    got = sg.compile(all_rows, backend=mode)(*flat)
    for k, row in enumerate(ROWS):
        want_out, want_tangent = _torch_jvp(row)
        _close(got[2 * k], want_out, f"{row.name} primal ({mode})")
        _close(got[2 * k + 1], want_tangent, f"{row.name} tangent ({mode})")


# --- vmap ---------------------------------------------------------------------------------


def _torch_vmap(row: Row) -> np.ndarray:
    stacked = [torch.from_numpy(a.copy()) for a in _draw(row, BATCH)]
    result: np.ndarray = torch.func.vmap(row.theirs)(*stacked).numpy()
    return result


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_vmap_matches_torch_func_vmap_eagerly(row: Row) -> None:
    got = sg.vmap(row.ours)(*[_ours(a) for a in _draw(row, BATCH)])
    _close(got, _torch_vmap(row), row.name)


@pytest.mark.parametrize("mode", ["numpy", "c"])
def test_vmap_of_every_primitive_compiled_matches_torch(mode: str) -> None:
    stacked = [[_ours(a) for a in _draw(row, BATCH)] for row in ROWS]
    counts = [len(s) for s in stacked]

    def all_rows(*flat: sg.Tensor) -> tuple[sg.Tensor, ...]:
        results, at = [], 0
        for row, n in zip(ROWS, counts, strict=True):
            results.append(sg.vmap(row.ours)(*flat[at : at + n]))
            at += n
        return tuple(results)

    got = sg.compile(all_rows, backend=mode)(*[t for s in stacked for t in s])
    for row, value in zip(ROWS, got, strict=True):
        _close(value, _torch_vmap(row), f"{row.name} ({mode})")
