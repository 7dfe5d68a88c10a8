"""Typed containers (TList/ParamList), annotation-driven init, and sg.typechecked."""

# jaxtyping shape strings are not Python forward references:

import math

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import Bool, Float, Int, ParamList, Shaped, Tensor, TList
from shapegrad.nn import init

Params = ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"]]


class MLP(
    ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"], Float[Tensor, "1 h"], Float[Tensor, "1"]]
):
    names = ("w1", "b1", "w2", "b2")


def _t(*shape: int, dtype: str = "float32", seed: int = 0) -> Tensor:
    values = np.random.default_rng(seed).standard_normal(shape)
    return sg.tensor(values.astype(dtype), dtype=dtype)


def _he_reference(seed: int, index: int, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, index])))
    return rng.normal(0.0, math.sqrt(2.0 / shape[1]), size=shape).astype(np.float32)


# --- jaxtyping annotations on Tensor ------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "is_float", "is_int", "is_bool"),
    [
        ("float16", True, False, False),
        ("float32", True, False, False),
        ("float64", True, False, False),
        ("int32", False, True, False),
        ("bool", False, False, True),
    ],
)
def test_jaxtyping_dtype_checks_on_tensor(
    dtype: str, is_float: bool, is_int: bool, is_bool: bool
) -> None:
    x = sg.tensor(np.zeros((2, 3)), dtype=dtype)
    assert isinstance(x, Float[Tensor, "a b"]) == is_float
    assert isinstance(x, Int[Tensor, "a b"]) == is_int
    assert isinstance(x, Bool[Tensor, "a b"]) == is_bool
    assert isinstance(x, Shaped[Tensor, "a b"])
    assert not isinstance(x, Shaped[Tensor, "a"])


# --- ParamList construction from annotations --------------------------------------------


def test_init_builds_shapes_from_annotation_and_dims() -> None:
    params = Params.init(init.kaiming, seed=4, h=16)
    assert type(params) is Params
    assert [p.shape for p in params] == [(16, 2), (16,)]
    assert all(p.dtype == sg.float32 for p in params)
    # Element i is drawn with seed (seed, i); biases are zero under kaiming.
    np.testing.assert_array_equal(params[0].numpy(), _he_reference(4, 0, (16, 2)))
    np.testing.assert_array_equal(params[1].numpy(), np.zeros(16, np.float32))
    assert params.requires_grad == (True, True)
    assert params.names == ("p0", "p1")
    assert params.dims() == {"h": 16}
    w, b = params  # tuple semantics
    assert w is params[0] and b is params[1]


