"""Shape buckets for ``sg.compile``: pad one varying length up to a few fixed sizes.

``sg.compile(f, buckets={"t": (16, 32, 64)})`` (or ``buckets={("ids", 1): (16, 32, 64)}``)
compiles ``f`` at most once per bucket instead of once per length.

Contract (exact, not approximate):

* Every bucketed dim names ONE varying length ``n``: all the (argument, axis) pairs the
  keys select must have the same size ``n`` at a call (else ``ValueError``).
* Those axes are padded *at the end* with zeros up to the smallest bucket ``>= n``; a length
  above the largest bucket raises ``ValueError`` (it never compiles an unbucketed shape).
* The function sees the padded inputs. Its outputs at positions ``< n`` are exact when it
  is *causal* along the dim (position ``i`` reads only positions ``<= i``: causal
  attention, a left-to-right scan), since the zeros are after them. A function that mixes
  positions otherwise (a mean over time, bidirectional attention) must mask with the true
  length: ``length_arg="n"`` passes ``n`` to the keyword parameter ``n`` as an int32 scalar
  tensor (a graph input: a new length does not retrace), e.g.
  ``mask = sg.arange(t) < n``.
* ``out_axis=k`` slices every output back to ``n`` along axis ``k`` (each output must have
  the bucket's size there, else ``ValueError``); with ``out_axis=None`` outputs keep the
  padded size and the caller slices them (with the true length it knows).

Keys: a string is a dim name from the function's jaxtyping annotations
(``ids: Int[Tensor, "b t"]`` -> ``"t"`` is axis 1 of ``ids``, and of every other annotated
argument that names ``t``); a pair ``(argument, axis)`` names an argument by parameter name
(or positional index) and an axis (negative counts from the end). A bucketed argument must
be an array or tensor, not a container. Called inside another trace (a compiled
function calling it) it runs on the exact shapes, inlined, with the true length.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, get_type_hints

import numpy as np

from shapegrad import tree
from shapegrad._specs import is_tensor_annotation, parse_annotation
from shapegrad.ops.eager import EAGER
from shapegrad.ops.protocol import AVal
from shapegrad.tensor import Tensor

BucketKey: TypeAlias = "str | tuple[str | int, int]"


def _annotated_axes(fn: Callable[..., Any]) -> dict[str, list[tuple[str, int]]]:
    """Dim name -> the (parameter, axis) pairs whose annotation names it at a fixed axis."""
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: no named dims to offer
        return {}
    found: dict[str, list[tuple[str, int]]] = {}
    for param, annotation in hints.items():
        if param == "return" or not is_tensor_annotation(annotation):
            continue
        dims = parse_annotation(annotation).dims or ()
        runs = [i for i, d in enumerate(dims) if d.kind in ("variadic", "anon_variadic")]
        for i, d in enumerate(dims):
            if d.kind != "named":
                continue
            if runs and runs[0] < i:  # after a *run: its axis counts from the end
                if any(r > i for r in runs):
                    continue
                axis = i - len(dims)
            else:
                axis = i
            found.setdefault(d.name, []).append((param, axis))
    return found


class BucketPlan:
    """The validated bucket spec of one function: which axes vary, their buckets, the contract."""

    def __init__(
        self,
        fn: Callable[..., Any],
        buckets: Mapping[Any, Sequence[int]],
        length_arg: str | None,
        out_axis: int | None,
    ) -> None:
        name = getattr(fn, "__name__", "fn")
        self.where = f"sg.compile({name}, buckets=...)"
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        params = list(self.signature.parameters) if self.signature is not None else []
        if not isinstance(buckets, Mapping) or not buckets:
            raise TypeError(
                f"{self.where}: buckets must be a non-empty dict from a dim (a dim name of the "
                "annotations, or an (argument, axis) pair) to bucket sizes, got "
                f"{buckets!r}"
            )
        sizes_seen: set[tuple[int, ...]] = set()
        self.targets: list[tuple[str, int]] = []
        named = _annotated_axes(fn)
        for key, sizes in buckets.items():
            sizes_seen.add(self._check_sizes(key, sizes))
            self.targets += self._resolve(key, params, named)
        if len(sizes_seen) != 1:
            raise ValueError(
                f"{self.where}: every key names the same varying length, so they need the same "
                f"bucket sizes; got {sorted(sizes_seen)}"
            )
        (self.sizes,) = sizes_seen
        if length_arg is not None and self.signature is not None:
            kinds = [p.kind for p in self.signature.parameters.values()]
            if length_arg not in params and inspect.Parameter.VAR_KEYWORD not in kinds:
                raise ValueError(
                    f"{self.where}: length_arg={length_arg!r} is not a parameter of {name}; "
                    f"its parameters are {params}"
                )
        self.length_arg = length_arg
        self.out_axis = out_axis

    def _check_sizes(self, key: Any, sizes: Sequence[int]) -> tuple[int, ...]:
        ok = isinstance(sizes, tuple | list) and len(sizes) > 0
        ok = ok and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
        if not ok or list(sizes) != sorted(set(sizes)):
            raise ValueError(
                f"{self.where}: the buckets of {key!r} must be a non-empty increasing tuple of "
                f"positive ints, e.g. (64, 128, 256); got {sizes!r}"
            )
        return tuple(sizes)

    def _resolve(
        self, key: Any, params: list[str], named: dict[str, list[tuple[str, int]]]
    ) -> list[tuple[str, int]]:
        if isinstance(key, str):
            if key not in named:
                raise ValueError(
                    f"{self.where}: {key!r} is not a dim name of the function's tensor "
                    f"annotations; the named dims are {sorted(named) or 'none'} (or name an "
                    "axis as an (argument, axis) pair)"
                )
            return named[key]
        if (
            isinstance(key, tuple)
            and len(key) == 2
            and isinstance(key[0], str | int)
            and isinstance(key[1], int)
        ):
            arg, axis = key
            if isinstance(arg, int):
                if not 0 <= arg < len(params):
                    raise ValueError(
                        f"{self.where}: argument index {arg} is out of range; the function "
                        f"has {len(params)} parameters {params}"
                    )
                arg = params[arg]
            if arg not in params:
                raise ValueError(
                    f"{self.where}: {arg!r} is not a parameter of the function; its "
                    f"parameters are {params}"
                )
            return [(arg, axis)]
        raise TypeError(
            f"{self.where}: a bucket key is a dim name (str) or an (argument, axis) pair, "
            f"got {key!r}"
        )

    # --- per call -------------------------------------------------------------------------

    def bucket_of(self, n: int) -> int:
        """The smallest bucket holding length ``n`` (ValueError above the largest)."""
        for size in self.sizes:
            if n <= size:
                return size
        raise ValueError(
            f"{self.where}: length {n} exceeds the largest bucket {self.sizes[-1]} (buckets "
            f"{self.sizes}); add a larger bucket"
        )

    def pad(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], int, int]:
        """The call's arguments padded to their bucket, the true length and the bucket."""
        assert self.signature is not None  # a named parameter resolved, so there is one
        bound = self.signature.bind_partial(*args, **kwargs)
        arrays: dict[tuple[str, int], np.ndarray] = {}
        lengths: dict[str, int] = {}
        for param, axis in self.targets:
            if param not in bound.arguments:
                continue  # a defaulted argument: nothing passed to pad
            array = _as_array(bound.arguments[param], param, self.where)
            if not -array.ndim <= axis < array.ndim:
                raise ValueError(
                    f"{self.where}: axis {axis} of {param!r} is out of range for its shape "
                    f"{list(array.shape)}"
                )
            arrays[(param, axis)] = array
            lengths[f"{param} axis {axis}"] = int(array.shape[axis])
        if not lengths:
            raise TypeError(
                f"{self.where}: none of the bucketed arguments "
                f"{sorted({p for p, _ in self.targets})} was passed"
            )
        if self.length_arg is not None and self.length_arg in bound.arguments:
            raise TypeError(
                f"{self.where}: {self.length_arg!r} is the length_arg, which the compiled "
                "function passes itself (the true length); do not pass it"
            )
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"{self.where}: the bucketed axes must share one length, got "
                + ", ".join(f"{k}: {v}" for k, v in lengths.items())
            )
        n = next(iter(lengths.values()))
        size = self.bucket_of(n)
        padded: dict[str, np.ndarray] = {}
        for (param, axis), array in arrays.items():
            array = padded.get(param, array)
            widths = [(0, 0)] * array.ndim
            widths[axis] = (0, size - array.shape[axis])
            padded[param] = np.pad(array, widths) if size != array.shape[axis] else array
        bound.arguments.update(padded)
        call_kwargs = dict(bound.kwargs)
        if self.length_arg is not None:
            call_kwargs[self.length_arg] = n
        return tuple(bound.args), call_kwargs, n, size

    def unpad(self, out: Any, n: int, size: int) -> Any:
        """Slice every output back to ``n`` along ``out_axis`` (when given)."""
        if self.out_axis is None:
            return out
        leaves, td = tree.flatten(out)
        return tree.unflatten(td, [self._slice(leaf, n, size) for leaf in leaves])

    def _slice(self, leaf: Any, n: int, size: int) -> Any:
        axis = self.out_axis
        assert axis is not None
        if not isinstance(leaf, Tensor) or not -leaf.ndim <= axis < leaf.ndim:
            shape = list(leaf.shape) if isinstance(leaf, Tensor) else type(leaf).__name__
            raise ValueError(
                f"{self.where}: out_axis={axis} but an output has shape {shape}; every output "
                "needs that axis (pass out_axis=None and slice with the true length instead)"
            )
        if leaf.shape[axis] != size:
            raise ValueError(
                f"{self.where}: out_axis={axis} but an output of shape {list(leaf.shape)} is "
                f"not {size} (the bucket) along it, so it is not bucketed along that axis "
                "(pass out_axis=None and slice with the true length instead)"
            )
        index = [slice(None)] * leaf.ndim
        index[axis] = slice(0, n)
        array = leaf.numpy()[tuple(index)]
        return Tensor(EAGER, array, AVal(tuple(array.shape), leaf.dtype))


