"""Optimizers as pure functions over parameter/state trees, written once against Tensor.

An optimizer never mutates anything: ``update(params, grads, state)`` returns
new parameters and a new state. Because every line is a Tensor operation the
same code runs eagerly and is traced into a compiled training step.

The state is a dict: ``"step"`` (an int32 scalar, the number of updates
applied so far) plus one entry per *slot* (``"momentum"``, ``"m"``, ``"v"``),
each shaped like the parameters (same container, same leaves).

Frozen parameters (``requires_grad`` False) are returned unchanged, and so are
their slots.

Example:
    >>> opt = sg.optim.Adam(lr=1e-3)
    >>> state = opt.init(params)
    >>> params, state = opt.update(params, grads, state)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad._fused import eager_kernel
from shapegrad.dtypes import float32, int32
from shapegrad.functional import minimum
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor
from shapegrad.train import _checks

OptState = dict[str, Any]
LRLike = float | Tensor


def trainable_flags(params: Any, override: Sequence[bool] | None = None) -> tuple[bool, ...]:
    """One ``requires_grad`` flag per parameter leaf.

    Args:
        params: a ParamList/TList (its ``requires_grad`` flags are used when present),
            a list/tuple/dict of tensors, or a single tensor.
        override: explicit flags; must have one entry per leaf.
    Returns:
        A tuple of booleans, one per leaf of ``params`` in flatten order.
    Raises:
        ValueError: the number of flags differs from the number of parameters.
    """
    leaves, _ = tree.flatten(params)
    # Without an override: the flags of every ParamList/Module inside (nested ones too),
    # so batch-norm running statistics inside a model stay untouched by optimizers.
    flags: Any = override if override is not None else tree.leaf_flags(params)
    result = tuple(bool(f) for f in flags)
    if len(result) != len(leaves):
        raise ValueError(
            f"requires_grad has {len(result)} flags but there are {len(leaves)} parameters; "
            "give exactly one flag per parameter"
        )
    return result


def _scalar(value: LRLike, like: Tensor) -> Tensor:
    """``value`` as a 0-d tensor with ``like``'s dtype, on ``like``'s interpreter."""
    if isinstance(value, Tensor):
        return p.cast(value, like.dtype)
    return p.constant(np.asarray(value), like.dtype, like=like)


def _zeros_like(x: Tensor) -> Tensor:
    """Zeros shaped like ``x``. Eager tensors get a real buffer, so state is materialised."""
    if x.is_traced:
        return p.zeros_like(x)
    return tensor(np.zeros(x.shape, x.dtype.numpy))


def _step_tensor(state: OptState, step: Tensor | int | None) -> Tensor:
    """The 1-based index of the update about to be applied (int32 scalar)."""
    if step is not None:
        return step if isinstance(step, Tensor) else tensor(np.int32(step))
    count: Tensor = state["step"]
    return count + 1


def global_norm(grads: Sequence[Tensor]) -> Tensor:
    """sqrt(sum of squares) over all ``grads`` (in the dtype of the first one)."""
    if not grads:
        raise ValueError("global_norm: no gradients")
    dtype = grads[0].dtype
    total = p.cast((grads[0] * grads[0]).sum(), dtype)
    for g in grads[1:]:
        total = total + p.cast((g * g).sum(), dtype)
    return total.sqrt()


def clip_by_global_norm(grads: Sequence[Tensor], max_norm: float) -> list[Tensor]:
    """Scale all ``grads`` by ``min(1, max_norm / global_norm)`` (one factor for all).

    Args:
        grads: gradient tensors (the trainable ones).
        max_norm: the largest allowed global L2 norm (> 0).
    Returns:
        The rescaled gradients, same shapes and dtypes.
    Example:
        >>> clip_by_global_norm([sg.tensor([3.0, 4.0])], 1.0)[0].numpy()
        array([0.6, 0.8], dtype=float32)
    """
    _checks.real("clip_by_global_norm", "max_norm", max_norm, 0.0, low_open=True)
    if not grads:
        return []
    norm = global_norm(grads)
    # The tiny epsilon keeps a zero gradient at zero instead of 0 * inf.
    scale = minimum(max_norm / (norm + 1e-12), 1.0)
    return [g * p.cast(scale, g.dtype) for g in grads]


@dataclass(frozen=True)
class Optimizer:
    """Base class: subclasses name their slots and implement ``_update_leaf``."""

    lr: float

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # The PyTorch habit `Adam(model.parameters(), lr=...)`: say how this API works
        # instead of "got multiple values for argument 'lr'" (or, worse, lr=params).
        if args and not isinstance(args[0], int | float | Tensor | np.floating | np.integer):
            raise TypeError(
                f"sg.optim.{cls.__name__} is a functional optimizer and does not take the "
                f"parameters (got a {type(args[0]).__name__}). Create it from hyper-parameters "
                f"only, `opt = sg.optim.{cls.__name__}(lr=1e-3)`, then either "
                "`ScalarTrainer(loss, params, optimizer=opt)`, or `state = opt.init(params)` and "
                "`params, state = opt.update(params, grads, state)` each step"
            )
        return super().__new__(cls)

    def __post_init__(self) -> None:
        # lr >= 0 and finite (a traced 0-d tensor is checked by the trainer's step instead)
        _checks.real(f"sg.optim.{type(self).__name__}", "lr", self.lr, 0.0)

    @property
    def slots(self) -> tuple[str, ...]:
        """Names of the per-parameter state buffers (none for plain SGD)."""
        return ()

    def config_key(self) -> tuple[Any, ...]:
        """Everything that shapes the compiled update except the learning rate."""
        cached: tuple[Any, ...] | None = self.__dict__.get("_config_key")
        if cached is None:  # memoised: the trainer looks it up on every step
            values = tuple((f.name, getattr(self, f.name)) for f in fields(self) if f.name != "lr")
            cached = (type(self).__name__, values)
            object.__setattr__(self, "_config_key", cached)
        return cached

    def init(self, params: Any) -> OptState:
        """A fresh state for ``params``: step 0 and zero-filled slots shaped like the params."""
        leaves, treedef = tree.flatten(params)
        state: OptState = {"step": tensor(np.int32(0))}
        for slot in self.slots:
            state[slot] = tree.unflatten(treedef, [_zeros_like(_as_tensor(x)) for x in leaves])
        return state

    def update(
        self,
        params: Any,
        grads: Any,
        state: OptState,
        lr: LRLike | None = None,
        step: Tensor | int | None = None,
        requires_grad: Sequence[bool] | None = None,
    ) -> tuple[Any, OptState]:
        """Apply one update.

        Args:
            params: the parameter tree (ParamList, list, dict...).
            grads: gradients with the same structure as ``params``.
            state: from :meth:`init` or a previous ``update``.
            lr: learning rate (float or 0-d tensor); defaults to ``self.lr``.
            step: 1-based index of this update; defaults to ``state["step"] + 1``.
            requires_grad: per-leaf flags; defaults to the flags of ``params``.
        Returns:
            ``(new_params, new_state)`` with the structures of ``params`` and ``state``.
        """
        p_leaves, treedef = tree.flatten(params)
        g_leaves, g_def = tree.flatten(grads)
        if len(g_leaves) != len(p_leaves):
            raise ValueError(
                f"{type(self).__name__}.update: {len(g_leaves)} gradients for {len(p_leaves)} parameters"
            )
        flags = trainable_flags(params, requires_grad)
        _check_grad_shapes(type(self).__name__, params, p_leaves, g_leaves)
        slot_leaves = [tree.flatten(state[s])[0] for s in self.slots]
        t = _step_tensor(state, step)
        rate = self.lr if lr is None else lr
        new_p, new_slots = _update_leaves(self, p_leaves, g_leaves, slot_leaves, rate, t, flags)
        new_state: OptState = {"step": p.cast(t, int32)}
        for slot, values in zip(self.slots, new_slots, strict=True):
            new_state[slot] = tree.unflatten(treedef, values)
        return tree.unflatten(treedef, new_p), new_state

    def _update_leaf(
        self, x: Tensor, g: Tensor, slots: tuple[Tensor, ...], lr: Tensor, t: Tensor
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        raise NotImplementedError


@eager_kernel("optimizer_update")
def _update_leaves(
    opt: Optimizer,
    params: list[Any],
    grads: list[Any],
    slots: list[list[Any]],
    rate: LRLike,
    t: Tensor,
    flags: Sequence[bool],
) -> tuple[list[Any], list[list[Any]]]:
    """``Optimizer.update``'s loop over the leaves: new parameters and new slots (eagerly
    one native call for every leaf, ``eager_kernel``, instead of ~15 NumPy calls a leaf)."""
    new_p: list[Any] = []
    new_slots: list[list[Any]] = [[] for _ in opt.slots]
    for k, (x, g) in enumerate(zip(params, grads, strict=True)):
        old = tuple(s[k] for s in slots)
        if flags[k]:
            x, updated = opt._update_leaf(x, p.cast(g, x.dtype), old, _scalar(rate, x), t)
        else:
            updated = old
        new_p.append(x)
        for j, value in enumerate(updated):
            new_slots[j].append(value)
    return new_p, new_slots


def _check_grad_shapes(
    name: str, params: Any, p_leaves: Sequence[Any], g_leaves: Sequence[Any]
) -> None:
    """Refuse a gradient whose shape differs from its parameter's (it would broadcast)."""
    for k, (x, g) in enumerate(zip(p_leaves, g_leaves, strict=True)):
        if tuple(np.shape(g)) != tuple(np.shape(x)):
            label = tree.leaf_paths(params)[k]
            raise ShapeError(
                f"{name}.update",
                f"the gradient of parameter {label!r} has shape {fmt(tuple(np.shape(g)))} but the "
                f"parameter is {fmt(tuple(np.shape(x)))}; gradients must match their parameters",
            )


