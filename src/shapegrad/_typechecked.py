"""``sg.typechecked``: run-time shape/dtype checking of annotated functions, readable errors.

The decorator is ``jaxtyping.jaxtyped(typechecker=beartype)`` (so plain type
hints are checked and ``isinstance(x, Float[Tensor, "b h"])`` inside the body
sees the argument dims), plus shapegrad's own pass over the tensor-typed
arguments and the return value. That pass checks ``TList``/``ParamList``
arguments element by element with the same dim bindings as the other
arguments, and a failure raises :class:`ShapeTypeError` naming the argument,
the expected spec, the actual shape and the dims bound so far.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import jaxtyping
from beartype import beartype

from shapegrad import _specs
from shapegrad.shapes import describe_caller
from shapegrad.typing import TList

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["ShapeTypeError", "typechecked"]


class ShapeTypeError(TypeError):
    """An argument or return value of a ``@sg.typechecked`` function does not match its annotation."""


@dataclass
class _Mismatch(Exception):
    where: str  # "argument 'x'", "argument 'p' element 1 ('b1')", "the return value"
    expected: str
    actual: str
    reason: str
    bindings: str


def _is_container(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, TList) and hint.__sg_specs__ is not None


def _optional_inner(hint: Any) -> Any:
    """``X`` for ``X | None`` / ``Optional[X]``, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


def handles(hint: Any) -> bool:
    """True when shapegrad's checker understands ``hint`` completely."""
    if _specs.is_tensor_annotation(hint) or _is_container(hint):
        return True
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return bool(args) and all(a is Ellipsis or handles(a) for a in args)
    inner = _optional_inner(hint)
    return inner is not None and handles(inner)


def _fail(where: str, expected: str, value: Any, reason: str, b: _specs.Bindings) -> _Mismatch:
    return _Mismatch(where, expected, _specs.describe_value(value), reason, b.describe())


def check(hint: Any, value: Any, b: _specs.Bindings, where: str, symbolic: bool = True) -> None:
    """Check ``value`` against a hint accepted by :func:`handles`; raise _Mismatch on failure."""
    if _specs.is_tensor_annotation(hint):
        spec = _specs.parse_annotation(hint)
        before = b.copy()
        reason = _specs.match(spec, value, b, symbolic=symbolic)
        if reason is not None:
            raise _fail(where, spec.describe(), value, reason, before)
    elif _is_container(hint):
        if not isinstance(value, hint):
            reason = "not an instance of that class (wrap plain tuples: Cls(tensors))"
            raise _fail(where, hint.__name__, value, reason, b)
        for i, (spec, element) in enumerate(zip(hint.__sg_specs__ or (), value, strict=False)):
            label = f"{where} {value._element_label(i)}"
            check(spec.annotation, element, b, label, symbolic)
    elif typing.get_origin(hint) is tuple:
        _check_tuple(hint, value, b, where, symbolic)
    else:
        inner = _optional_inner(hint)
        if value is not None:
            check(inner, value, b, where, symbolic)


def _check_tuple(hint: Any, value: Any, b: _specs.Bindings, where: str, symbolic: bool) -> None:
    args = typing.get_args(hint)
    if not isinstance(value, tuple):
        raise _fail(where, str(hint), value, "it is not a tuple", b)
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(value)
    if len(args) != len(value):
        raise _fail(where, str(hint), value, f"it has {len(value)} elements, not {len(args)}", b)
    for i, (h, v) in enumerate(zip(args, value, strict=True)):
        check(h, v, b, f"{where}[{i}]", symbolic)


def _message(name: str, m: _Mismatch) -> str:
    return (
        f"{name}: {m.where} expected {m.expected}, got {m.actual}: {m.reason}. "
        f"Dim bindings: {m.bindings}{describe_caller()}"
    )


def _summary(error: Exception) -> str:
    """jaxtyping's message without its dump of every argument value."""
    text = str(error).split("----------------------")[0].strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _clone_without_return(fn: Any, hints: dict[str, Any]) -> Any:
    """A copy of ``fn`` whose annotations are the resolved ``hints`` (for jaxtyping/beartype)."""
    clone = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__qualname__ = fn.__qualname__
    clone.__module__ = fn.__module__
    clone.__annotations__ = hints
    return clone


def typechecked(fn: F) -> F:
    """Check a function's annotated arguments and return value at every call.

    Tensor annotations (``Float[Tensor, "b 784"]``), ``TList``/``ParamList``
    types and tuples of them are checked by shapegrad with one set of dim
    bindings; everything else by beartype (via ``jaxtyping.jaxtyped``). Any
    failure is a :class:`ShapeTypeError` (a TypeError).

    Example:
        >>> @sg.typechecked
        ... def layer(x: Float[Tensor, "b i"], w: Float[Tensor, "o i"]) -> Float[Tensor, "b o"]:
        ...     return x @ w.T
        >>> layer(sg.tensor(np.ones((4, 3))), sg.tensor(np.ones((5, 2))))
        ShapeTypeError: layer: argument 'w' expected Float[Tensor, 'o i'], got float32 tensor
        of shape [5, 2]: dimension 1 ('i') is 2 but 'i' is already bound to 3. Dim bindings: b=4, i=3
    """
    if not inspect.isfunction(fn):
        raise TypeError(f"sg.typechecked decorates functions, got {fn!r}")
    name = fn.__qualname__
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as error:  # string annotations naming a function-local type
        raise TypeError(
            f"sg.typechecked({name}): cannot resolve an annotation ({error}); "
            "define the annotated types at module level"
        ) from error
    arg_hints = {k: h for k, h in hints.items() if k != "return" and handles(h)}
    return_hint = hints.get("return", inspect.Signature.empty)
    ours_return = "return" in hints and handles(return_hint)
    kept = {k: h for k, h in hints.items() if not (k == "return" and ours_return)}
    inner = jaxtyping.jaxtyped(typechecker=beartype)(_clone_without_return(fn, kept))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bindings = _specs.Bindings()
        try:
            # Two passes: symbolic dims ('n+1') may use dims bound by later arguments.
            for symbolic in (False, True):
                for arg, hint in arg_hints.items():
                    check(hint, bound.arguments[arg], bindings, f"argument '{arg}'", symbolic)
        except _Mismatch as m:
            raise ShapeTypeError(_message(name, m)) from None
        try:
            out = inner(*args, **kwargs)
        except jaxtyping.TypeCheckError as error:
            raise ShapeTypeError(f"{name}: {_summary(error)}") from error
        if ours_return:
            try:
                check(return_hint, out, bindings, "the return value")
            except _Mismatch as m:
                raise ShapeTypeError(_message(name, m)) from None
        return out

    return cast(F, wrapper)
