"""``sg.custom_jvp``: a function whose forward-mode derivative the user writes.

Forward mode in shapegrad is the transpose of reverse mode (``transforms.py``), so a JVP
rule is honoured by turning it into a VJP rule: the rule's tangent output is linear in the
tangents, ``t -> J t``, and its VJP in ``t`` is the transpose ``g -> J^T g``, exactly. The
function becomes a :class:`~shapegrad._custom_vjp.custom_vjp` whose backward pulls ``g``
back through ``t -> rule(primals, t)[1]``; ``linearize`` / ``jvp`` transpose that backward
again and recover ``J t``, and ``grad`` / ``vjp`` use ``J^T g`` (as JAX derives reverse
mode from a ``custom_jvp``). Eager, numpy, C and CUDA honour it as they honour
``custom_vjp``. The primal output is the function's own (the rule's primal output is
not used). The rule must be linear in the tangents, as JAX also requires.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from shapegrad import autodiff, tree
from shapegrad._custom_vjp import custom_vjp
from shapegrad.ops import prims
from shapegrad.ops.eager import STATE
from shapegrad.tensor import Tensor
from shapegrad.transforms import _point

JvpRule = Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, Any]]


class custom_jvp:  # a decorator, spelled like JAX's
    """Give a function a hand-written JVP rule, honoured by forward and reverse mode.

    Example (a log(1 + exp(x)) whose derivative is the stable sigmoid):
        >>> @sg.custom_jvp
        ... def log1pexp(x):
        ...     return sg.log(1.0 + sg.exp(x))
        >>> _ = log1pexp.defjvp(lambda p, t: (log1pexp(p[0]), sg.sigmoid(p[0]) * t[0]))
        >>> sg.jvp(log1pexp, (sg.tensor([0.0]),), (sg.tensor([2.0]),))[1].numpy()
        array([1.], dtype=float32)

    ``rule(primals, tangents)`` gets two tuples (one entry per positional argument, the
    tangents shaped like the primals; an integer argument's tangent is zeros) and returns
    ``(output, tangent_output)``, the latter linear in ``tangents``.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.rule: JvpRule | None = None
        self._vjp = custom_vjp(fn)
        self._vjp.defvjp(self._fwd, self._bwd)

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", "function")

    def defjvp(self, rule: JvpRule) -> JvpRule:
        """Set the rule ``rule(primals, tangents) -> (output, tangent_output)``; returns it
        (so ``@f.defjvp`` works as a decorator)."""
        if not callable(rule):
            raise TypeError(f"custom_jvp {self._name}: defjvp(rule) takes a function")
        self.rule = rule
        return rule

    def __call__(self, *args: Any) -> Any:
        if self.rule is None:
            raise TypeError(
                f"custom_jvp {self._name}: no JVP rule defined; call "
                f"{self._name}.defjvp(rule) before calling it"
            )
        return self._vjp(*args)

    def _fwd(self, *args: Any) -> tuple[Any, Any]:
        return self.fn(*args), args

    def _bwd(self, primals: tuple[Any, ...], g: Any) -> Sequence[Any]:
        """``J^T g``: the VJP of ``t -> rule(primals, t)[1]`` (linear in ``t``)."""
        structures = [tree.flatten(p) for p in primals]
        floats = [
            (i, k)
            for i, (leaves, _) in enumerate(structures)
            for k, leaf in enumerate(leaves)
            if isinstance(leaf, Tensor) and leaf.dtype.is_float
        ]

        def tangent_out(*ts: Tensor) -> Any:
            slots = [
                [prims.zeros_like(x) if isinstance(x, Tensor) else x for x in leaves]
                for leaves, _ in structures
            ]
            for (i, k), t in zip(floats, ts, strict=True):
                slots[i][k] = t
            tangents = tuple(
                tree.unflatten(td, slot) for slot, (_, td) in zip(slots, structures, strict=True)
            )
            assert self.rule is not None
            result = self.rule(tuple(primals), tangents)
            if not isinstance(result, tuple) or len(result) != 2:
                raise TypeError(
                    f"custom_jvp {self._name}: the rule must return (output, tangent_output), "
                    f"got {type(result).__name__}"
                )
            return result[1]

        # Any point gives the same (linear) pullback; each its own node, as in linearize:
        # equal constants would hash-cons into one graph node and merge their cotangents.
        points = [_point(structures[i][0][k]) for i, k in floats]
        previous = STATE.grad_enabled
        STATE.grad_enabled = True  # a backward pass turns recording off: the map needs it
        try:
            _, pullback = autodiff.vjp(tangent_out, *points)
        finally:
            STATE.grad_enabled = previous
        pulled = pullback(g)
        cts: list[list[Any]] = [[None] * len(leaves) for leaves, _ in structures]
        for (i, k), ct in zip(floats, pulled, strict=True):
            cts[i][k] = ct
        return tuple(
            None if all(c is None for c in slot) else tree.unflatten(td, slot)
            for slot, (_, td) in zip(cts, structures, strict=True)
        )


__all__ = ["custom_jvp"]
