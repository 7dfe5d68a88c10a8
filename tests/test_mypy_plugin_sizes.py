"""The plugin's size algebra, symbolic reshape/slice rules, op table and start-up cost.

Sizes are checked against plain integer arithmetic: every symbolic result,
evaluated at random values of its named dims, must equal the same computation
done on those integers (the independent reference), and ``differ`` must only
claim "certainly different" when the values differ at random points.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.mypy_plugin import algebra as A
from shapegrad.mypy_plugin import layers as L
from shapegrad.mypy_plugin import sizes as S
from shapegrad.mypy_plugin.algebra import Mismatch, Operand
from shapegrad.mypy_plugin.literals import UNKNOWN
from shapegrad.mypy_plugin.optable import OP_FULLNAMES
from shapegrad.mypy_plugin.parsing import parse_spec
from shapegrad.mypy_plugin.rules import FUNCTION_RULES
from shapegrad.mypy_plugin.spec import (
    Expr,
    Item,
    Sym,
    TShape,
    decode,
    encode,
    show_item,
)

RNG = np.random.default_rng(7)
B, T, C = Sym("b", "f"), Sym("t", "f"), Sym("c", "f")
CFG = Sym("cfg.n_embd", "~f")  # an opaque int


def value(item: Item, env: dict[Sym, int]) -> Fraction:
    """Evaluate a size at integer values of its names (the reference)."""
    if isinstance(item, int):
        return Fraction(item)
    if isinstance(item, Sym):
        return Fraction(env[item])
    assert isinstance(item, Expr), item
    total = Fraction(0)
    for atoms, coef in item.terms:
        term = coef
        for sym, power in atoms:
            term *= Fraction(env[sym]) ** power
        total += term
    return total


def random_size(depth: int = 0) -> Item:
    """A random size expression built with the algebra's own operations."""
    choice = int(RNG.integers(0, 7 if depth < 3 else 2))
    if choice == 0:
        return int(RNG.integers(1, 9))
    if choice == 1:
        return [B, T, C][int(RNG.integers(0, 3))]
    a, b = random_size(depth + 1), random_size(depth + 1)
    if choice == 2:
        return S.add(a, b)
    if choice == 3:
        return S.sub(a, b)
    if choice in (4, 5):
        return S.mul(a, b)
    return S.floordiv(a, int(RNG.integers(1, 5)))


