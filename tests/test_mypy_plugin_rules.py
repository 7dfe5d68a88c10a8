"""The plugin's shape rules on concrete sizes, checked against NumPy (and shapegrad at run time).

These are the pure functions behind the mypy plugin (no mypy run): for random
literal shapes, every rule must give exactly NumPy's result shape, and must
raise ``Mismatch`` exactly when NumPy (or shapegrad) raises.
"""

from __future__ import annotations

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.mypy_plugin import algebra as A
from shapegrad.mypy_plugin import layers as L
from shapegrad.mypy_plugin import sizes
from shapegrad.mypy_plugin.algebra import Mismatch, Operand
from shapegrad.mypy_plugin.parsing import parse_spec
from shapegrad.mypy_plugin.spec import Sym, TShape, Var, decode, encode, restrict
from shapegrad.mypy_plugin.unify import Binder, compare

RNG = np.random.default_rng(0)


def op(*dims: int) -> Operand:
    return Operand("x", TShape(tuple(dims), "float"))


def dims_of(shape: TShape | None) -> tuple[object, ...] | None:
    return None if shape is None else shape.dims


def random_shape(rank: int, sizes: tuple[int, ...] = (1, 2, 3)) -> tuple[int, ...]:
    return tuple(int(RNG.choice(sizes)) for _ in range(rank))


def test_broadcast_matches_numpy() -> None:
    for _ in range(300):
        a, b = random_shape(int(RNG.integers(0, 4))), random_shape(int(RNG.integers(0, 4)))
        try:
            want = np.broadcast_shapes(a, b)
        except ValueError:
            with pytest.raises(Mismatch):
                A.broadcast("add", [op(*a), op(*b)])
            continue
        assert dims_of(A.broadcast("add", [op(*a), op(*b)])) == want


def test_matmul_matches_numpy() -> None:
    for _ in range(300):
        a = random_shape(int(RNG.integers(1, 4)))
        b = random_shape(int(RNG.integers(1, 4)))
        try:
            want = np.matmul(np.zeros(a), np.zeros(b)).shape
        except ValueError:
            with pytest.raises(Mismatch):
                A.matmul(op(*a), op(*b))
            continue
        assert dims_of(A.matmul(op(*a), op(*b))) == want, (a, b)


@pytest.mark.parametrize(
    "spec",
    ["ij,jk->ik", "bi,oi->bo", "bij,bjk->bik", "ij->ji", "i,i->", "ij,kj", "bhtd,bhsd->bhts"],
)
def test_einsum_matches_numpy(spec: str) -> None:
    inputs = spec.split("->")[0].split(",")
    for _ in range(30):
        sizes = {c: int(RNG.choice((1, 2, 3))) for c in "".join(inputs)}
        shapes = [tuple(sizes[c] for c in s) for s in inputs]
        if RNG.random() < 0.5:  # perturb one size: NumPy and the rule must both reject it
            k = int(RNG.integers(len(shapes)))
            if shapes[k]:
                shapes[k] = (*shapes[k][:-1], shapes[k][-1] + 1)
        arrays = [np.zeros(s) for s in shapes]
        try:
            want = np.einsum(spec, *arrays).shape
        except ValueError:
            with pytest.raises(Mismatch):
                A.einsum(spec, [op(*s) for s in shapes])
            continue
        assert dims_of(A.einsum(spec, [op(*s) for s in shapes])) == want


def test_reductions_match_numpy() -> None:
    for _ in range(200):
        shape = random_shape(int(RNG.integers(1, 4)), (2, 3, 4))
        rank = len(shape)
        axes = sorted({int(a) for a in RNG.integers(-rank, rank, size=int(RNG.integers(1, 3)))})
        if len({a % rank for a in axes}) != len(axes):
            continue
        keep = bool(RNG.random() < 0.5)
        want = np.zeros(shape).sum(axis=tuple(axes), keepdims=keep).shape
        assert dims_of(A.reduce("sum", op(*shape), axes, keep, "float")) == want
    assert dims_of(A.reduce("sum", op(2, 3), None, False, None)) == ()
    with pytest.raises(Mismatch, match="axis 2 is out of range"):
        A.reduce("sum", op(2, 3), [2], False, None)


