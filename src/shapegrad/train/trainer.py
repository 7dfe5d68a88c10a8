"""ScalarTrainer: a scalar loss over a fixed parameter pack, trained eagerly or compiled.

The whole training step (forward, backward, gradient clipping, optimizer
update, mixed-precision loss scaling) is ONE pure function of
``(params, optimizer_state, loss_scale_state, lr, inputs)``. Eager mode calls
it directly; compiled mode hands the very same function to ``sg.compile``, so
both modes run identical code and give the same numbers.

Example:
    >>> trainer = ScalarTrainer(loss, params, mode="compiled", backend="c",
    ...                         optimizer=sg.optim.Adam(lr=1e-2))
    >>> for epoch in range(10):
    ...     for x, y in batches:
    ...         trainer.step(x, y)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from shapegrad import tree
from shapegrad.autodiff import value_and_grad
from shapegrad.dtypes import DType, as_dtype, float16, float32, int32
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train import mixed_precision as mp
from shapegrad.train.fit import History, StepInfo, run_fit
from shapegrad.train.optim import SGD, Adam, AdamW, Optimizer, OptState, clip_by_global_norm
from shapegrad.train.optim import trainable_flags as _flags
from shapegrad.train.schedules import Schedule

if TYPE_CHECKING:
    from shapegrad.io import Checkpoint

Mode = Literal["eager", "compiled"]
LossFn = Callable[..., Tensor]


@dataclass(frozen=True)
class _Plan:
    """The static part of a training step: everything the traced function closes over."""

    loss_fn: LossFn
    treedef: tree.TreeDef
    flags: tuple[bool, ...]
    master: DType
    compute: DType
    clip_norm: float | None
    schedule: Schedule | None
    scale_window: int

    @property
    def trainable(self) -> list[int]:
        return [i for i, f in enumerate(self.flags) if f]

    @property
    def fp16(self) -> bool:
        return self.compute == float16


# --- the pure step functions (traced by sg.compile in compiled mode) ----------------------


def _compute_params(plan: _Plan, leaves: Sequence[Tensor]) -> Any:
    """Parameters as the loss sees them: float leaves cast to the compute dtype."""
    cast = [p.cast(x, plan.compute) if x.dtype.is_float else x for x in leaves]
    return tree.unflatten(plan.treedef, cast)


def _loss(plan: _Plan, params: Any, inputs: tuple[Any, ...]) -> Tensor:
    """The loss in the master dtype (a fp16 loss is upcast before scaling and reporting)."""
    leaves, _ = tree.flatten(params)
    value = plan.loss_fn(_compute_params(plan, leaves), *inputs)
    if not isinstance(value, Tensor) or value.size != 1:
        shown = getattr(value, "shape", type(value).__name__)
        raise TypeError(
            f"ScalarTrainer: the loss function must return a scalar Tensor, got {shown}"
        )
    return p.cast(p.reshape(value, ()), plan.master)


def _loss_and_grads(
    plan: _Plan, params: Any, inputs: tuple[Any, ...], scale: Tensor | None
) -> tuple[Tensor, list[Tensor]]:
    """Loss and the (unscaled) gradients of the trainable leaves, in the master dtype."""
    leaves, _ = tree.flatten(params)
    index = plan.trainable

    def objective(trainable: list[Tensor]) -> tuple[Tensor, Tensor]:
        merged = list(leaves)
        for k, i in enumerate(index):
            merged[i] = trainable[k]
        loss = _loss(plan, tree.unflatten(plan.treedef, merged), inputs)
        return (loss * scale if scale is not None else loss), loss

    (_, loss), grads = value_and_grad(objective, has_aux=True)([leaves[i] for i in index])
    if scale is not None:
        grads = [g / p.cast(scale, g.dtype) for g in grads]
    return loss, list(grads)


def _full_grads(plan: _Plan, params: Any, trainable: Sequence[Tensor]) -> Any:
    """Gradients shaped like ``params``: the computed ones, zeros for frozen leaves."""
    leaves, _ = tree.flatten(params)
    out = [p.zeros_like(x) for x in leaves]
    for k, i in enumerate(plan.trainable):
        out[i] = trainable[k]
    return tree.unflatten(plan.treedef, out)


def _train_step(
    plan: _Plan,
    optimizer: Optimizer,
    params: Any,
    opt_state: OptState,
    scaler: dict[str, Tensor] | None,
    lr: Tensor | None,
    inputs: tuple[Any, ...],
) -> tuple[Tensor, Any, OptState, dict[str, Tensor] | None]:
    """One update: ``(loss, new_params, new_opt_state, new_scaler_state)``."""
    scale = scaler["scale"] if scaler is not None else None
    loss, grads = _loss_and_grads(plan, params, inputs, scale)
    if plan.clip_norm is not None:
        grads = clip_by_global_norm(grads, plan.clip_norm)
    rate = lr
    if rate is None:
        if plan.schedule is None:
            raise ValueError("ScalarTrainer: no learning rate and no schedule")
        rate = plan.schedule(opt_state["step"], plan.master)
    new_params, new_state = optimizer.update(
        params, _full_grads(plan, params, grads), opt_state, rate, requires_grad=plan.flags
    )
    if scaler is None:
        return loss, new_params, new_state, None
    return mp.apply_or_skip(
        grads, (params, opt_state), (new_params, new_state), scaler, loss, plan.scale_window
    )


# --- the trainer ------------------------------------------------------------------------


class ScalarTrainer:
    """Train a scalar loss ``loss_fn(params, *inputs)`` over a fixed parameter pack.

    Args:
        loss_fn: ``loss_fn(params, *inputs) -> 0-d Tensor``, written against Tensor.
        params: a ParamList (its ``requires_grad`` flags are respected), TList, list or dict
            of float tensors; the trainer keeps the master copy.
        mode: ``"eager"`` (NumPy + tape) or ``"compiled"`` (one ``sg.compile``d step).
        backend: compiled-mode backend; ``"c"`` falls back to ``"numpy"`` with a message
            when no C compiler / C backend is available.
        optimizer: an :mod:`shapegrad.train.optim` optimizer (default ``SGD(lr=0.01)``).
        schedule: optional learning-rate schedule (``step -> lr``), used when ``step`` is
            called without ``lr``; it overrides the optimizer's constant ``lr``.
        dtype: compute dtype; ``None`` uses the parameters' dtype. ``"float16"`` enables
            mixed precision: float32 master parameters, float16 compute, dynamic loss scale.
        clip_norm: clip gradients to this global L2 norm before the update.
        requires_grad: per-parameter flags overriding those of ``params`` (length-checked).
        loss_scale: initial dynamic loss scale for float16 (default ``2**15``).
        loss_scale_window: double the scale after this many finite steps in a row.
    Example:
        >>> t = ScalarTrainer(loss, params, optimizer=sg.optim.SGD(lr=0.1, momentum=0.9))
        >>> t.step(x, y)
        0.69...
    """

    def __init__(
        self,
        loss_fn: LossFn,
        params: Any,
        mode: Mode = "eager",
        backend: str = "c",
        optimizer: Optimizer | None = None,
        schedule: Schedule | None = None,
        dtype: str | DType | None = None,
        clip_norm: float | None = None,
        requires_grad: Sequence[bool] | None = None,
        loss_scale: float = 2.0**15,
        loss_scale_window: int = 2000,
    ) -> None:
        if mode not in ("eager", "compiled"):
            raise ValueError(f"ScalarTrainer: mode must be 'eager' or 'compiled', got {mode!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"ScalarTrainer: clip_norm must be > 0, got {clip_norm}")
        leaves, treedef = tree.flatten(params)
        leaves = [x if isinstance(x, Tensor) else tensor(np.asarray(x)) for x in leaves]
        flags = _flags(params, requires_grad)
        _check_params(leaves, flags)
        master, compute = _pick_dtypes(leaves, flags, dtype)
        leaves = [p.cast(x, master) if x.dtype.is_float else x for x in leaves]
        self.loss_fn = loss_fn
        self.mode: Mode = mode
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
        self.schedule = schedule
        self._plan = _Plan(
            loss_fn, treedef, flags, master, compute, clip_norm, schedule, loss_scale_window
        )
        self._params = tree.unflatten(treedef, leaves)
        self._initial_scale = float(loss_scale)
        self.backend = _resolve_backend(backend) if mode == "compiled" else backend
        self._opt_states: dict[Any, OptState] = {}
        self._compiled: dict[Any, Callable[..., Any]] = {}
        self._scaler = mp.init_state(self._initial_scale) if self._plan.fp16 else None
        self.global_step = 0  # calls of step(), skipped ones included

    # --- parameters and state ----------------------------------------------------------

    @property
    def requires_grad(self) -> tuple[bool, ...]:
        """One flag per parameter leaf."""
        return self._plan.flags

    @property
    def dtype(self) -> DType:
        """The compute dtype."""
        return self._plan.compute

    def get_params(self) -> Any:
        """The current (master) parameters, in the structure given to the constructor."""
        return self._params

    def set_params(self, params: Any) -> None:
        """Replace the parameters; structure, shapes and dtypes must match the current ones.

        The trainer keeps its own ``requires_grad`` flags and optimizer state.
        """
        leaves, _ = tree.flatten(params)
        current, _ = tree.flatten(self._params)
        if len(leaves) != len(current):
            raise ValueError(f"set_params: got {len(leaves)} tensors, expected {len(current)}")
        fresh = []
        for k, (new, old) in enumerate(zip(leaves, current, strict=True)):
            value = new if isinstance(new, Tensor) else tensor(np.asarray(new))
            if value.shape != old.shape or value.dtype != old.dtype:
                raise ValueError(f"set_params: parameter {k} is {value.aval}, expected {old.aval}")
            fresh.append(value)
        self._params = tree.unflatten(self._plan.treedef, fresh)

    def optimizer_state(self, optimizer: Optimizer | None = None) -> OptState:
        """The state of ``optimizer`` (default: the trainer's), created on first use."""
        opt = optimizer if optimizer is not None else self.optimizer
        key = opt.config_key()
        if key not in self._opt_states:
            self._opt_states[key] = opt.init(self._params)
        return self._opt_states[key]

    def set_optimizer_state(self, state: OptState, optimizer: Optimizer | None = None) -> None:
        """Install a saved optimizer state (e.g. from a checkpoint)."""
        opt = optimizer if optimizer is not None else self.optimizer
        self._opt_states[opt.config_key()] = state

    def reset_optimizer_state(self) -> None:
        """Forget every optimizer state (momentum, Adam moments, step counters)."""
        self._opt_states.clear()

    @property
    def loss_scale(self) -> float:
        """The current dynamic loss scale (1.0 unless ``dtype="float16"``)."""
        return float(self._scaler["scale"]) if self._scaler is not None else 1.0

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because their gradients were not finite (float16 only)."""
        return int(self._scaler["skipped"]) if self._scaler is not None else 0

    def scaler_state(self) -> dict[str, Tensor] | None:
        """The mixed-precision state (``scale``, ``good``, ``skipped``), or None."""
        return self._scaler

    def set_scaler_state(self, state: dict[str, Tensor] | None) -> None:
        """Install a saved mixed-precision state."""
        self._scaler = state

    def current_lr(self, optimizer: Optimizer | None = None) -> float:
        """The learning rate the next ``step()`` without ``lr`` will use."""
        if self.schedule is None:
            return float((optimizer or self.optimizer).lr)
        count = self.optimizer_state(optimizer)["step"]
        return float(self.schedule(count, "float64"))

    # --- checkpoints ------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
        """Atomically save parameters, optimizer state, step counters and loss-scale state.

        Only the trainer's own optimizer state is saved (not ``adam_step``'s side states).
        """
        from shapegrad.io import save_checkpoint

        state = self.optimizer_state()
        notes = {
            "optimizer": type(self.optimizer).__name__,
            "optimizer_config": repr(self.optimizer),
            "schedule": repr(self.schedule),
            "schedule_step": int(state["step"]),
            "dtype": self._plan.compute.name,
            **(metadata or {}),
        }
        return save_checkpoint(
            path, self._params, state, step=self.global_step, extra=self._scaler, metadata=notes
        )

    def load_checkpoint(self, path: str | Path) -> Checkpoint:
        """Restore a checkpoint written by :meth:`save_checkpoint` (validated; see ``sg.io``).

        Raises:
            CheckpointError: unreadable file, different parameters, a different optimizer
                type, or a different precision setup.
        """
        from shapegrad.io import CheckpointError, load_checkpoint

        ckpt = load_checkpoint(path, self._params, self.optimizer_state(), self._scaler)
        saved = ckpt.metadata.get("user", {}).get("optimizer")
        if saved is not None and saved != type(self.optimizer).__name__:
            raise CheckpointError(
                f"{path}: saved with optimizer {saved}, but this trainer uses "
                f"{type(self.optimizer).__name__}"
            )
        self.set_params(ckpt.params)
        self.set_optimizer_state(ckpt.optimizer_state)
        self._scaler = ckpt.extra
        self.global_step = ckpt.step
        return ckpt

    # --- computing ---------------------------------------------------------------------

    def forward(self, *inputs: Any) -> float:
        """The loss at the current parameters."""
        run = self._function("forward", lambda params, xs: _loss(self._plan, params, xs))
        return float(run(self._params, self._inputs(inputs)))

    def backward(self, *inputs: Any) -> Any:
        """Gradients of the loss, shaped like the parameters (zeros for frozen ones)."""

        def grads_of(params: Any, xs: tuple[Any, ...]) -> Any:
            scale = p.constant(np.asarray(self._initial_scale), self._plan.master, like=None)
            _, grads = _loss_and_grads(self._plan, params, xs, scale if self._plan.fp16 else None)
            return _full_grads(self._plan, params, grads)

        return self._function("backward", grads_of)(self._params, self._inputs(inputs))

    def step(self, *inputs: Any, lr: float | None = None) -> float:
        """Forward + backward + update with the trainer's optimizer; returns the loss.

        Args:
            *inputs: the loss function's arguments after ``params`` (arrays or tensors).
            lr: learning rate for this step; default: the schedule, else the optimizer's lr.
        """
        return self._step_with(self.optimizer, inputs, lr)

    def adam_step(
        self,
        *inputs: Any,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ) -> float:
        """One Adam step (its own moment state, kept across calls); returns the loss."""
        return self._step_with(Adam(lr, beta1, beta2, eps), inputs, lr)

    def adamw_step(
        self,
        *inputs: Any,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> float:
        """One AdamW step (decoupled weight decay); returns the loss."""
        return self._step_with(AdamW(lr, beta1, beta2, eps, weight_decay), inputs, lr)

    def fit(
        self,
        batches: Iterable[Any] | Callable[[int], Iterable[Any]],
        epochs: int = 1,
        callbacks: Sequence[Callable[[ScalarTrainer, StepInfo], Any]] = (),
        progress: bool = True,
    ) -> History:
        """Train for ``epochs`` passes over ``batches`` with a progress bar.

        Args:
            batches: a re-iterable of input tuples (e.g. ``sg.data.Batches(x, y, ...)``),
                or ``epoch -> iterable``.
            epochs: number of passes.
            callbacks: called as ``cb(trainer, info)`` after every step; raise
                :class:`StopTraining` to end early.
            progress: show a tqdm bar with the loss and throughput.
        Returns:
            A :class:`History` of per-step losses and learning rates and per-epoch mean losses.
        """
        return run_fit(self, batches, epochs, callbacks, progress)

    # --- internals ---------------------------------------------------------------------

    def _step_with(self, optimizer: Optimizer, inputs: tuple[Any, ...], lr: float | None) -> float:
        state = self.optimizer_state(optimizer)
        if lr is None and self.schedule is None:
            lr = optimizer.lr
        rate = None if lr is None else self._scalar(lr)
        plan = self._plan

        def train_step(
            params: Any, opt_state: OptState, scaler: Any, lr: Tensor | None, xs: Any
        ) -> Any:
            return _train_step(plan, optimizer, params, opt_state, scaler, lr, xs)

        run = self._function(("step", optimizer.config_key()), train_step)
        loss, params, new_state, scaler = run(
            self._params, state, self._scaler, rate, self._inputs(inputs)
        )
        self._params = tree.unflatten(plan.treedef, tree.flatten(params)[0])
        self._opt_states[optimizer.config_key()] = new_state
        self._scaler = scaler
        self.global_step += 1
        return float(loss)

    def _function(self, key: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` itself in eager mode; a cached ``sg.compile(fn)`` in compiled mode."""
        if self.mode == "eager":
            return fn
        if key not in self._compiled:
            from shapegrad.jit import compile as sg_compile

            label = key if isinstance(key, str) else key[0]
            self._compiled[key] = sg_compile(fn, backend=self.backend, name=f"trainer_{label}")
        return self._compiled[key]

    def _scalar(self, value: float) -> Tensor:
        return tensor(np.asarray(value, dtype=self._plan.master.numpy))

    def _inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Float data in the compute dtype, integer data as int32 tensors."""
        return tuple(_convert_input(x, self._plan.compute) for x in inputs)


def _convert_input(x: Any, compute: DType) -> Any:
    if isinstance(x, Tensor):
        return p.cast(x, compute) if x.dtype.is_float and not x.is_traced else x
    if isinstance(x, np.ndarray | list):
        array = np.asarray(x)
        if array.dtype.kind == "f":
            return tensor(array, compute)
        if array.dtype.kind in "iu":
            return tensor(array, int32)
        return tensor(array)
    return x


def _check_params(leaves: Sequence[Tensor], flags: tuple[bool, ...]) -> None:
    if not leaves:
        raise ValueError("ScalarTrainer: no parameters")
    for k, (x, f) in enumerate(zip(leaves, flags, strict=True)):
        if f and not x.dtype.is_float:
            raise TypeError(
                f"ScalarTrainer: parameter {k} is {x.aval} but requires_grad=True; "
                "integer parameters must be frozen"
            )
    if not any(flags):
        raise ValueError("ScalarTrainer: every parameter is frozen (requires_grad all False)")


def _pick_dtypes(
    leaves: Sequence[Tensor], flags: tuple[bool, ...], dtype: str | DType | None
) -> tuple[DType, DType]:
    """(master dtype, compute dtype). float16 compute keeps float32 masters."""
    floats = {x.dtype for x in leaves if x.dtype.is_float}
    if len(floats) > 1:
        raise TypeError(
            f"ScalarTrainer: float parameters must share one dtype, got {sorted(map(str, floats))}"
        )
    own = floats.pop() if floats else float32
    if dtype is None:
        return (float32, float16) if own == float16 else (own, own)
    compute = as_dtype(dtype)
    if compute == float16:
        return float32, float16
    if compute != own:
        raise TypeError(
            f"ScalarTrainer: parameters are {own} but dtype={compute}; cast the parameters "
            "or leave dtype unset (dtype='float16' is the only mixed setting)"
        )
    return own, compute


def _resolve_backend(name: str) -> str:
    """``name`` when usable here, else ``"numpy"`` with a printed explanation."""
    from shapegrad.backends.base import available_backends, get_backend

    if name not in available_backends():
        raise ValueError(f"unknown backend {name!r}; choose one of {available_backends()}")
    try:
        get_backend(name)
    except (ImportError, RuntimeError, ValueError) as exc:  # BackendUnavailable is a RuntimeError
        if name == "numpy":
            raise
        print(f"shapegrad: backend {name!r} is not usable here ({exc}); falling back to 'numpy'")
        return "numpy"
    return name


__all__ = ["ScalarTrainer"]
