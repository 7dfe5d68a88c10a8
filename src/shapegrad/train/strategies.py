"""How a ScalarTrainer executes its step: one strategy, chosen once at construction.

Every strategy has the same interface (:class:`StepStrategy`): ``step``,
``step_many``, ``forward``, ``backward``, reading and writing the parameters,
optimizer states and loss-scale state, and ``sync`` (make the host copies
current). :func:`strategy_for` picks one from the mode and the backend:

============  ===========================  ==============================================
kind          when                         how a step runs
============  ===========================  ==============================================
``eager``     ``mode="eager"``             :func:`~shapegrad.train.step.train_step` on
                                           eager tensors (NumPy + tape)
``compiled``  compiled, backend without    ``sg.compile(train_step)`` called with the
              ``binds_state`` (numpy)      whole state every step
``bound``     compiled, backend with       the compiled step bound to its state
              ``binds_state`` (c)          (:mod:`shapegrad.train.live`): each step passes
                                           only the batch and the lr; ``step_many`` is
                                           one native call
``ane``       compiled, ``backend="ane"``  fp16 fwd+bwd program, fp32 master weights and
                                           the optimizer on the host
                                           (:class:`shapegrad.train.ane.AneStrategy`)
============  ===========================  ==============================================

The first three keep the state as trees of eager tensors (``params``,
one optimizer state per optimizer configuration, the float16 scaler state);
the bound strategy's executable holds the live copy between reads.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from shapegrad import tree
from shapegrad.dtypes import DType, int32, uint8
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train import mixed_precision as mp
from shapegrad.train.live import LiveStep, bind_step, signature_of
from shapegrad.train.optim import Optimizer, OptState
from shapegrad.train.step import StepPlan, full_grads, loss_and_grads, loss_value, train_step

if TYPE_CHECKING:
    from shapegrad.jit import Compiled

Array = npt.NDArray[Any]
Kind = Literal["eager", "compiled", "bound", "ane"]


def strategy_kind(mode: str, backend: str) -> Kind:
    """The strategy a trainer with this ``mode`` and (resolved) ``backend`` uses.

    Example:
        >>> strategy_kind("compiled", "c")
        'bound'
    """
    if mode == "eager":
        return "eager"
    if backend == "ane":
        return "ane"
    from shapegrad.backends.base import get_backend

    return "bound" if get_backend(backend).binds_state else "compiled"


class StepStrategy(ABC):
    """One way of running a trainer's step (see the module docstring).

    Attributes:
        plan: the static step settings (assign through :meth:`set_plan`).
        global_step: calls of ``step`` so far, skipped ones included.
        last_lr: the learning rate the latest step used.
    """

    kind: ClassVar[Kind]

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan
        self.global_step = 0
        self.last_lr = math.nan

    # --- computing ---------------------------------------------------------------------

    @abstractmethod
    def step(self, optimizer: Optimizer, inputs: tuple[Any, ...], lr: float | None) -> float:
        """Forward + backward + update; ``lr=None``: the schedule, else ``optimizer.lr``."""

    def step_many(self, optimizer: Optimizer, stacked: tuple[Any, ...], lr: float | None) -> Array:
        """``K`` steps on inputs stacked ``[K, ...]``; returns the K losses."""
        count = int(np.shape(stacked[0])[0])
        rows = [tuple(np.asarray(x)[k] for x in stacked) for k in range(count)]
        return np.array([self.step(optimizer, row, lr) for row in rows])

    @abstractmethod
    def forward(self, inputs: tuple[Any, ...]) -> float:
        """The loss at the current parameters."""

    @abstractmethod
    def backward(self, inputs: tuple[Any, ...]) -> Any:
        """Gradients shaped like the parameters (zeros for frozen leaves)."""

    # --- state -------------------------------------------------------------------------

    @abstractmethod
    def params(self) -> Any:
        """The current master parameters (a tree of eager tensors)."""

    @abstractmethod
    def set_params(self, params: Any) -> None:
        """Install parameters (already checked against the current ones)."""

    @abstractmethod
    def optimizer_state(self, optimizer: Optimizer) -> OptState:
        """The state of ``optimizer``'s configuration, created on first use."""

    @abstractmethod
    def set_optimizer_state(self, state: OptState, optimizer: Optimizer) -> None:
        """Install a state for ``optimizer``'s configuration."""

    @abstractmethod
    def reset_optimizer_state(self) -> None:
        """Forget every optimizer state."""

    @abstractmethod
    def scaler_state(self) -> mp.ScalerState | None:
        """The loss-scale state (``scale``, ``good``, ``skipped``), or None when unscaled."""

    @abstractmethod
    def set_scaler_state(self, state: mp.ScalerState | None) -> None:
        """Install a loss-scale state."""

    def step_count(self, optimizer: Optimizer) -> int:
        """The step the schedule of ``optimizer``'s next update sees."""
        return int(self.optimizer_state(optimizer)["step"].item())

    def set_plan(self, plan: StepPlan) -> None:
        """New static settings (e.g. another schedule): compiled steps are rebuilt."""
        self.sync()
        self.plan = plan

    def sync(self) -> None:  # noqa: B027 - only strategies with a live copy override it
        """Make the host copies of the state current (the bound strategy reads back)."""

    @property
    def loss_scale(self) -> float:
        state = self.scaler_state()
        return float(state["scale"].item()) if state is not None else 1.0

    @property
    def skipped_steps(self) -> int:
        state = self.scaler_state()
        return int(state["skipped"].item()) if state is not None else 0


