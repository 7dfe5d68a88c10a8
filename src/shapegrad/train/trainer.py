"""ScalarTrainer: a scalar loss over a fixed parameter pack, trained eagerly or compiled.

The whole training step (forward, backward, gradient clipping, optimizer
update, mixed-precision loss scaling) is ONE pure function of
``(params, optimizer_state, loss_scale_state, lr, inputs)``. Eager mode calls
it directly; compiled mode hands the very same function to ``sg.compile``, so
both modes run identical code and give the same numbers.

How a step executes is decided once, at construction: the trainer holds one
:class:`~shapegrad.train.strategies.StepStrategy` (eager, compiled, bound to a
stateful executable, or the Neural Engine's host update; ``trainer.strategy``)
and every method delegates to it.

Example:
    >>> trainer = ScalarTrainer(loss, params, mode="compiled", backend="c",
    ...                         optimizer=sg.optim.Adam(lr=1e-2))
    >>> for epoch in range(10):
    ...     for x, y in batches:
    ...         trainer.step(x, y)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from shapegrad import random, tree
from shapegrad.distributed import Communicator, check_same, watch, world
from shapegrad.dtypes import DType, as_dtype, bfloat16, float16, float32
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.tensor import Tensor
from shapegrad.train import _checks
from shapegrad.train import mixed_precision as mp
from shapegrad.train.fit import History, StepInfo, run_fit
from shapegrad.train.optim import SGD, Adam, AdamW, Optimizer, OptState
from shapegrad.train.optim import trainable_flags as _flags
from shapegrad.train.schedules import Schedule
from shapegrad.train.step import LossFn, StepPlan, loss_takes_key
from shapegrad.train.strategies import (
    BoundStrategy,
    CompiledStrategy,
    EagerStrategy,
    StepStrategy,
    strategy_kind,
)

if TYPE_CHECKING:
    from shapegrad.io import Checkpoint

Mode = Literal["eager", "compiled"]
# --- the trainer ------------------------------------------------------------------------


class ScalarTrainer:
    """Train a scalar loss ``loss_fn(params, *inputs)`` over a fixed parameter pack.

    Args:
        loss_fn: ``loss_fn(params, *inputs) -> 0-d Tensor``, written against Tensor. With a
            ``key`` parameter (``loss(params, x, y, *, key)``) it gets a fresh random key
            every step (for ``sg.dropout(h, p, key)``); it may return ``(loss, new_params)``
            to update non-trainable state such as batch-norm running statistics (see
            :mod:`shapegrad.train.step`).
        params: a ParamList (its ``requires_grad`` flags are respected), TList, list or dict
            of float tensors; the trainer keeps the master copy.
        mode: ``"eager"`` (NumPy + tape) or ``"compiled"`` (one ``sg.compile``d step).
        backend: compiled-mode backend; ``"c"`` falls back to ``"numpy"`` with a message
            when no C compiler / C backend is available; any other backend that cannot run
            here (``"cuda"`` without a GPU) raises ``BackendUnavailable`` unless ``fallback``
            names one to use instead.
        fallback: backend to train on when ``backend`` is not usable here (printed).
        optimizer: an :mod:`shapegrad.train.optim` optimizer (default ``SGD(lr=0.01)``).
        schedule: optional learning-rate schedule (``step -> lr``), used when ``step`` is
            called without ``lr``; it overrides the optimizer's constant ``lr``.
        dtype: compute dtype; ``None`` uses the parameters' dtype. ``"float16"`` enables
            mixed precision: float32 master parameters, float16 compute, dynamic loss scale;
            ``"bfloat16"`` the same without a loss scale (bfloat16 has float32's range).
        clip_norm: clip gradients to this global L2 norm before the update.
        requires_grad: per-parameter flags overriding those of ``params`` (length-checked).
        loss_scale: initial dynamic loss scale for float16 (default ``2**15``).
        loss_scale_window: double the scale after this many finite steps in a row.
        example_inputs: one batch (``backend="ane"`` only): the constructor then traces,
            lowers, converts and saves the Core ML program; otherwise the first call does.
        device_optimizer: ``backend="ane"`` only: lower the optimizer update into the program.
        seed: an int in ``[0, 2**32)``, the base of the per-step random keys (losses with
            a ``key`` parameter only); saved in checkpoints, so a resumed run draws the
            same keys.
        ane_runner: ``backend="ane"`` only, a test hook: ``runner(mil_program)`` returns the
            executor of the lowered program (``feeds -> outputs``), e.g. the MIL NumPy
            evaluator of the test suite; default: Core ML, which needs macOS 13+.
        data_parallel: ``True`` (every process of the MPI job, ``sg.distributed.world()``)
            or a :class:`~shapegrad.distributed.Communicator`: each process steps on its own
            shard of the global batch (``sg.data.Batches(..., shard=comm)``) and the step
            averages loss and gradients over the processes before clipping, the loss-scale
            check and the optimizer, so parameters start (broadcast from rank 0) and stay
            identical. Compiled, the all-reduce runs inside the one native call of the step.
            Checkpoints are written by rank 0 only; any process count can resume them.
        accumulate: micro-batches per step: every array input is split into this many equal
            parts along its first axis and the gradients are averaged over them (a mean loss
            then gets the gradient of the whole batch with the activations of one part).
            With ``dtype="float16"`` the loss scale applies per micro-batch: smaller parts
            scale each example's cotangent up, so overflow skips can come earlier.
        flush_denormals: run the compiled C step with denormal floats flushed to zero
            (x86 MXCSR FTZ/DAZ, aarch64 FPCR FZ) on every thread, restoring the caller's
            mode after each call. Values below FLT_MIN (1.2e-38) become 0. Why: Adam's
            moments of dead ReLU units decay geometrically into denormals, which x86
            computes ~100x slower (moons Adam ``step_many``: see ``benchmarks/trainer_step.py``).
            Only with ``mode="compiled", backend="c"`` (ValueError otherwise).

    ``mode="compiled", backend="ane"`` follows the Neural Engine training design
    (:mod:`shapegrad.train.ane`, :class:`shapegrad.train.ane.AneTrainer`):
    parameters are program inputs, forward + backward (fp16) compile once per batch
    signature, fp32 master weights and the optimizer stay on the host (or in the program,
    in fp32, with ``device_optimizer=True``), and the dynamic loss scale skips steps
    whose gradients overflow (``skipped_steps``, ``loss_scale``). ``forward``, ``step``,
    ``step_many`` (K single steps), ``fit``, ``get_params``/``set_params`` and checkpoints
    work as documented; on Linux the program is built and saved but ``step``/``forward``
    raise ``AneExecutionUnavailable`` (Core ML execution needs macOS; never a silent
    fallback). ``clip_norm``, frozen parameters and side optimizers (``adam_step``...) are
    not supported there; ``backward`` compiles its own program for the ane backend.
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
        *,
        fallback: str | None = None,
        example_inputs: Sequence[Any] | None = None,
        device_optimizer: bool = False,
        ane_runner: Callable[[Any], Any] | None = None,
        seed: int = 0,
        data_parallel: bool | Communicator = False,
        accumulate: int = 1,
        flush_denormals: bool = False,
    ) -> None:
        if mode not in ("eager", "compiled"):
            raise ValueError(f"ScalarTrainer: mode must be 'eager' or 'compiled', got {mode!r}")
        if clip_norm is not None:
            _checks.real("ScalarTrainer", "clip_norm", clip_norm, 0.0, low_open=True)
        _checks.real("ScalarTrainer", "loss_scale", loss_scale, 1.0)
        _checks.whole("ScalarTrainer", "loss_scale_window", loss_scale_window, 1)
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise TypeError(
                "ScalarTrainer: optimizer must be a shapegrad.optim optimizer "
                f"(sg.optim.Adam(lr=1e-3)), got {type(optimizer).__name__}"
            )
        leaves, treedef = tree.flatten(params)
        leaves = [x if isinstance(x, Tensor) else tensor(np.asarray(x)) for x in leaves]
        flags = _flags(params, requires_grad)
        _check_params(leaves, flags)
        master, compute = _pick_dtypes(leaves, flags, dtype)
        leaves = [p.cast(x, master) if x.dtype.is_float else x for x in leaves]
        if not (isinstance(accumulate, int) and accumulate >= 1):
            raise ValueError(f"ScalarTrainer: accumulate must be an int >= 1, got {accumulate!r}")
        self.comm: Communicator | None = _communicator(data_parallel)
        if self.comm is not None:
            if backend == "ane" and mode == "compiled":
                raise NotImplementedError("ScalarTrainer: data_parallel with backend='ane'")
            leaves = [tensor(self.comm.broadcast(x.numpy(), 0)) for x in leaves]
        self._agreed: set[Any] = set()  # batch signatures checked equal on every process
        self.loss_fn = loss_fn
        self.mode: Mode = mode
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
        scaling = mp.LossScalePolicy(loss_scale_window)
        seed = random.check_seed(seed, "ScalarTrainer")  # even when no loss key uses it
        base_key = tuple(random.key(seed).tolist()) if loss_takes_key(loss_fn) else None
        self.backend = _resolve_backend(backend, fallback) if mode == "compiled" else backend
        one_bucket = mode == "compiled" and self.backend == "cuda"
        plan = StepPlan(
            loss_fn, treedef, flags, master, compute, clip_norm, schedule, scaling, base_key,
            self.comm, accumulate, bucket_bytes=(1 << 62) if one_bucket else None,
        )  # fmt: skip
        kind = strategy_kind(mode, self.backend)
        if kind != "ane" and (example_inputs is not None or device_optimizer or ane_runner):
            raise TypeError(
                "ScalarTrainer: example_inputs, device_optimizer and ane_runner are for "
                "mode='compiled', backend='ane'"
            )
        params_tree = tree.unflatten(treedef, leaves)
        scaler = mp.init_state(float(loss_scale)) if plan.fp16 else None
        self._strategy: StepStrategy
        if flush_denormals and (mode != "compiled" or self.backend != "c"):
            raise ValueError(
                "ScalarTrainer: flush_denormals=True is an option of the compiled C step "
                f"(mode='compiled', backend='c'); got mode={mode!r}, backend={self.backend!r}"
            )
        options = (("flush_denormals", True),) if flush_denormals else ()
        if kind == "eager":
            self._strategy = EagerStrategy(plan, params_tree, scaler)
        elif kind == "compiled":
            self._strategy = CompiledStrategy(plan, params_tree, scaler, self.backend, options)
        elif kind == "bound":
            self._strategy = BoundStrategy(plan, params_tree, scaler, self.backend, options)
        else:
            from shapegrad.train.ane import AneStrategy, check_ane_settings

            if base_key is not None:
                raise NotImplementedError(
                    "ScalarTrainer(backend='ane'): losses taking a per-step `key` are not "
                    "supported there yet; use backend='c'"
                )
            check_ane_settings(flags, clip_norm, dtype, leaves)
            ane = AneStrategy(
                plan, self.optimizer, leaves, loss_scale, device_optimizer, ane_runner
            )
            if example_inputs is not None:
                ane.build(example_inputs)
            self._strategy = ane

    # --- the strategy ------------------------------------------------------------------

    @property
    def strategy(self) -> StepStrategy:
        """How this trainer executes its steps, chosen at construction (``.kind``:
        ``"eager"``, ``"compiled"``, ``"bound"`` or ``"ane"``)."""
        return self._strategy

    @property
    def global_step(self) -> int:
        """Calls of ``step()`` so far (K per ``step_many``), skipped ones included."""
        return self._strategy.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._strategy.global_step = int(value)

    @property
    def last_lr(self) -> float:
        """The learning rate the latest step used (NaN before the first)."""
        return self._strategy.last_lr

    # --- parameters and state ----------------------------------------------------------

    @property
    def requires_grad(self) -> tuple[bool, ...]:
        """One flag per parameter leaf."""
        return self._strategy.plan.flags

    @property
    def schedule(self) -> Schedule | None:
        """The learning-rate schedule (assigning one rebuilds the compiled steps)."""
        return self._strategy.plan.schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self._strategy.set_plan(dataclasses.replace(self._strategy.plan, schedule=value))

    @property
    def dtype(self) -> DType:
        """The compute dtype."""
        return self._strategy.plan.compute

    def get_params(self) -> Any:
        """The current (master) parameters, in the structure given to the constructor."""
        return self._strategy.params()

    def set_params(self, params: Any) -> None:
        """Replace the parameters; structure, shapes and dtypes must match the current ones.

        Matched by structure, not by position alone: dict entries by key (in any order),
        modules by field, sequences by position (ParamList names must agree). The trainer
        keeps its own ``requires_grad`` flags and optimizer state.

        Raises:
            TypeError / ValueError naming the path of the first mismatch (a dict given for
            a list, a missing key, a different shape or dtype).
        """
        current = self._strategy.params()
        try:
            leaves = tree.align(params, current, "params")
        except (TypeError, ValueError) as error:
            raise type(error)(f"set_params: {error}") from None
        paths = tree.leaf_paths(current)
        old_leaves, _ = tree.flatten(current)
        fresh = []
        for k, (new, old) in enumerate(zip(leaves, old_leaves, strict=True)):
            value = new if isinstance(new, Tensor) else tensor(np.asarray(new))
            if value.shape != old.shape or value.dtype != old.dtype:
                raise ValueError(
                    f"set_params: parameter {k} ({paths[k]!r}) is {value.aval}, expected {old.aval}"
                )
            fresh.append(value)
        self._strategy.set_params(tree.unflatten(self._strategy.plan.treedef, fresh))

    def optimizer_state(self, optimizer: Optimizer | None = None) -> OptState:
        """The state of ``optimizer`` (default: the trainer's), created on first use."""
        return self._strategy.optimizer_state(
            optimizer if optimizer is not None else self.optimizer
        )

    def set_optimizer_state(self, state: OptState, optimizer: Optimizer | None = None) -> None:
        """Install a saved optimizer state (e.g. from a checkpoint)."""
        opt = optimizer if optimizer is not None else self.optimizer
        self._strategy.set_optimizer_state(state, opt)

    def reset_optimizer_state(self) -> None:
        """Forget every optimizer state (momentum, Adam moments, step counters)."""
        self._strategy.reset_optimizer_state()

    @property
    def loss_scale(self) -> float:
        """The current dynamic loss scale (1.0 unless ``dtype="float16"`` or ``backend="ane"``)."""
        return self._strategy.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because their gradients were not finite (float16 / ane only)."""
        return self._strategy.skipped_steps

    def scaler_state(self) -> dict[str, Tensor] | None:
        """The mixed-precision state (``scale``, ``good``, ``skipped``), or None."""
        return self._strategy.scaler_state()

    def set_scaler_state(self, state: dict[str, Tensor] | None) -> None:
        """Install a saved mixed-precision state."""
        self._strategy.set_scaler_state(state)

    def current_lr(self, optimizer: Optimizer | None = None) -> float:
        """The learning rate the next ``step()`` without ``lr`` will use."""
        opt = optimizer if optimizer is not None else self.optimizer
        if self.schedule is None:
            return float(opt.lr)
        count = self._strategy.step_count(opt)
        return float(self.schedule(tensor(np.int32(count)), "float64"))

    # --- checkpoints ------------------------------------------------------------------

    def save_checkpoint(self, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
        """Atomically save parameters, optimizer state, step counters and loss-scale state.

        Only the trainer's own optimizer state is saved (not ``adam_step``'s side states).
        Data parallel: every process calls this; rank 0 writes (the state is identical on
        every process) and the others wait until the file is complete. The checkpoint does
        not depend on the process count: a run with any number of processes (one included)
        resumes it with the same parameters and optimizer state.
        """
        from shapegrad.io import save_checkpoint

        state = self.optimizer_state()
        comm = self.comm
        notes = {
            "optimizer": type(self.optimizer).__name__,
            "optimizer_config": repr(self.optimizer),
            "schedule": repr(self.schedule),
            "schedule_step": int(state["step"]),
            "dtype": self.dtype.name,
            "processes": comm.size if comm is not None else 1,
            **(metadata or {}),
        }
        base_key = self._strategy.plan.base_key
        if base_key is not None:  # the per-step keys are fold_in(this, optimizer step)
            notes["rng_key"] = list(base_key)
        written = Path(path)
        if comm is None or comm.rank == 0:
            written = save_checkpoint(
                path,
                self.get_params(),
                state,
                step=self.global_step,
                extra=self.scaler_state(),
                metadata=notes,
            )
        if comm is not None:
            comm.barrier()  # rank 0 raising instead aborts the job (distributed failure policy)
        return written

    def load_checkpoint(self, path: str | Path) -> Checkpoint:
        """Restore a checkpoint written by :meth:`save_checkpoint` (validated; see ``sg.io``).

        Raises:
            CheckpointError: unreadable file, different parameters, a different optimizer
                type, or a different precision setup.
        """
        from shapegrad.io import CheckpointError, load_checkpoint

        ckpt = load_checkpoint(path, self.get_params(), self.optimizer_state(), self.scaler_state())
        saved = ckpt.metadata.get("user", {}).get("optimizer")
        if saved is not None and saved != type(self.optimizer).__name__:
            raise CheckpointError(
                f"{path}: saved with optimizer {saved}, but this trainer uses "
                f"{type(self.optimizer).__name__}"
            )
        saved_key = ckpt.metadata.get("user", {}).get("rng_key")
        plan = self._strategy.plan
        if saved_key is not None and plan.base_key is not None:
            restored = (int(saved_key[0]), int(saved_key[1]))
            if restored != plan.base_key:  # resume the saved run's random stream
                self._strategy.set_plan(dataclasses.replace(plan, base_key=restored))
        self.set_params(ckpt.params)
        self.set_optimizer_state(ckpt.optimizer_state)
        self.set_scaler_state(ckpt.extra)
        self.global_step = ckpt.step
        return ckpt

    # --- computing ---------------------------------------------------------------------

    def forward(self, *inputs: Any) -> float:
        """The loss at the current parameters (data parallel: the mean over the processes)."""
        value = self._strategy.forward(_checked_inputs(inputs))
        if self.comm is not None and self.comm.size > 1:
            value = float(self.comm.all_reduce(np.asarray(value), "mean"))
        return value

    def backward(self, *inputs: Any) -> Any:
        """Gradients of the loss, shaped like the parameters (zeros for frozen ones).

        With ``dtype="float16"`` the backward pass uses the current loss scale and the
        gradients are unscaled (they may be non-finite if that scale overflows).
        Data parallel: the mean over the processes.
        """
        return self._strategy.backward(_checked_inputs(inputs))

    def step(self, *inputs: Any, lr: float | None = None) -> float:
        """Forward + backward + update with the trainer's optimizer; returns the loss.

        Args:
            *inputs: the loss function's arguments after ``params`` (arrays or tensors).
            lr: learning rate for this step; default: the schedule, else the optimizer's lr.
        """
        if lr is not None:
            _checks.real("ScalarTrainer.step", "lr", lr, 0.0)
        if self.comm is None:  # one process: no batch agreement, no watchdog
            return self._strategy.step(self.optimizer, _checked_inputs(inputs), lr)
        self._check_batch(_checked_inputs(inputs))
        with watch(self.comm, "ScalarTrainer.step"):
            return self._strategy.step(self.optimizer, inputs, lr)

    def adam_step(
        self,
        *inputs: Any,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ) -> float:
        """One Adam step (its own moment state, kept across calls); returns the loss."""
        self._check_batch(inputs)
        return self._strategy.step(Adam(lr, beta1, beta2, eps), inputs, lr)

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
        self._check_batch(inputs)
        return self._strategy.step(AdamW(lr, beta1, beta2, eps, weight_decay), inputs, lr)

    def step_many(self, *stacked: Any, lr: float | None = None) -> npt.NDArray[Any]:
        """``K`` steps on inputs stacked along a new first axis ``[K, ...]``; returns K losses.

        With a backend that keeps state (C) the K steps run in ONE native call (the loop
        is in C); otherwise this is exactly K calls of :meth:`step`.
        """
        if lr is not None:
            _checks.real("ScalarTrainer.step_many", "lr", lr, 0.0)
        if not stacked or any(np.ndim(x) == 0 for x in _checked_inputs(stacked)):
            raise ValueError("step_many: give each input stacked along a first axis of size K")
        counts = [int(np.shape(x)[0]) for x in stacked]
        if len(set(counts)) > 1:
            raise ValueError(f"step_many: inputs stack different step counts K: {counts}")
        if counts[0] == 0:  # no step to run: no losses, no state change
            return np.zeros(0, np.float32)
        self._check_batch(tuple(np.asarray(x)[0] for x in stacked))
        with watch(self.comm, "ScalarTrainer.step_many"):
            return self._strategy.step_many(self.optimizer, stacked, lr)

    def _check_batch(self, inputs: tuple[Any, ...]) -> None:
        """Data parallel: every process must step on batches of one signature (shapes and
        dtypes); checked once per signature, with an error naming the ranks that differ."""
        if self.comm is None or self.comm.size == 1:
            return
        signature = tuple(
            (tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__))) for x in inputs
        )
        if signature not in self._agreed:
            check_same(
                self.comm, "ScalarTrainer.step: the batch (shape, dtype per input)", signature
            )
            self._agreed.add(signature)

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


def _communicator(data_parallel: bool | Communicator) -> Communicator | None:
    """The communicator ``data_parallel`` names (None: not data parallel)."""
    if data_parallel is False or data_parallel is None:
        return None
    if data_parallel is True:
        return world()
    if isinstance(data_parallel, Communicator):
        return data_parallel
    raise TypeError(
        "ScalarTrainer: data_parallel must be True, False or a shapegrad.distributed "
        f"Communicator, got {type(data_parallel).__name__}"
    )


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


# Compute dtypes trained with float32 master parameters: float16 with a dynamic loss scale
# (its 5 exponent bits underflow small gradients), bfloat16 without (float32's range).
MIXED = (float16, bfloat16)


def _pick_dtypes(
    leaves: Sequence[Tensor], flags: tuple[bool, ...], dtype: str | DType | None
) -> tuple[DType, DType]:
    """(master dtype, compute dtype). float16 and bfloat16 compute keep float32 masters."""
    floats = {x.dtype for x in leaves if x.dtype.is_float}
    if len(floats) > 1:
        raise TypeError(
            f"ScalarTrainer: float parameters must share one dtype, got {sorted(map(str, floats))}"
        )
    own = floats.pop() if floats else float32
    if dtype is None:
        return (float32, own) if own in MIXED else (own, own)
    compute = as_dtype(dtype)
    if compute in MIXED:
        return float32, compute
    if compute != own:
        raise TypeError(
            f"ScalarTrainer: parameters are {own} but dtype={compute}; cast the parameters "
            "or leave dtype unset (dtype='float16' and dtype='bfloat16' are the mixed "
            "settings)"
        )
    return own, compute


def _resolve_backend(name: str, fallback: str | None) -> str:
    """``name`` when usable here; else ``fallback`` (or ``"numpy"`` for ``"c"``) with a
    printed explanation; else BackendUnavailable naming what is missing."""
    from shapegrad.backends.base import BackendUnavailable, get_backend, known_backends

    for candidate in (name, fallback):
        if candidate is not None and candidate not in known_backends():
            raise ValueError(f"unknown backend {candidate!r}; choose one of {known_backends()}")
    if name == "ane":
        return name  # no fallback: building or running the program raises its own clear error
    try:
        get_backend(name)
    except (ImportError, RuntimeError, ValueError) as exc:  # BackendUnavailable is a RuntimeError
        instead = fallback or ("numpy" if name == "c" else None)
        if instead is None or instead == name:
            raise BackendUnavailable(
                f"ScalarTrainer: backend {name!r} cannot run here ({exc}); pass "
                "fallback='numpy' (or another backend) to train elsewhere"
            ) from exc
        print(
            f"shapegrad: backend {name!r} is not usable here ({exc}); falling back to {instead!r}"
        )
        return _resolve_backend(instead, None)
    return name


def _checked_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The loss inputs, refusing what can only fail deep inside the loss (None, str, dict)."""
    for k, x in enumerate(inputs):
        if type(x) is np.ndarray or type(x) is Tensor:  # the common case, checked first
            continue
        if x is None or isinstance(x, str | bytes | dict | set):
            raise TypeError(
                f"ScalarTrainer: input {k} of the loss (after params) is {type(x).__name__}; "
                "give a NumPy array or a tensor"
            )
    return inputs


__all__ = ["ScalarTrainer"]