def test_algebra_agrees_with_integer_arithmetic() -> None:
    for _ in range(300):
        a, b = random_size(), random_size()
        for _ in range(3):
            env = {s: int(RNG.integers(1, 50)) for s in (B, T, C)}
            va, vb = value(a, env), value(b, env)
            assert value(S.add(a, b), env) == va + vb
            assert value(S.sub(a, b), env) == va - vb
            assert value(S.mul(a, b), env) == va * vb
            # Literal ints divide as Python does; symbolic sizes are taken as exact multiples.
            want = Fraction(a // 4) if isinstance(a, int) else va / 4
            assert value(S.floordiv(a, 4), env) == want
        # normal form: equal values at many points <=> equal objects
        points = [{s: int(RNG.integers(1, 1000)) for s in (B, T, C)} for _ in range(4)]
        same = all(value(a, p) == value(b, p) for p in points)
        assert same == (a == b or (isinstance(a, int) and a == b)), (a, b)
        # "certainly different" is sound: never claimed for sizes that can be equal
        # (a compound size equated with other names is a relation, not a contradiction).
        if same:
            assert not S.differ(a, b), (show_item(a), show_item(b))
        if S.differ(a, b):
            assert all(value(a, p) != value(b, p) for p in points), (show_item(a), show_item(b))
        assert decode(encode(TShape((a, b)))) == TShape((a, b))


def test_what_certainly_differs() -> None:
    assert S.differ(B, T)  # distinct names of one signature: distinct dims (type variables)
    assert S.differ(S.mul(B, T), B) and S.differ(S.mul(4, C), C) and S.differ(T, S.sub(T, 1))
    assert S.differ(S.mul(S.mul(B, T), C), S.mul(B, C))  # a reshape that drops t
    assert S.differ(B, 784)
    # A compound size against other names is a relation the code may rely on.
    assert not S.differ(S.floordiv(C, 2), T)  # `z2 // 2` vs `z`
    assert not S.differ(S.mul(B, S.sub(T, S.floordiv(C, 2))), S.mul(B, S.floordiv(C, 2)))
    # Different sources (a signature's names vs a class's fields) may be one size.
    sig, cls = Sym("i", "m.f:1#s"), Sym("d_in", "m.f:1#m.Dense")
    assert not S.differ(sig, cls) and not S.differ(cls, 784)
    both = Sym("d_out", "m.f:1#m.Dense+s")
    assert S.differ(both, cls) and S.differ(both, 784)


def test_normal_form_and_display() -> None:
    assert S.mul(S.floordiv(C, 4), 4) == C
    assert S.sub(S.add(T, 1), 1) == T
    assert S.mul(B, T) == S.mul(T, B)
    assert show_item(S.mul(B, T)) == "b * t"
    assert show_item(S.sub(T, 1)) == "t - 1"
    assert show_item(S.floordiv(C, 4)) == "c // 4"
    assert show_item(S.mul(4, C)) == "4 * c"
    assert S.floordiv(7, 2) == 3 and S.floordiv(B, S.add(B, 1)) is None


def test_opaque_ints_never_differ_but_equal_themselves() -> None:
    assert not S.differ(CFG, 768)
    assert not S.differ(S.mul(4, CFG), C)
    assert not S.differ(S.mul(CFG, B), S.mul(B, CFG))
    assert S.differ(S.add(CFG, B), S.add(CFG, S.add(B, 1)))  # the opaque part cancels


def test_symbolic_reshape_counts() -> None:
    x = Operand("x", TShape((B, T, C), "float"))
    assert A.reshape(x, [S.mul(B, T), C]) == TShape((S.mul(B, T), C), "float")
    assert A.reshape(x, [B, T, 4, S.floordiv(C, 4)]) is not None
    assert A.reshape(x, [B, -1]) == TShape((B, S.mul(T, C)), "float")
    with pytest.raises(
        Mismatch, match=r"\(b \* c \* t elements\) into \[b, c\] \(b \* c elements\)"
    ):
        A.reshape(x, [B, C])
    assert A.reshape(x, [B, CFG]) is not None  # an opaque size: not certain, no error
    x4 = Operand("x", TShape((B, 32, 7, 7)))
    assert A.reshape(x4, [B, 32 * 7 * 7]) is not None
    with pytest.raises(Mismatch, match="1568 \\* b elements"):
        A.reshape(x4, [B, 32 * 14 * 14])


def test_symbolic_slices_follow_python_semantics() -> None:
    for size in (3, 7, 12):
        arr = np.zeros(size)
        for lo, hi in [(1, None), (None, -1), (2, 5), (-3, None), (None, 2)]:
            want = arr[lo:hi].shape[0]
            got = L.index(Operand("x", TShape((size,))), [slice(lo, hi)])
            assert got is not None and got.dims == (want,)
            # with a symbolic size the same bounds give a size that evaluates to it
            sym = L.index(Operand("x", TShape((T,))), [slice(lo, hi)])
            if size >= 5:  # bounds in range: the symbolic answer must agree
                assert sym is not None and value(sym.dims[0], {T: size}) == want
    assert L.index(Operand("w", TShape((1024, C))), [slice(None, T)]) == TShape((T, C))
    assert L.index(Operand("x", TShape((B, T))), [slice(None), slice(UNKNOWN, None)]) == TShape(
        (B, None)
    )


def test_conv_window_is_symbolic_at_stride_one() -> None:
    H = Sym("h", "f")
    got = L.conv2d(Operand("x", TShape((B, 3, H, H))), Operand("w", TShape((8, 3, 3, 3))),
                   None, (1, 1), (1, 1))  # fmt: skip
    assert got == TShape((B, 8, H, H))
    arr = sg.conv2d(sg.zeros((1, 3, 9, 9)), sg.zeros((8, 3, 3, 3)), padding=1)
    assert value(got.dims[2], {H: 9}) == arr.shape[2] if got is not None else False


def test_linear_rule_matches_runtime() -> None:
    x, w, b = sg.zeros((4, 5)), sg.zeros((3, 5)), sg.zeros((3,))
    got = L.linear(Operand("x", TShape((4, 5))), Operand("w", TShape((3, 5))),
                   Operand("b", TShape((3,))))  # fmt: skip
    assert got is not None and got.dims == sg.nn.linear(x, w, b).shape
    with pytest.raises(Mismatch, match=r"needs a weight \[out, 5\], got w \[5, 3\] \(5 != 3\)"):
        L.linear(Operand("x", TShape((4, 5))), Operand("w", TShape((5, 3))), None)
    with pytest.raises(sg.ShapeError):
        sg.nn.linear(x, sg.zeros((5, 3)))


def test_op_table_names_where_each_op_is_defined() -> None:
    """The static table (the plugin must not import shapegrad) agrees with the runtime."""
    runtime = {}
    for name in FUNCTION_RULES:
        fn = getattr(sg, name, None) or getattr(sg.nn, name, None)
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        if module and qualname:
            runtime[f"{module}.{qualname}"] = name
    missing = {
        k: v for k, v in runtime.items() if v == k.rsplit(".", 1)[1] and k not in OP_FULLNAMES
    }
    assert missing == {}
    assert set(OP_FULLNAMES.values()) <= set(FUNCTION_RULES)


def test_fast_entry_point_does_not_import_the_runtime() -> None:
    code = (
        "import sys, shapegrad_mypy; "
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.split('.')[0] == 'shapegrad'))"
    )
    src = str(Path(__file__).parent.parent / "src")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": src, "PATH": ""},
    )
    assert out.stdout.strip() == "[]"
    assert callable(__import__("shapegrad_mypy").plugin)


def test_spec_size_expressions_parse_like_python() -> None:
    for text in ["3*c", "c+1", "2*(t-1)", "c//4", "b*t*c", "4*c-c", "(b+t)*(b-t)"]:
        item = S.parse(text, "f")
        for _ in range(5):
            env = {s: int(RNG.integers(1, 40)) * 4 for s in (B, T, C)}
            want = eval(text.replace("//", "/"), {}, {s.name: Fraction(v) for s, v in env.items()})
            assert value(item, env) == want, text
    assert S.parse("3*_c", "f") is None and S.parse("c+", "f") is None
    shape = parse_spec("b 3*c c+1", "float", "f")
    assert shape is not None and shape.dims == (B, S.mul(3, C), S.add(C, 1))