# --- strategies over host trees of tensors ------------------------------------------------


class _TreeStrategy(StepStrategy):
    """State as trees of eager tensors; steps via ``_function`` (eager or compiled)."""

    def __init__(self, plan: StepPlan, params: Any, scaler: mp.ScalerState | None) -> None:
        super().__init__(plan)
        self._params = params
        self._opt_states: dict[Any, OptState] = {}
        self._scaler = scaler

    @abstractmethod
    def _function(
        self, key: Any, fn: Callable[..., Any], donate: tuple[int, ...] = ()
    ) -> Callable[..., Any]:
        """``fn`` as this strategy runs it (itself, or a cached ``sg.compile(fn)``)."""

    def _step_fn(self, optimizer: Optimizer) -> tuple[Callable[..., Any], tuple[int, ...]]:
        """The pure step of ``optimizer`` and its donated arguments (the state)."""
        plan = self.plan

        def step_fn(params: Any, opt_state: OptState, scaler: Any, lr: Any, xs: Any) -> Any:
            return train_step(plan, optimizer, params, opt_state, scaler, lr, xs)

        return step_fn, ((0, 1, 2) if plan.fp16 else (0, 1))

    def _step_function(self, optimizer: Optimizer) -> Callable[..., Any]:
        return self._function(("step", optimizer.config_key()), *self._step_fn(optimizer))

    def step(self, optimizer: Optimizer, inputs: tuple[Any, ...], lr: float | None) -> float:
        if lr is None and self.plan.schedule is None:
            lr = optimizer.lr
        rate = None if lr is None else self._scalar(lr)
        state = self.optimizer_state(optimizer)
        run = self._step_function(optimizer)
        loss, params, new_state, scaler, used = run(
            self._params, state, self._scaler, rate, self._inputs(inputs)
        )
        self._params = tree.unflatten(self.plan.treedef, tree.flatten(params)[0])
        self._opt_states[optimizer.config_key()] = new_state
        self._scaler = scaler
        self.last_lr = float(used)
        self.global_step += 1
        return float(loss)

    def forward(self, inputs: tuple[Any, ...]) -> float:
        plan = self.plan
        run = self._function("forward", lambda params, xs: loss_value(plan, params, xs))
        self.sync()
        return float(run(self._params, self._inputs(inputs)))

    def backward(self, inputs: tuple[Any, ...]) -> Any:
        plan = self.plan

        def grads_of(params: Any, xs: tuple[Any, ...], scale: Tensor | None) -> Any:
            _, grads = loss_and_grads(plan, params, xs, scale)
            return full_grads(plan, params, grads)

        self.sync()
        scale = self._scaler["scale"] if self._scaler is not None else None
        return self._function("backward", grads_of)(self._params, self._inputs(inputs), scale)

    def params(self) -> Any:
        self.sync()
        return self._params

    def set_params(self, params: Any) -> None:
        self.sync()
        self._params = params

    def optimizer_state(self, optimizer: Optimizer) -> OptState:
        self.sync()
        key = optimizer.config_key()
        if key not in self._opt_states:
            self._opt_states[key] = optimizer.init(self._params)
        return self._opt_states[key]

    def set_optimizer_state(self, state: OptState, optimizer: Optimizer) -> None:
        self.sync()
        self._opt_states[optimizer.config_key()] = state

    def reset_optimizer_state(self) -> None:
        self.sync()
        self._opt_states.clear()

    def scaler_state(self) -> mp.ScalerState | None:
        self.sync()
        return self._scaler

    def set_scaler_state(self, state: mp.ScalerState | None) -> None:
        self.sync()
        self._scaler = state

    def _scalar(self, value: float) -> Tensor:
        return tensor(np.asarray(value, dtype=self.plan.master.numpy))

    def _inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Float data in the compute dtype, integer data as int32 tensors."""
        return tuple(convert_input(x, self.plan.compute) for x in inputs)


class EagerStrategy(_TreeStrategy):
    """``mode="eager"``: the step function runs on eager tensors (NumPy + tape)."""

    kind: ClassVar[Kind] = "eager"

    def _function(
        self, key: Any, fn: Callable[..., Any], donate: tuple[int, ...] = ()
    ) -> Callable[..., Any]:
        return fn


class CompiledStrategy(_TreeStrategy):
    """Compiled mode on a backend that keeps no state: ``sg.compile``d functions, cached."""

    kind: ClassVar[Kind] = "compiled"

    def __init__(
        self,
        plan: StepPlan,
        params: Any,
        scaler: mp.ScalerState | None,
        backend: str,
        options: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        super().__init__(plan, params, scaler)
        self.backend = backend
        self.functions = FunctionCache(backend, options)

    def _function(
        self, key: Any, fn: Callable[..., Any], donate: tuple[int, ...] = ()
    ) -> Callable[..., Any]:
        return self.functions.get(key, fn, donate)

    def set_plan(self, plan: StepPlan) -> None:
        super().set_plan(plan)
        self.functions.clear()


class BoundStrategy(CompiledStrategy):
    """Compiled mode on a backend whose executables keep state (``Backend.binds_state``).

    The step for the current optimizer configuration, learning-rate kind and batch
    signature is bound once (:class:`~shapegrad.train.live.LiveStep`); later steps pass
    only the batch and the lr. Anything that reads or replaces the state first reads the
    live copy back (``sync``); replacing it also unbinds (the next step binds again).
    """

    kind: ClassVar[Kind] = "bound"

    def __init__(
        self,
        plan: StepPlan,
        params: Any,
        scaler: mp.ScalerState | None,
        backend: str,
        options: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        super().__init__(plan, params, scaler, backend, options)
        self.live: LiveStep | None = None

    def step(self, optimizer: Optimizer, inputs: tuple[Any, ...], lr: float | None) -> float:
        if lr is None and self.plan.schedule is None:
            lr = optimizer.lr
        live = self.live
        if live is None or not live.accepts(optimizer.config_key(), lr is None, inputs):
            live = self._bind(optimizer, lr, inputs)
        loss = live.step(inputs, lr)
        self.last_lr = live.last_lr
        self.global_step += 1
        return loss

    def step_many(self, optimizer: Optimizer, stacked: tuple[Any, ...], lr: float | None) -> Array:
        count = int(np.shape(stacked[0])[0])
        if not count:
            return np.array([])
        if lr is None and self.plan.schedule is None:
            lr = optimizer.lr
        first = tuple(np.asarray(x)[0] for x in stacked)
        live = self.live
        if live is None or not live.accepts(optimizer.config_key(), lr is None, first):
            live = self._bind(optimizer, lr, first)
        losses = live.run_steps(stacked, lr)
        self.last_lr = live.last_lr
        self.global_step += count
        return losses

    def _bind(self, optimizer: Optimizer, lr: float | None, inputs: tuple[Any, ...]) -> LiveStep:
        self._unbind()
        rate = None if lr is None else self._scalar(lr)
        args = (
            self._params,
            self.optimizer_state(optimizer),
            self._scaler,
            rate,
            self._inputs(inputs),
        )
        key = optimizer.config_key()
        compiled = self.functions.get(("step", key), *self._step_fn(optimizer))
        self.live = bind_step(compiled, args, 3, key, signature_of(inputs))
        return self.live

    def sync(self) -> None:
        live = self.live
        if live is None or not live.dirty:
            return
        params, state, scaler = live.read()
        self._params = params
        self._opt_states[live.opt_key] = state
        self._scaler = scaler
        live.dirty = False

    def _unbind(self) -> None:
        """Read the live state back and drop the binding (before state is replaced)."""
        self.sync()
        self.live = None

    def step_count(self, optimizer: Optimizer) -> int:
        live = self.live
        if live is not None and live.opt_key == optimizer.config_key():
            # Only the step counter, not a full read-back: it follows the params in the state.
            return int(live.read_leaf(len(tree.flatten(self._params)[0])))
        return super().step_count(optimizer)

    def set_params(self, params: Any) -> None:
        self._unbind()
        super().set_params(params)

    def set_optimizer_state(self, state: OptState, optimizer: Optimizer) -> None:
        self._unbind()
        super().set_optimizer_state(state, optimizer)

    def reset_optimizer_state(self) -> None:
        self._unbind()
        super().reset_optimizer_state()

    def set_scaler_state(self, state: mp.ScalerState | None) -> None:
        self._unbind()
        super().set_scaler_state(state)

    def set_plan(self, plan: StepPlan) -> None:
        self._unbind()
        super().set_plan(plan)


# --- shared helpers ------------------------------------------------------------------------


class FunctionCache:
    """``sg.compile``d functions of one backend, by key (e.g. ``("step", optimizer key)``),
    compiled with the backend ``options`` (e.g. ``(("flush_denormals", True),)``)."""

    def __init__(self, backend: str, options: tuple[tuple[str, Any], ...] = ()) -> None:
        self.backend = backend
        self.options = dict(options)
        self.compiled: dict[Any, Compiled] = {}

    def get(self, key: Any, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Compiled:
        """The compiled ``fn`` for ``key`` (compiled on first use; donated args as given)."""
        found = self.compiled.get(key)
        if found is None:
            from shapegrad.jit import compile as sg_compile

            label = key if isinstance(key, str) else key[0]
            found = self.compiled[key] = sg_compile(  # a Compiled: no decorator form
                fn,
                backend=self.backend,
                name=f"trainer_{label}",
                donate_argnums=donate,
                **self.options,
            )
        return found

    def clear(self) -> None:
        self.compiled.clear()


def convert_input(x: Any, compute: DType) -> Any:
    """A batch input as the step takes it: floats in ``compute``, integers as int32
    (checked to fit), uint8 (images) as it is."""
    if isinstance(x, Tensor):
        return p.cast(x, compute) if x.dtype.is_float and not x.is_traced else x
    if isinstance(x, np.ndarray | list):
        array = np.asarray(x)
        if array.dtype.kind == "f":
            return tensor(array, compute)
        if array.dtype.kind in "iu":
            return tensor(array, uint8 if array.dtype == uint8.numpy else int32)
        return tensor(array)
    return x


__all__ = [
    "BoundStrategy",
    "CompiledStrategy",
    "EagerStrategy",
    "FunctionCache",
    "Kind",
    "StepStrategy",
    "convert_input",
    "strategy_kind",
]