def _as_array(value: Any, param: str, where: str) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple) and not any(isinstance(v, Tensor) for v in value):
        return np.asarray(value)
    raise TypeError(
        f"{where}: the bucketed argument {param!r} must be an array or a tensor, got "
        f"{type(value).__name__}"
    )


class Bucketed:
    """A compiled function whose varying length is padded to buckets (see module docstring).

    Calls go to one :class:`~shapegrad.jit.Compiled` (``.compiled``) with padded inputs, so
    ``trace_count`` is at most the number of buckets per other signature.
    """

    def __init__(self, compiled: Any, plan: BucketPlan) -> None:
        self.compiled = compiled
        self.plan = plan
        self.__wrapped__ = compiled.fn
        self.__name__ = getattr(compiled.fn, "__name__", "fn")
        self.__doc__ = compiled.fn.__doc__

    @property
    def trace_count(self) -> int:
        return int(self.compiled.trace_count)

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.plan.sizes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, Tensor) and x.is_traced for x in tree.flatten((args, kwargs))[0]):
            return self._inline(args, kwargs)
        padded, call_kwargs, n, size = self.plan.pad(args, kwargs)
        return self.plan.unpad(self.compiled(*padded, **call_kwargs), n, size)

    def _inline(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called inside another trace: shapes are fixed there, so call ``fn`` on the exact
        shapes (no padding, nothing to slice), with the true length when it takes one."""
        if self.plan.length_arg is None:
            return self.compiled.fn(*args, **kwargs)
        assert self.plan.signature is not None
        bound = self.plan.signature.bind_partial(*args, **kwargs)
        param, axis = next((p, a) for p, a in self.plan.targets if p in bound.arguments)
        n = int(np.shape(bound.arguments[param])[axis])
        return self.compiled.fn(*args, **kwargs, **{self.plan.length_arg: n})

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``Compiled.lower`` for these arguments padded to their bucket."""
        padded, call_kwargs, _, _ = self.plan.pad(args, kwargs)
        return self.compiled.lower(*padded, **call_kwargs)

    def graph(self, *args: Any, **kwargs: Any) -> Any:
        """The optimized graph of these arguments' bucket."""
        return self.lower(*args, **kwargs).graph

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """``Compiled.trace`` for these arguments padded to their bucket."""
        padded, call_kwargs, _, _ = self.plan.pad(args, kwargs)
        return self.compiled.trace(*padded, **call_kwargs)

    def stats(self, *args: Any, **kwargs: Any) -> Any:
        """``Compiled.stats`` of these arguments' bucket."""
        padded, call_kwargs, _, _ = self.plan.pad(args, kwargs)
        return self.compiled.stats(*padded, **call_kwargs)


__all__ = ["BucketPlan", "Bucketed"]