def _as_tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else tensor(np.asarray(x))


@dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay.

    ``g += weight_decay * p; buf = momentum * buf + g; p -= lr * (g + momentum * buf if
    nesterov else buf)`` (PyTorch's convention, no dampening).

    Example:
        >>> opt = sg.optim.SGD(lr=0.1, momentum=0.9, nesterov=True)
    """

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "sg.optim.SGD"
        _checks.real(owner, "momentum", self.momentum, 0.0)
        _checks.real(owner, "weight_decay", self.weight_decay, 0.0)
        if _checks.flag(owner, "nesterov", self.nesterov) and self.momentum <= 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")

    @property
    def slots(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def _update_leaf(
        self, x: Tensor, g: Tensor, slots: tuple[Tensor, ...], lr: Tensor, t: Tensor
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        if self.weight_decay:
            g = g + self.weight_decay * x
        if not self.momentum:
            return x - lr * g, ()
        buf = self.momentum * slots[0] + g
        direction = g + self.momentum * buf if self.nesterov else buf
        return x - lr * direction, (buf,)


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction (Kingma & Ba). ``weight_decay`` here is L2 (added to g).

    Example:
        >>> opt = sg.optim.Adam(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
    """

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = f"sg.optim.{type(self).__name__}"
        for name in ("beta1", "beta2"):
            _checks.real(owner, name, getattr(self, name), 0.0, 1.0, high_open=True)
        _checks.real(owner, "eps", self.eps, 0.0)
        _checks.real(owner, "weight_decay", self.weight_decay, 0.0)

    @property
    def slots(self) -> tuple[str, ...]:
        return ("m", "v")

    def _moments(
        self, g: Tensor, slots: tuple[Tensor, ...], t: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """New (m, v) and the bias-corrected step direction m_hat / (sqrt(v_hat) + eps)."""
        m = self.beta1 * slots[0] + (1.0 - self.beta1) * g
        v = self.beta2 * slots[1] + (1.0 - self.beta2) * (g * g)
        tf = p.cast(t, g.dtype)
        correction1 = 1.0 - self.beta1**tf
        correction2 = 1.0 - self.beta2**tf
        direction = (m / correction1) / ((v / correction2).sqrt() + self.eps)
        return m, v, direction

    def _update_leaf(
        self, x: Tensor, g: Tensor, slots: tuple[Tensor, ...], lr: Tensor, t: Tensor
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        if self.weight_decay:
            g = g + self.weight_decay * x
        m, v, direction = self._moments(g, slots, t)
        return x - lr * direction, (m, v)


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p -= lr * (adam + wd * p)``.

    Example:
        >>> opt = sg.optim.AdamW(lr=1e-3, weight_decay=0.01)
    """

    weight_decay: float = 0.01

    def _update_leaf(
        self, x: Tensor, g: Tensor, slots: tuple[Tensor, ...], lr: Tensor, t: Tensor
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        m, v, direction = self._moments(g, slots, t)
        if self.weight_decay:
            direction = direction + self.weight_decay * x
        return x - lr * direction, (m, v)


def is_finite_all(values: Sequence[Tensor]) -> Tensor:
    """A bool scalar: True when every element of every tensor is finite.

    ``sum(x) * 0`` is 0 for finite data and NaN as soon as one element is
    Inf/NaN, so one reduction per tensor suffices (and it compiles).
    """
    if not values:
        return p.constant(np.bool_(True), "bool")
    dtype = float32 if not values[0].dtype.is_float else values[0].dtype
    total = p.cast(values[0].sum(), dtype)
    for v in values[1:]:
        total = total + p.cast(v.sum(), dtype)
    return total * 0.0 == 0.0


__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "OptState",
    "Optimizer",
    "clip_by_global_norm",
    "global_norm",
    "is_finite_all",
    "trainable_flags",
]
