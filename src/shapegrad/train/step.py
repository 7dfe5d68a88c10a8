"""The pure functions of one training step, traced by ``sg.compile`` in compiled mode.

``train_step(plan, optimizer, params, opt_state, scaler, lr, inputs)`` does the
forward pass, the backward pass (only for trainable leaves; over ``accumulate``
micro-batches when set), the average of gradients and loss over the processes of
a data-parallel communicator (``all_reduce`` primitives, so a compiled step calls
MPI inside its one native call), optional gradient clipping, the learning-rate schedule, the optimizer update and the
float16 loss-scale bookkeeping, using Tensor operations only. ``StepPlan``
holds the static settings it closes over.

Two optional loss conventions:

* **a per-step random key**: a loss with a ``key`` parameter
  (``loss(params, x, y, *, key)``) gets ``sg.random.fold_in(base_key, step)``,
  where ``step`` is the optimizer's update counter (a traced value: new dropout
  masks every step, one trace) and ``base_key`` comes from the trainer's seed.
  Both are checkpointed (the counter with the optimizer state), so a resumed run
  draws the same masks. ``forward``/``backward`` use ``base_key`` itself.
* **updated state**: a loss may return ``(loss, new_params)`` (e.g. a model whose
  batch-norm running statistics moved); the step then takes every non-trainable
  leaf (``requires_grad`` False: running statistics, frozen tensors) from
  ``new_params``, the trainable ones from the optimizer. A loss that returns only
  the scalar gets the same from the updates its modules recorded
  (``Module.with_state``, e.g. ``BatchNorm`` in training): the loss runs inside
  ``sg.nn.state_updates()`` and the step applies what was recorded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad import random, tree
from shapegrad.autodiff import value_and_grad
from shapegrad.dtypes import DType, float16, int32
from shapegrad.nn._state import state_updates
from shapegrad.ops import prims as p
from shapegrad.tensor import Tensor
from shapegrad.train import mixed_precision as mp
from shapegrad.train.optim import Optimizer, OptState, clip_by_global_norm
from shapegrad.train.schedules import Schedule

# A loss returns the scalar loss, or ``(loss, new_params)`` when the model updates state
# by hand (the documented pattern before ``Module.with_state``); both are accepted.
LossFn = Callable[..., Tensor | tuple[Tensor, Any]]
_BUCKET_GRADIENTS = True  # gradients all-reduced in buckets, not one exchange per tensor
# Bytes per gradient bucket (one all-reduce each). The C backend starts a bucket's
# all-reduce as soon as its last gradient is written and waits for it just before the
# update reads it (compiler/overlap.py), so smaller buckets overlap more of the backward
# pass; each bucket costs a start, a wait and a synchronisation (and a copy into one
# buffer when it holds several gradients). benchmarks/data_parallel.py --bucket-sweep
# (MLP 784-512-512-10, 2 ranks x 1 thread, 2-core AMD EPYC, load 14-15 from other jobs),
# step ms in five runs, each interleaving all of them: overlapped 1 MiB 26.2 / 24.2 /
# 24.9 / 24.2 / 24.2, per gradient 27.7 / 24.1 / 27.1 / 27.7 / 22.4, blocking one bucket
# 26.1 / 22.5 / 24.0 / 24.4 / 24.5, blocking 1 MiB buckets 36.7 / 38.7 / 38.9 / 28.7 /
# 32.7; no exchange at all 3.6-11.8: at that load the wait for the other rank's time
# slice dominates, which no bucket size hides. (For this MLP 256 KiB makes the same
# buckets as 1 MiB and 4 MiB one bucket.) 1 MiB (PyTorch DDP's first bucket) ties the
# best and overlaps the most backward work with few exchanges: [b3 W3 b2 loss] [W2]
# [b1] [W1]; quiet-machine figures are still to be taken.
BUCKET_BYTES = 1 << 20


@dataclass(frozen=True)
class StepPlan:
    """The static part of a training step: everything the traced function closes over."""

    loss_fn: LossFn
    treedef: tree.TreeDef
    flags: tuple[bool, ...]
    master: DType
    compute: DType
    clip_norm: float | None
    schedule: Schedule | None
    scaling: mp.LossScalePolicy  # float16 only: the dynamic loss-scale rule
    base_key: tuple[int, int] | None = None  # set when the loss takes a `key`
    comm: Any = None  # a shapegrad.distributed Communicator: average gradients over it
    accumulate: int = 1  # micro-batches per step (inputs split along their first axis)
    # Data-parallel bucket size (None: BUCKET_BYTES). The CUDA step stages each exchange
    # through host memory and ends its CUDA graph there, so it takes one bucket.
    bucket_bytes: int | None = None

    @property
    def trainable(self) -> list[int]:
        return [i for i, f in enumerate(self.flags) if f]

    @property
    def fp16(self) -> bool:
        return self.compute == float16


# --- the pure step functions (traced by sg.compile in compiled mode) ----------------------


def _compute_params(plan: StepPlan, leaves: Sequence[Tensor]) -> Any:
    """Parameters as the loss sees them: float leaves cast to the compute dtype."""
    cast = [p.cast(x, plan.compute) if x.dtype.is_float else x for x in leaves]
    return tree.unflatten(plan.treedef, cast)


def loss_takes_key(loss_fn: Callable[..., Any]) -> bool:
    """True when ``loss_fn`` has a parameter called ``key`` (it wants a per-step random key)."""
    try:
        parameter = inspect.signature(loss_fn).parameters.get("key")
    except (TypeError, ValueError):  # builtins, some C callables: no signature to read
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def step_key(plan: StepPlan, counter: Tensor | None) -> Tensor | None:
    """The key of the step numbered ``counter`` (the base key when None); None without a key."""
    if plan.base_key is None:
        return None
    base = p.constant(np.asarray(plan.base_key, dtype=np.int32), int32, like=counter)
    return base if counter is None else random.fold_in(base, counter)


def _loss_and_updated(
    plan: StepPlan, params: Any, inputs: tuple[Any, ...], key: Tensor | None
) -> tuple[Tensor, list[Tensor] | None]:
    """The loss in the master dtype and, when the loss returns ``(loss, new_params)``, the
    leaves of ``new_params``."""
    leaves, _ = tree.flatten(params)
    compute = _compute_params(plan, leaves)
    with state_updates() as recorded:
        out = (
            plan.loss_fn(compute, *inputs, key=key)
            if key is not None
            else plan.loss_fn(compute, *inputs)
        )
    updated: list[Tensor] | None = None
    if not isinstance(out, tuple) and len(recorded):  # modules recorded new state
        updated = tree.flatten(recorded.apply(compute))[0]
    if isinstance(out, tuple) and len(out) == 2:
        out, new_params = out
        new_leaves, new_def = tree.flatten(new_params)
        if new_def.signature() != plan.treedef.signature() or [x.shape for x in new_leaves] != [
            x.shape for x in leaves
        ]:
            raise TypeError(
                "ScalarTrainer: a loss returning (loss, new_params) must return new_params "
                "with the structure and shapes of the parameters it was given"
            )
        updated = new_leaves
    if not isinstance(out, Tensor) or out.size != 1:
        shown = getattr(out, "shape", type(out).__name__)
        raise TypeError(
            f"ScalarTrainer: the loss function must return a scalar Tensor (or (loss, "
            f"new_params)), got {shown}"
        )
    return p.cast(p.reshape(out, ()), plan.master), updated


def loss_value(
    plan: StepPlan, params: Any, inputs: tuple[Any, ...], key: Tensor | None = None
) -> Tensor:
    """The loss in the master dtype (a fp16 loss is upcast before scaling and reporting)."""
    if key is None:
        key = step_key(plan, None)
    return _loss_and_updated(plan, params, inputs, key)[0]


def loss_and_grads(
    plan: StepPlan,
    params: Any,
    inputs: tuple[Any, ...],
    scale: Tensor | None,
    key: Tensor | None = None,
) -> tuple[Tensor, list[Tensor]]:
    """Loss and the (unscaled) gradients of the trainable leaves, in the master dtype."""
    loss, grads, _ = loss_grads_and_updated(plan, params, inputs, scale, key)
    return loss, grads


def loss_grads_and_updated(
    plan: StepPlan,
    params: Any,
    inputs: tuple[Any, ...],
    scale: Tensor | None,
    key: Tensor | None = None,
) -> tuple[Tensor, list[Tensor], list[Tensor] | None]:
    """:func:`loss_and_grads` plus the leaves of the params the loss returned (or None).

    With ``plan.accumulate = k`` the batch is split into ``k`` equal micro-batches along
    the first axis of every array input; the loss and gradients are the means over them
    (equal to the whole batch's for a mean loss), and only one micro-batch's activations
    need to be live at a time. Micro-batch ``j > 0`` draws with ``fold_in(key, j)``;
    returned state (running statistics) is the last micro-batch's.

    Data parallel (``plan.comm``): the loss and gradients are then averaged over the
    processes (each computed them on its own shard of the global batch), before anything
    reads them: clipping, the loss-scale check and the optimizer see the global values,
    so every process applies the identical update to its identical parameters. Returned
    float state is averaged too (it must stay identical on every process), and a random
    key is folded with the rank (each shard draws its own dropout masks).
    """
    if key is None:
        key = step_key(plan, None)
    comm = plan.comm
    if key is not None and comm is not None and comm.size > 1:
        key = random.fold_in(key, comm.rank)
    if plan.accumulate == 1:
        loss, grads, updated = _loss_grads_and_updated(plan, params, inputs, scale, key)
    else:
        k = plan.accumulate
        total_loss: Tensor | None = None
        total: list[Tensor] = []
        updated = None
        for j, part in enumerate(micro_batches(inputs, k)):
            part_key = key if key is None or j == 0 else random.fold_in(key, j)
            loss, grads, updated = _loss_grads_and_updated(plan, params, part, scale, part_key)
            total_loss = loss if total_loss is None else total_loss + loss
            total = list(grads) if not total else [a + g for a, g in zip(total, grads, strict=True)]
        assert total_loss is not None
        loss, grads = total_loss / float(k), [g / float(k) for g in total]
    loss, grads = average_over_processes(plan, loss, grads, plan.bucket_bytes)
    if updated is not None and comm is not None and comm.size > 1:
        updated = [
            p.all_reduce(x, comm, "mean") if x.dtype.is_float and not f else x
            for x, f in zip(updated, plan.flags, strict=True)
        ]
    return loss, grads, updated


def _loss_grads_and_updated(
    plan: StepPlan,
    params: Any,
    inputs: tuple[Any, ...],
    scale: Tensor | None,
    key: Tensor | None,
) -> tuple[Tensor, list[Tensor], list[Tensor] | None]:
    leaves, _ = tree.flatten(params)
    index = plan.trainable

    def objective(trainable: list[Tensor]) -> tuple[Tensor, Any]:
        merged = list(leaves)
        for k, i in enumerate(index):
            merged[i] = trainable[k]
        loss, updated = _loss_and_updated(plan, tree.unflatten(plan.treedef, merged), inputs, key)
        return (loss * scale if scale is not None else loss), (loss, updated)

    (_, (loss, updated)), grads = value_and_grad(objective, has_aux=True)(
        [leaves[i] for i in index]
    )
    if scale is not None:
        grads = [g / p.cast(scale, g.dtype) for g in grads]
    if updated is not None:  # state is not differentiated through
        updated = [p.stop_gradient(x) for x in updated]
    return loss, list(grads), updated


def micro_batches(inputs: tuple[Any, ...], k: int) -> list[tuple[Any, ...]]:
    """``inputs`` split into ``k`` equal parts along the first axis of each tensor input
    (other inputs are passed to every part unchanged)."""
    for n, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.ndim >= 1 and x.shape[0] % k:
            raise ValueError(
                f"ScalarTrainer(accumulate={k}): input {n} has {x.shape[0]} rows (shape "
                f"{list(x.shape)}), which do not split into {k} equal micro-batches"
            )
    parts = []
    for j in range(k):
        part = []
        for x in inputs:
            if isinstance(x, Tensor) and x.ndim >= 1:
                rows = x.shape[0] // k
                stops = [(j + 1) * rows, *x.shape[1:]]
                x = p.slice_(x, [j * rows] + [0] * (x.ndim - 1), stops, [1] * x.ndim)
            part.append(x)
        parts.append(tuple(part))
    return parts


def average_over_processes(
    plan: StepPlan, loss: Tensor, grads: Sequence[Tensor], bucket_bytes: int | None = None
) -> tuple[Tensor, list[Tensor]]:
    """Data parallel: the mean loss and mean gradients over the processes of ``plan.comm``
    (each process computed them on its own shard of the global batch).

    The gradients are all-reduced in buckets (:func:`gradient_buckets`: the last
    parameters first, as the backward pass produces them; ``bucket_bytes`` default
    :data:`BUCKET_BYTES`), the loss with the first one (or alone when the last gradient
    fills a bucket by itself). Each bucket is one ``all_reduce`` of its values (concatenated
    when it holds several), a sum divided by the process count where each value is read,
    so the division fuses into the optimizer's update."""
    if plan.comm is None or plan.comm.size == 1:
        return loss, list(grads)
    if not _BUCKET_GRADIENTS or any(g.dtype != loss.dtype for g in grads):
        mean = [p.all_reduce(g, plan.comm, "mean") for g in grads]
        return p.all_reduce(loss, plan.comm, "mean"), mean
    size = float(plan.comm.size)
    limit = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    parts = [*grads, loss]  # the loss last: the first bucket takes it (it is ready first)
    means: list[Tensor | None] = [None] * len(parts)
    for bucket in gradient_buckets([x.size for x in parts], loss.dtype.numpy.itemsize, limit):
        if len(bucket) == 1:  # exchanged where it is, no copy
            means[bucket[0]] = p.all_reduce(parts[bucket[0]], plan.comm, "sum") / size
            continue
        flat = [p.reshape(parts[i], (parts[i].size,)) for i in bucket]
        total = p.all_reduce(p.concat(flat, 0), plan.comm, "sum")
        offset = 0
        for i in bucket:
            part = p.slice_(total, [offset], [offset + parts[i].size], [1])
            means[i] = p.reshape(part, parts[i].shape) / size
            offset += parts[i].size
    out = [x for x in means if x is not None]
    return out[-1], out[:-1]


def gradient_buckets(sizes: Sequence[int], itemsize: int, bucket_bytes: int) -> list[list[int]]:
    """Gradient indices grouped into buckets, last gradient first: the backward pass writes
    the last layer's gradients first, so the first bucket is complete first.

    A gradient of at least ``bucket_bytes`` is a bucket of its own (exchanged in place, no
    copy; never split). Smaller ones fill a bucket, in order, until it holds at least
    ``bucket_bytes`` or a large gradient comes between them (a bucket is complete no later
    than its neighbours in the backward pass).

    Example:
        >>> gradient_buckets([40, 2, 3, 1], itemsize=4, bucket_bytes=16)
        [[3, 2], [1], [0]]
    """
    if bucket_bytes <= 0:
        raise ValueError(f"gradient buckets: bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[int]] = []
    used = bucket_bytes  # >= bucket_bytes: the next gradient opens a bucket
    for i in reversed(range(len(sizes))):
        nbytes = sizes[i] * itemsize
        if nbytes >= bucket_bytes:
            buckets.append([i])
            used = bucket_bytes
            continue
        if used >= bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += nbytes
    return buckets


def full_grads(plan: StepPlan, params: Any, trainable: Sequence[Tensor]) -> Any:
    """Gradients shaped like ``params``: the computed ones, zeros for frozen leaves."""
    leaves, _ = tree.flatten(params)
    out = [p.zeros_like(x) for x in leaves]
    for k, i in enumerate(plan.trainable):
        out[i] = trainable[k]
    return tree.unflatten(plan.treedef, out)


def train_step(
    plan: StepPlan,
    optimizer: Optimizer,
    params: Any,
    opt_state: OptState,
    scaler: dict[str, Tensor] | None,
    lr: Tensor | None,
    inputs: tuple[Any, ...],
) -> tuple[Tensor, Any, OptState, dict[str, Tensor] | None, Tensor]:
    """One update: ``(loss, new_params, new_opt_state, new_scaler_state, lr_used)``.

    The learning rate actually used comes back as an output so logging it costs nothing
    (no eager evaluation of the schedule outside the compiled step).
    """
    scale = scaler["scale"] if scaler is not None else None
    key = step_key(plan, opt_state["step"])
    loss, grads, updated = loss_grads_and_updated(plan, params, inputs, scale, key)
    if plan.clip_norm is not None:
        grads = clip_by_global_norm(grads, plan.clip_norm)
    rate = lr
    if rate is None:
        if plan.schedule is None:
            raise ValueError("ScalarTrainer: no learning rate and no schedule")
        rate = plan.schedule(opt_state["step"], plan.master)
    new_params, new_state = optimizer.update(
        params, full_grads(plan, params, grads), opt_state, rate, requires_grad=plan.flags
    )
    if updated is not None:  # non-trainable leaves (running statistics) follow the loss
        new_leaves, _ = tree.flatten(new_params)
        for i, trainable in enumerate(plan.flags):
            if not trainable:
                new_leaves[i] = p.cast(updated[i], new_leaves[i].dtype)
        new_params = tree.unflatten(plan.treedef, new_leaves)
    if scaler is None:
        return loss, new_params, new_state, None, rate
    loss, new_params, new_state, new_scaler = plan.scaling.apply_or_skip(
        grads, (params, opt_state), (new_params, new_state), scaler, loss
    )
    return loss, new_params, new_state, new_scaler, rate


__all__ = [
    "BUCKET_BYTES",
    "LossFn",
    "StepPlan",
    "average_over_processes",
    "full_grads",
    "gradient_buckets",
    "loss_and_grads",
    "loss_grads_and_updated",
    "loss_takes_key",
    "loss_value",
    "micro_batches",
    "step_key",
    "train_step",
]
