"""Training on the Neural Engine: one fwd+bwd program, fp32 master weights, dynamic loss scaling.

This is training logic (it traces with ``sg.compile`` and differentiates with
graph autodiff), so it lives in ``train/``; the ``ane`` backend below it only
lowers graphs to MIL, converts, saves and executes them.

The design (the one that works on the ANE, which computes in fp16 only):

* **Parameters are program inputs.** The forward + backward graph (from
  shapegrad's graph autodiff) is traced, lowered and converted *once*;
  feeding new weights each step never recompiles.
* **fp32 master weights and the optimizer live on the host.** The program
  returns fp16-computed gradients (as fp32 arrays); the host divides out the
  loss scale and applies a ``shapegrad.train.optim`` optimizer (SGD, Adam...)
  eagerly in fp32.
* **Loss scaling.** The program differentiates ``loss * scale`` (``scale`` is
  an input, so changing it never recompiles): small gradients stay above the
  fp16 subnormal range. A non-finite gradient means the scaled backward
  overflowed: the step is skipped (weights and optimizer state untouched)
  and the scale halves; after ``growth_interval`` finite steps it doubles.
  The rule is :class:`shapegrad.train.mixed_precision.LossScalePolicy`, the
  same one the compiled float16 step traces (:class:`LossScaler` holds its
  state on the host and evaluates it eagerly).
* **Fused softmax-cross-entropy gradient.** The graph autodiff of
  ``logsumexp(z) - z[label]`` gives ``(softmax(z) - onehot) * scale / N``
  at the logits: bounded by ``scale / N``, so fp16-safe, no ``exp`` overflow.
* ``device_optimizer=True`` lowers the optimizer update into the program
  too: it then also takes the optimizer state (and ``lr``) as inputs and
  returns the new parameters and state. Those update ops are computed in fp32
  (Core ML places them on the CPU) so master weights keep fp32 precision; the
  skip decision stays on the host, which still holds the old values.

Example:
    >>> trainer = AneTrainer(loss, params, (x, y), sg.optim.Adam(lr=1e-2))  # doctest: +SKIP
    >>> trainer.step(x, y)            # macOS: runs on the engine; returns the loss
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from shapegrad import tree
from shapegrad.backends.ane import (
    AneExecutable,
    IoSignature,
    MilProgram,
    MilRunner,
    compile_graph_lowered,
    lower_to_mil,
)
from shapegrad.backends.base import Array
from shapegrad.ir import Graph, topological_order
from shapegrad.ops.eager import tensor
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor
from shapegrad.train import mixed_precision as mp
from shapegrad.train.mixed_precision import LossScalePolicy
from shapegrad.train.optim import Optimizer, OptState
from shapegrad.train.step import LossFn, StepPlan, full_grads, loss_and_grads
from shapegrad.train.strategies import FunctionCache, Kind, StepStrategy, convert_input

RunnerFactory = Callable[[MilProgram], MilRunner]


@dataclass
class LossScaler:
    """The host-side state of dynamic loss scaling; :meth:`update` applies the shared
    :class:`~shapegrad.train.mixed_precision.LossScalePolicy` (halve on overflow and skip
    the step, double after ``growth_interval`` finite steps, stay in the bounds).

    Attributes:
        scale: the current scale (powers of two keep scaling exact).
        growth_interval: finite steps in a row before the scale doubles.
        min_scale / max_scale: bounds (the scale never leaves them).
        good_steps: finite steps since the last change; skipped: steps thrown away so far.
    """

    scale: float = 2.0**15
    growth_interval: int = 200
    min_scale: float = 1.0
    max_scale: float = 2.0**15  # the fp16 program casts the scale: 2**16 would be inf
    good_steps: int = 0
    skipped: int = 0

    @property
    def policy(self) -> LossScalePolicy:
        return LossScalePolicy(self.growth_interval, self.min_scale, self.max_scale)

    def state(self) -> dict[str, Tensor]:
        """``{"scale", "good", "skipped"}`` as 0-d tensors (``mixed_precision``'s layout)."""
        return {
            "scale": tensor(np.float32(self.scale)),
            "good": tensor(np.int32(self.good_steps)),
            "skipped": tensor(np.int32(self.skipped)),
        }

    def set_state(self, state: dict[str, Tensor]) -> None:
        """Install a state in ``mixed_precision``'s layout."""
        self.scale = float(state["scale"].item())
        self.good_steps = int(state["good"].item())
        self.skipped = int(state["skipped"].item())

    def update(self, finite: bool) -> None:
        """Record one step whose (scaled) gradients were ``finite`` or not."""
        self.set_state(self.policy.next_state(tensor(np.bool_(finite)), self.state()))


def all_finite(arrays: Sequence[Array]) -> bool:
    """True when no array holds an Inf or NaN."""
    return all(bool(np.isfinite(a).all()) for a in arrays)


def _trace(fn: Callable[..., Any], *args: Any) -> Graph:
    """The optimized graph of ``fn(*args)``: ``sg.compile``'s trace and lower stages for the
    ane backend (only the graph passes run; lowering to MIL is the trainer's own)."""
    from shapegrad.jit import compile as sg_compile

    leaves, treedef = tree.flatten(args)
    traced = sg_compile(fn, backend="ane").trace(
        *tree.unflatten(treedef, [tensor(a) for a in leaves])
    )
    graph: Graph = traced.lower().graph
    return graph


def fp32_update_nodes(graph: Graph, n_forward_outputs: int) -> frozenset[int]:
    """Nodes that only the optimizer update needs: everything past the loss and scaled grads."""
    forward = {n.id for n in topological_order(graph.outputs[:n_forward_outputs])}
    return frozenset(n.id for n in graph.nodes() if n.id not in forward)


class AneTrainer:
    """Trains ``loss_fn(params, *inputs)`` with one compiled ANE program per input signature.

    Args:
        loss_fn: ``loss_fn(params: list[Tensor], *inputs) -> scalar Tensor``.
        params: initial parameters (NumPy arrays; kept as fp32 masters).
        example_inputs: arrays fixing the shapes/dtypes of ``inputs`` (one batch).
        optimizer: a ``shapegrad.train.optim`` optimizer (``init``/``update``).
        device_optimizer: lower the update into the program (see module docs).
        scaler: the :class:`LossScaler` (default: scale 2**15, growth every 200 steps).
        precision: ``"fp16"`` (default) or ``"fp32"`` compute for the fwd+bwd graph.
        runner: builds the executor of the lowered program; default Core ML on
            macOS 13+ (elsewhere ``step`` raises ``AneExecutionUnavailable``).
            Tests pass a MIL interpreter here.
        save_package: convert and save the ``.mlpackage`` (on by default).
        name / cache_dir: package name and cache directory.
    Raises:
        AneLoweringError: the loss uses a construct Core ML cannot express.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        params: Sequence[Array],
        example_inputs: Sequence[Array],
        optimizer: Any,
        *,
        device_optimizer: bool = False,
        scaler: LossScaler | None = None,
        precision: str = "fp16",
        runner: RunnerFactory | None = None,
        save_package: bool = True,
        name: str = "ane_train_step",
        cache_dir: str | None = None,
    ) -> None:
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.device_optimizer = device_optimizer
        self.scaler = scaler or LossScaler()
        self.params: list[Array] = [np.array(p, dtype=np.float32) for p in params]
        self.input_avals = [(np.shape(x), np.asarray(x).dtype) for x in example_inputs]
        self.opt_state: Any = optimizer.init([tensor(p) for p in self.params])
        self.steps = 0
        self.last_skipped = False
        self.graph = self._step_graph(example_inputs)
        fp32_nodes = (
            fp32_update_nodes(self.graph, 1 + len(self.params)) if device_optimizer else frozenset()
        )
        mil = lower_to_mil(self.graph, precision, fp32_nodes)
        self.mil_ops = mil.op_count()
        self.mil_text = mil.text()
        self.signature = IoSignature.of(mil)
        self.executable: AneExecutable | None = None
        if save_package:
            self.executable = compile_graph_lowered(
                lower_to_mil(self.graph, precision, fp32_nodes), name, cache_dir
            )
        self._runner = runner(mil) if runner is not None else None

    # --- the traced step ------------------------------------------------------------------

    def _step_graph(self, example_inputs: Sequence[Array]) -> Graph:
        loss_fn, optimizer = self.loss_fn, self.optimizer
        scale0 = np.array(self.scaler.scale, dtype=np.float32)

        def loss_and_scaled_grads(params: Any, inputs: Any, scale: Tensor) -> tuple[Any, Any]:
            from shapegrad.autodiff import grad

            loss = loss_fn(params, *inputs)
            scaled = grad(lambda ps: loss_fn(ps, *inputs) * scale)(params)
            return loss, scaled

        if not self.device_optimizer:
            return _trace(loss_and_scaled_grads, list(self.params), list(example_inputs), scale0)

        def step(params: Any, state: Any, inputs: Any, scale: Tensor, lr: Tensor) -> Any:
            loss, scaled = loss_and_scaled_grads(params, inputs, scale)
            grads = [g / scale for g in scaled]
            new_params, new_state = optimizer.update(params, grads, state, lr=lr)
            return loss, scaled, new_params, new_state

        state = tree.tree_map(lambda t: np.asarray(t.numpy()), self.opt_state)
        lr = np.array(optimizer.lr, dtype=np.float32)
        return _trace(step, list(self.params), state, list(example_inputs), scale0, lr)

    # --- running --------------------------------------------------------------------------

    def _run(self, arrays: list[Array]) -> list[Array]:
        if self._runner is not None:
            return self.signature.fetch(self._runner(self.signature.feeds(arrays)))
        if self.executable is None:
            raise RuntimeError("AneTrainer: no runner and no saved package to execute")
        return self.executable(arrays)

    def _check_inputs(self, inputs: Sequence[Array]) -> list[Array]:
        if len(inputs) != len(self.input_avals):
            raise TypeError(
                f"AneTrainer.step expects {len(self.input_avals)} inputs, got {len(inputs)}"
            )
        arrays = []
        for k, (x, (shape, dtype)) in enumerate(zip(inputs, self.input_avals, strict=True)):
            array = np.asarray(x)
            if array.shape != shape:
                raise ShapeError(
                    "AneTrainer.step",
                    f"input {k} has shape {fmt(array.shape)}, the compiled step expects {fmt(shape)}",
                )
            arrays.append(array.astype(dtype))
        return arrays

    def _program_inputs(self, arrays: list[Array], rate: float) -> list[Array]:
        """The program's positional inputs for this batch (weights, [state], batch, scale[, lr])."""
        scale = np.array(self.scaler.scale, dtype=np.float32)
        if not self.device_optimizer:
            return [*self.params, *arrays, scale]
        state_leaves, _ = tree.flatten(self.opt_state)
        state = [np.asarray(t.numpy() if isinstance(t, Tensor) else t) for t in state_leaves]
        return [*self.params, *state, *arrays, scale, np.array(rate, dtype=np.float32)]

    def loss(self, *inputs: Array) -> float:
        """The loss at the current weights (runs the step program, changes nothing)."""
        arrays = self._check_inputs(inputs)
        return float(self._run(self._program_inputs(arrays, float(self.optimizer.lr)))[0])

    def step(self, *inputs: Array, lr: float | None = None) -> float:
        """One training step on a batch; returns the loss (computed before the update).

        A step whose scaled gradients overflow changes nothing but the loss scale
        (``last_skipped`` is then True).
        """
        arrays = self._check_inputs(inputs)
        rate = float(self.optimizer.lr if lr is None else lr)
        scale = np.array(self.scaler.scale, dtype=np.float32)
        n = len(self.params)
        state_def = tree.flatten(self.opt_state)[1]
        outputs = self._run(self._program_inputs(arrays, rate))
        loss, scaled = float(outputs[0]), outputs[1 : 1 + n]
        finite = all_finite(scaled)
        self.scaler.update(finite)
        self.last_skipped = not finite
        if finite:
            if self.device_optimizer:
                self._accept_device_update(outputs[1 + n :], state_def)
            else:
                self._host_update([g / scale for g in scaled], rate)
        self.steps += 1
        return loss

    def _host_update(self, grads: list[Array], lr: float) -> None:
        params = [tensor(p) for p in self.params]
        new_params, self.opt_state = self.optimizer.update(
            params, [tensor(g.astype(np.float32)) for g in grads], self.opt_state, lr=lr
        )
        self.params = [np.asarray(p.numpy(), dtype=np.float32) for p in new_params]

    def _accept_device_update(self, outputs: list[Array], state_def: tree.TreeDef) -> None:
        n = len(self.params)
        self.params = [np.asarray(p, dtype=np.float32) for p in outputs[:n]]
        self.opt_state = tree.unflatten(state_def, [tensor(np.asarray(a)) for a in outputs[n:]])

    def get_params(self) -> list[Array]:
        """Copies of the fp32 master weights."""
        return [p.copy() for p in self.params]


def loss_scale_headroom(max_abs_grad: float) -> float:
    """The largest power-of-two scale keeping ``max_abs_grad * scale`` finite in fp16."""
    if max_abs_grad <= 0:
        return math.inf
    return 2.0 ** math.floor(math.log2(65504.0 / max_abs_grad))


# --- ScalarTrainer(mode="compiled", backend="ane") ---------------------------------------


class AneStrategy(StepStrategy):
    """``mode="compiled", backend="ane"``: :class:`~shapegrad.train.ane.AneTrainer` per batch
    signature; the fp32 master weights, the optimizer and the loss scale live on the host.

    Args:
        plan: the step plan (its ``scaling.window`` is the loss-scale growth window).
        optimizer: the trainer's optimizer (the only one this strategy updates with).
        leaves: the float32 master parameters.
        loss_scale: the initial dynamic loss scale (capped at 2**15: fp16's limit).
        device_optimizer: lower the update into the program.
        runner: executor factory for the lowered program (default: Core ML, macOS only).
    """

    kind: ClassVar[Kind] = "ane"

    def __init__(
        self,
        plan: StepPlan,
        optimizer: Optimizer,
        leaves: Sequence[Tensor],
        loss_scale: float,
        device_optimizer: bool = False,
        runner: RunnerFactory | None = None,
    ) -> None:
        super().__init__(plan)
        self.optimizer = optimizer
        self.device_optimizer = device_optimizer
        self.runner = runner
        self._leaves: list[Array] = [np.asarray(x.numpy(), dtype=np.float32) for x in leaves]
        self._opt_state: OptState | None = None  # before the engine exists
        self.scaler = LossScaler(loss_scale, plan.scaling.window)
        self.scaler.scale = min(self.scaler.scale, self.scaler.max_scale)  # 2**16 is inf in fp16
        self.engine: AneTrainer | None = None  # built for the latest batch signature
        self.functions = FunctionCache("ane")

    def build(self, inputs: Sequence[Any]) -> AneTrainer:
        """Trace, lower, convert and save the step program for this batch signature."""
        arrays = [_ane_array(x) for x in inputs]
        old = self.engine
        if old is not None and old.input_avals == [(a.shape, a.dtype) for a in arrays]:
            return old
        engine = AneTrainer(
            self._structured_loss,
            self._leaves,
            arrays,
            self.optimizer,
            device_optimizer=self.device_optimizer,
            scaler=self.scaler,
            runner=self.runner,
            name="trainer_ane_step",
        )
        if self._opt_state is not None:  # keep the optimizer's progress across signatures
            engine.opt_state = self._opt_state
        self.engine = engine
        return engine

    def _structured_loss(self, params: list[Tensor], *inputs: Any) -> Tensor:
        out = self.plan.loss_fn(tree.unflatten(self.plan.treedef, list(params)), *inputs)
        if isinstance(out, tuple):  # the device program has no output for updated state
            raise TypeError(
                "ScalarTrainer(backend='ane'): a loss returning (loss, new_params) is not "
                "supported on the Neural Engine; train it with backend='c' or mode='eager'"
            )
        return out

    def _store(self, engine: AneTrainer) -> None:
        self._leaves, self._opt_state = engine.params, engine.opt_state

    def step(self, optimizer: Optimizer, inputs: tuple[Any, ...], lr: float | None) -> float:
        if optimizer is not self.optimizer:
            raise NotImplementedError("ScalarTrainer(backend='ane'): only the trainer's optimizer")
        if lr is None:  # the schedule, at the host's step count (skipped steps included)
            schedule = self.plan.schedule
            lr = float(
                optimizer.lr
                if schedule is None
                else schedule(tensor(np.int32(self.global_step)), "float64")
            )
        engine = self.build(inputs)
        loss = float(engine.step(*[_ane_array(x) for x in inputs], lr=float(lr)))
        self._store(engine)
        self.last_lr = float(lr)
        self.global_step += 1
        return loss

    def forward(self, inputs: tuple[Any, ...]) -> float:
        return float(self.build(inputs).loss(*[_ane_array(x) for x in inputs]))

    def backward(self, inputs: tuple[Any, ...]) -> Any:
        """Gradients from an ``sg.compile(..., backend="ane")`` program (macOS to run)."""
        plan = self.plan

        def grads_of(params: Any, xs: tuple[Any, ...]) -> Any:
            _, grads = loss_and_grads(plan, params, xs, None)
            return full_grads(plan, params, grads)

        xs = tuple(convert_input(x, plan.compute) for x in inputs)
        return self.functions.get("backward", grads_of)(self.params(), xs)

    def params(self) -> Any:
        return tree.unflatten(self.plan.treedef, [tensor(a) for a in self._leaves])

    def set_params(self, params: Any) -> None:
        self._leaves = [np.asarray(x.numpy(), dtype=np.float32) for x in tree.flatten(params)[0]]
        if self.engine is not None:
            self.engine.params = list(self._leaves)

    def _own(self, optimizer: Optimizer) -> None:
        if optimizer.config_key() != self.optimizer.config_key():
            raise NotImplementedError("ScalarTrainer(backend='ane'): only the trainer's optimizer")

    def optimizer_state(self, optimizer: Optimizer) -> OptState:
        self._own(optimizer)
        if self.engine is not None:
            state: OptState = self.engine.opt_state
            return state
        if self._opt_state is None:
            self._opt_state = optimizer.init([tensor(a) for a in self._leaves])
        return self._opt_state

    def set_optimizer_state(self, state: OptState, optimizer: Optimizer) -> None:
        self._own(optimizer)
        self._opt_state = state
        if self.engine is not None:
            self.engine.opt_state = state

    def reset_optimizer_state(self) -> None:
        self._opt_state = None
        if self.engine is not None:
            self._opt_state = self.optimizer.init([tensor(a) for a in self._leaves])
            self.engine.opt_state = self._opt_state

    def step_count(self, optimizer: Optimizer) -> int:
        return self.global_step  # the ANE schedule runs on the host's step count

    def scaler_state(self) -> mp.ScalerState | None:
        return self.scaler.state()

    def set_scaler_state(self, state: mp.ScalerState | None) -> None:
        if state is not None:
            self.scaler.set_state(state)


def _ane_array(x: Any) -> Array:
    """A batch input as the ANE program takes it: floats as float32, integers as int32."""
    array = np.asarray(x.numpy() if isinstance(x, Tensor) else x)
    if array.dtype.kind == "f":
        return array.astype(np.float32, copy=False)
    if array.dtype.kind in "iub":
        return array.astype(np.int32, copy=False)
    return array


def check_ane_settings(
    flags: Sequence[bool], clip_norm: float | None, dtype: Any, leaves: Sequence[Tensor]
) -> None:
    """Reject ScalarTrainer settings the ANE design does not implement (clearly, up front)."""
    if not all(flags):
        raise NotImplementedError(
            "ScalarTrainer(backend='ane'): frozen parameters (requires_grad=False) are not "
            "supported; use backend='c'"
        )
    if clip_norm is not None:
        raise NotImplementedError(
            "ScalarTrainer(backend='ane'): clip_norm is not supported; use backend='c'"
        )
    if dtype is not None and str(dtype) not in ("float16", "float32"):
        raise TypeError(f"ScalarTrainer(backend='ane'): dtype must be float16/float32, got {dtype}")
    for k, x in enumerate(leaves):
        if x.dtype.name not in ("float16", "float32"):
            raise TypeError(
                f"ScalarTrainer(backend='ane'): parameter {k} is {x.aval}; the ane backend "
                "trains float32 master weights"
            )


__all__ = [
    "AneStrategy",
    "AneTrainer",
    "LossScaler",
    "all_finite",
    "check_ane_settings",
    "fp32_update_nodes",
    "loss_scale_headroom",
]