def test_init_is_reproducible_per_seed() -> None:
    a, b, c = (MLP.init(init.kaiming, seed=s, h=8) for s in (1, 1, 2))
    for x, y in zip(a.numpy(), b.numpy(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(a[0].numpy(), c[0].numpy())
    # Elements draw independent streams even with equal shapes and one seed.
    two = ParamList[Float[Tensor, "h h"], Float[Tensor, "h h"]].init(init.normal(), h=3)
    assert not np.allclose(two[0].numpy(), two[1].numpy())


def test_init_variadic_symbolic_dtype_and_per_element_initializers() -> None:
    P = ParamList[Float[Tensor, "*batch h"], Float[Tensor, "h+1"], Int[Tensor, "h"]]
    p = P.init([init.normal(std=0.1), init.ones, init.zeros], dtype="float64", batch=(2, 3), h=4)
    assert [t.shape for t in p] == [(2, 3, 4), (5,), (4,)]
    assert [t.dtype for t in p] == [sg.float64, sg.float64, sg.int32]
    np.testing.assert_array_equal(p[1].numpy(), np.ones(5))
    assert p.requires_grad == (True, True, False)  # int buffers default to frozen
    assert p.dims() == {"h": 4, "batch": (2, 3)}


def test_missing_dim_is_named() -> None:
    with pytest.raises(ValueError, match="missing dim 'h'"):
        Params.init(init.kaiming)


def test_unknown_and_conflicting_dims_are_named() -> None:
    with pytest.raises(ValueError, match="unknown dim 'k'"):
        Params.init(init.kaiming, h=3, k=2)
    with pytest.raises(ValueError, match="conflicting values for dim 'h': 4 and 3"):
        Params.init(init.kaiming, dims={"h": 4}, h=3)
    with pytest.raises(ValueError, match="unknown dim 'x'"):
        ParamList[Float[Tensor, "h"]].init(init.zeros, h=2, x=1)


def test_requires_grad_length_mismatch_names_both_lengths() -> None:
    with pytest.raises(ValueError, match="3 flags but there are 2 parameters"):
        Params.init(init.kaiming, h=3, requires_grad=[True, False, True])
    with pytest.raises(ValueError, match="1 flags but there are 2 parameters"):
        Params([_t(3, 2), _t(3)], requires_grad=(True,))


def test_validation_error_names_element_spec_shape_and_bindings() -> None:
    with pytest.raises(sg.ShapeError) as info:
        MLP([_t(3, 2), _t(4), _t(1, 3), _t(1)])
    message = str(info.value)
    assert "element 1 ('b1')" in message
    assert "Float[Tensor, 'h']" in message
    assert "[4]" in message
    assert "h=3" in message
    assert "test_typing.py" in message  # the user's line


def test_validation_rejects_wrong_dtype_rank_and_count() -> None:
    with pytest.raises(sg.ShapeError, match="dtype is int32"):
        Params([_t(3, 2), _t(3, dtype="int32")])
    with pytest.raises(sg.ShapeError, match="rank is 1 but the spec has 2 dims"):
        Params([_t(6), _t(3)])
    with pytest.raises(sg.ShapeError, match="dimension 1 is 3 but the spec says 2"):
        Params([_t(3, 3), _t(3)])
    with pytest.raises(sg.ShapeError, match="expected 2 tensors, got 3"):
        Params([_t(3, 2), _t(3), _t(3)])


def test_names_flags_and_helpers() -> None:
    p = MLP.init(init.kaiming, seed=0, h=5)
    assert p.names == ("w1", "b1", "w2", "b2")
    frozen = p.freeze("b2", 1)
    assert frozen.requires_grad == (True, False, True, False)
    assert [t.shape for t in frozen.trainable()] == [(5, 2), (1, 5)]
    assert frozen.trainable_indices() == (0, 2)
    assert list(frozen.named()) == ["w1", "b1", "w2", "b2"]
    renamed = Params.init(init.zeros, h=2, names=("w", "b"))
    assert renamed.names == ("w", "b")
    with pytest.raises(AttributeError, match="immutable"):
        p.foo = 1  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="2 names for 4 parameters"):
        MLP.init(init.zeros, h=2, names=("a", "b"))


def test_class_names_length_is_checked() -> None:
    with pytest.raises(ValueError, match="1 names for 2 parameters"):

        class Bad(Params):  # type: ignore[valid-type, misc]
            names = ("w",)


def test_map_keeps_type_flags_and_checks_lengths() -> None:
    p = MLP.init(init.kaiming, seed=1, h=4).freeze("w2")
    doubled = p.map(lambda t, s: t * s, [2.0, 3.0, 4.0, 5.0])
    assert type(doubled) is MLP and doubled.requires_grad == p.requires_grad
    for scale, a, b in zip([2.0, 3.0, 4.0, 5.0], p.numpy(), doubled.numpy(), strict=True):
        np.testing.assert_allclose(b, a * scale)
    with pytest.raises(ValueError, match="length 1 for 4 elements"):
        p.map(lambda t, s: t, [1.0])
    with pytest.raises(sg.ShapeError, match="element 0"):
        p.map(lambda t: t.sum())


def test_subscripting_is_cached_by_content() -> None:
    assert ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"]] is Params
    assert ParamList[Float[Tensor, "h 2"]] is not ParamList[Float[Tensor, "h 3"]]
    assert isinstance(MLP.init(init.zeros, h=1), ParamList)
    with pytest.raises(TypeError, match="tensor annotation"):
        ParamList[int]


def test_tlist_validates_and_unsubscripted_accepts_anything() -> None:
    Pair = TList[Float[Tensor, "b"], Float[Tensor, "b"]]
    pair = Pair([_t(3), np.ones(3, np.float32)])
    assert isinstance(pair[1], Tensor)
    with pytest.raises(sg.ShapeError, match="element 1"):
        Pair([_t(3), _t(4)])
    anything = TList([_t(2), _t(3, 3)])
    assert len(anything) == 2


def test_grad_wrt_paramlist_returns_same_type_with_flags() -> None:
    x = _t(6, 2, seed=1)
    p = MLP.init(init.kaiming, seed=3, h=4).freeze("b2")

    def loss(p: MLP, x: Tensor) -> Tensor:
        w1, b1, w2, b2 = p
        return ((x @ w1.T + b1) @ w2.T + b2).sum()

    g = sg.grad(loss)(p, x)
    assert type(g) is MLP
    assert g.requires_grad == (True, True, True, False)
    assert g.names == p.names
    # Closed form of the linear model's gradient.
    xs, w1, w2 = x.numpy().astype(np.float64), p[0].numpy(), p[2].numpy()
    n = xs.shape[0]
    np.testing.assert_allclose(g[0].numpy(), w2.T @ xs.sum(0, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(g[1].numpy(), n * w2[0], rtol=1e-5)
    np.testing.assert_allclose(g[2].numpy(), (xs @ w1.T).sum(0, keepdims=True), rtol=1e-4)
    np.testing.assert_allclose(g[3].numpy(), [n], rtol=1e-6)


def test_tree_map_to_numpy_gives_plain_tuple() -> None:
    from shapegrad.tree import tree_map

    p = Params.init(init.ones, h=2)
    arrays = tree_map(lambda t: t.numpy() * 2, p)
    assert type(arrays) is tuple
    np.testing.assert_array_equal(arrays[1], np.full(2, 2.0))


# --- sg.typechecked -------------------------------------------------------------------


@sg.typechecked
def _layer(
    x: Float[Tensor, "b i"], w: Float[Tensor, "o i"], scale: float = 1.0
) -> Float[Tensor, "b o"]:
    assert isinstance(x @ w.T, Float[Tensor, "b o"])  # the body sees the argument dims
    return (x @ w.T) * scale


@sg.typechecked
def _model(p: Params, x: Float[Tensor, "b 2"]) -> Float[Tensor, "b h"]:
    w, b = p
    return x @ w.T + b


def test_typechecked_passes_valid_calls() -> None:
    x, w = _t(4, 3), _t(5, 3, seed=1)
    np.testing.assert_allclose(_layer(x, w, 2.0).numpy(), 2 * x.numpy() @ w.numpy().T, rtol=1e-5)
    p = Params.init(init.kaiming, h=7)
    assert _model(p, _t(3, 2)).shape == (3, 7)


def test_typechecked_message_names_argument_spec_shape_and_bindings() -> None:
    with pytest.raises(sg.ShapeTypeError) as info:
        _layer(_t(4, 3), _t(5, 2))
    message = str(info.value)
    assert isinstance(info.value, TypeError)
    assert "argument 'w'" in message
    assert "Float[Tensor, 'o i']" in message
    assert "shape [5, 2]" in message
    assert "b=4, i=3" in message
    assert "test_typing.py" in message


def test_typechecked_checks_paramlist_elements_against_other_arguments() -> None:
    p = Params.init(init.kaiming, h=7)
    with pytest.raises(sg.ShapeTypeError, match="argument 'p' expected"):
        _model((p[0], p[1]), _t(3, 2))  # a plain tuple is not a Params
    # An equal annotation written elsewhere is the same class, so it is accepted.
    same = ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"]]([_t(7, 2), _t(7)])
    assert _model(same, _t(3, 2)).shape == (3, 7)

    @sg.typechecked
    def uses_h(p: Params, y: Float[Tensor, " h"]) -> Float[Tensor, " h"]:
        return p[1] + y

    with pytest.raises(sg.ShapeTypeError) as info:
        uses_h(p, _t(6))
    assert "argument 'y'" in str(info.value) and "h=7" in str(info.value)


def test_typechecked_checks_return_values_and_plain_hints() -> None:
    @sg.typechecked
    def wrong(x: Float[Tensor, "b i"]) -> tuple[Float[Tensor, " b"], Float[Tensor, " i+1"]]:
        return x.sum(axis=1), x.sum(axis=0)

    with pytest.raises(sg.ShapeTypeError) as info:
        wrong(_t(2, 3))
    message = str(info.value)
    assert "return value[1]" in message and "'i+1' = 4" in message and "shape [3]" in message
    with pytest.raises(sg.ShapeTypeError, match="scale"):
        _layer(_t(4, 3), _t(5, 3), "fast")  # type: ignore[arg-type]


def test_typechecked_rejects_unresolvable_annotations() -> None:
    def f(x: "NotDefinedAnywhere") -> None:  # type: ignore[name-defined]  # noqa: F821
        return None

    with pytest.raises(TypeError, match="NotDefinedAnywhere"):
        sg.typechecked(f)


def test_compiled_grad_wrt_paramlist_keeps_type_with_traced_rebuild() -> None:
    x = _t(5, 2, seed=2)
    p = MLP.init(init.kaiming, seed=0, h=8).freeze("b2")

    @sg.typechecked
    def loss(p: MLP, x: Float[Tensor, "b 2"]) -> Float[Tensor, ""]:
        return (sg.nn.mlp(p, x) ** 2).mean()

    eager_value, eager_grads = sg.value_and_grad(loss)(p, x)
    value, grads = sg.compile(sg.value_and_grad(loss), backend="numpy")(p, x)
    assert type(grads) is MLP and grads.requires_grad == p.requires_grad
    np.testing.assert_allclose(np.asarray(value), eager_value.numpy(), rtol=1e-5)
    for a, b in zip(grads.numpy(), eager_grads.numpy(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