def test_reshape_transpose_index_match_numpy() -> None:
    x = np.zeros((4, 6, 5))
    assert dims_of(A.reshape(op(4, 6, 5), [-1, 10])) == x.reshape(-1, 10).shape
    assert dims_of(A.reshape(op(4, 6, 5), [24, -1])) == x.reshape(24, -1).shape
    with pytest.raises(Mismatch, match="120 elements"):
        A.reshape(op(4, 6, 5), [7, -1])
    assert dims_of(A.transpose("T", op(4, 6, 5), None)) == x.T.shape
    assert dims_of(A.transpose("transpose", op(4, 6, 5), [2, 0, 1])) == x.transpose(2, 0, 1).shape
    for index in [
        (0,),
        (slice(1, 3),),
        (slice(None), None, slice(None, None, 2)),
        (Ellipsis, 1),
        (-1, 2),
    ]:
        assert dims_of(L.index(op(4, 6, 5), list(index))) == x[index].shape, index
    with pytest.raises(Mismatch, match="out of bounds"):
        L.index(op(4, 6, 5), [4])


def test_concat_and_stack_match_numpy() -> None:
    a, b = np.zeros((2, 3)), np.zeros((2, 5))
    assert (
        dims_of(A.concat("concat", [op(2, 3), op(2, 5)], 1, False))
        == np.concatenate([a, b], 1).shape
    )
    assert dims_of(A.concat("stack", [op(2, 3), op(2, 3)], -1, True)) == np.stack([a, a], -1).shape
    with pytest.raises(Mismatch, match="disagree at dimension 0"):
        A.concat("concat", [op(2, 3), op(4, 3)], 1, False)


@pytest.mark.parametrize(("stride", "padding"), [(1, 0), (2, 1), (3, 2)])
def test_conv_and_pool_match_shapegrad(stride: int, padding: int) -> None:
    x, w = sg.zeros((2, 3, 11, 9)), sg.zeros((4, 3, 3, 2))
    got = L.conv2d(op(2, 3, 11, 9), op(4, 3, 3, 2), None, (stride, stride), (padding, padding))
    assert dims_of(got) == sg.conv2d(x, w, stride=stride, padding=padding).shape
    pooled = L.pool2d("max_pool2d", op(2, 3, 11, 9), (3, 3), (stride, stride), (1, 1))
    assert dims_of(pooled) == sg.max_pool2d(x, 3, stride=stride, padding=1).shape
    with pytest.raises(Mismatch, match=r"input channels disagree.*\(3 != 2\)"):
        L.conv2d(op(2, 3, 11, 9), op(4, 2, 3, 3), None, (1, 1), (0, 0))


def test_named_dims_are_rigid_and_unknowns_never_conflict() -> None:
    b, n = Sym("b", "f"), Sym("n", "f")
    x = Operand("x", TShape((b, 784)))
    assert dims_of(A.matmul(x, Operand("w", TShape((784, n))))) == (b, n)
    with pytest.raises(Mismatch, match=r"784 != n"):
        A.matmul(x, Operand("w", TShape((n, 10))))
    unknown = Operand("w", TShape((None, 10)))
    assert dims_of(A.matmul(x, unknown)) == (b, 10)
    batch = Var("batch", "f")
    assert dims_of(A.broadcast("add", [Operand("s", TShape((batch, 784))), x])) == (
        Var(None, ""),
        784,
    )
    assert dims_of(
        A.matmul(Operand("s", TShape((batch, b, 784))), Operand("w", TShape((784, n))))
    ) == (
        batch,
        b,
        n,
    )


def test_binder_instantiates_and_reports_conflicts() -> None:
    binder = Binder("loss")
    want_x, want_y = TShape((Sym("b", "loss"), 784)), TShape((Sym("b", "loss"),))
    binder.match("x", TShape((32, 784)), want_x)
    assert binder.substitute(TShape((Sym("b", "loss"), 10))).dims == (32, 10)
    with pytest.raises(Mismatch, match="dimension 'b' is 32 in x but 64 in y"):
        binder.match("y", TShape((64,)), want_y)
    assert compare(TShape((3, 4)), TShape((3, 5))) == "dimension 1: 4 != 5"
    assert compare(TShape((3, None)), TShape((3, 5))) is None


def test_spec_parsing_encoding_and_scoping() -> None:
    shape = parse_spec("*batch b 784 _ #c h+1", "float", "m.f")
    assert shape is not None
    h_plus_1 = sizes.add(Sym("h", "m.f"), 1)  # a jaxtyping size expression
    assert shape.dims == (Var("batch", "m.f"), Sym("b", "m.f"), 784, None, None, h_plus_1)
    assert decode(encode(shape)) == shape
    rigid = {("b", "m.f", False): Sym("b", "owner")}
    assert restrict(shape, rigid).dims == (Var(None, ""), Sym("b", "owner"), 784, None, None, None)
