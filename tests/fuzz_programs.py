"""Random well-typed programs over shapegrad's public ops, for the differential fuzzer.

A program is data: input shapes, a list of steps (op name, operand positions, parameters)
and the positions of its outputs. Two interpreters run it: :func:`run_sg` on shapegrad
tensors (eager or traced) and :func:`run_torch` on PyTorch tensors. Shapes include size-1
and size-0 dimensions; inputs may be transposed (non-contiguous) views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shapegrad as sg

Shape = tuple[int, ...]


@dataclass
class Step:
    op: str
    args: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Program:
    dtype: str
    inputs: list[Shape]
    transposed: list[bool]  # feed input k as a transposed view of a contiguous array
    steps: list[Step]
    outputs: list[int]  # positions in the value list (inputs first, then one per step)
    special: bool = False  # inputs hold +-inf and NaN among their values

    def describe(self) -> str:
        lines = [f"dtype {self.dtype}{' with +-inf/NaN inputs' * self.special}"]
        lines += [
            f"v{k} = input{list(s)}{' (transposed)' * t}"
            for k, (s, t) in enumerate(zip(self.inputs, self.transposed, strict=True))
        ]
        base = len(self.inputs)
        for k, step in enumerate(self.steps):
            args = ", ".join(f"v{a}" for a in step.args)
            params = {key: v for key, v in step.params.items() if not isinstance(v, np.ndarray)}
            lines.append(f"v{base + k} = {step.op}({args}) {params}")
        lines.append(f"outputs {[f'v{o}' for o in self.outputs]}")
        return "\n".join(lines)


# --- the ops: (shapegrad implementation, torch implementation) -----------------------------


def _sg_unary(name: str) -> Callable[[Any], Any]:
    table: dict[str, Callable[[Any], Any]] = {
        "tanh": sg.tanh,
        "sigmoid": sg.sigmoid,
        "relu": sg.relu,
        "abs": sg.abs,
        "neg": sg.neg,
        "sin": sg.sin,
        "cos": sg.cos,
        "exp": lambda x: sg.exp(sg.tanh(x)),
        "log": lambda x: sg.log(sg.abs(x) + 1.0),
        "sqrt": lambda x: sg.sqrt(sg.abs(x) + 0.5),
        "square": lambda x: x * x,
        "affine": lambda x: x * 2.5 - 1.0,
    }
    return table[name]


def _torch_unary(torch: Any, name: str) -> Callable[[Any], Any]:
    table: dict[str, Callable[[Any], Any]] = {
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "relu": torch.relu,
        "abs": torch.abs,
        "neg": torch.neg,
        "sin": torch.sin,
        "cos": torch.cos,
        "exp": lambda x: torch.exp(torch.tanh(x)),
        "log": lambda x: torch.log(torch.abs(x) + 1.0),
        "sqrt": lambda x: torch.sqrt(torch.abs(x) + 0.5),
        "square": lambda x: x * x,
        "affine": lambda x: x * 2.5 - 1.0,
    }
    return table[name]


UNARY = (
    "tanh",
    "sigmoid",
    "relu",
    "abs",
    "neg",
    "sin",
    "cos",
    "exp",
    "log",
    "sqrt",
    "square",
    "affine",
)
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "where")
REDUCE = ("sum", "mean", "max", "min", "var", "logsumexp")
# int32 programs: the ops with integer semantics ("select" is "where" without the 0.5).
INT_UNARY = ("abs", "neg", "square", "relu")
INT_BINARY = ("add", "sub", "mul", "maximum", "minimum", "select")
_ALL_BINARY = frozenset(BINARY + INT_BINARY)
INT_REDUCE = ("sum", "max", "min")
INT_KINDS = ("unary", "binary", "reduce", "layout", "layout", "matmul", "gather")
# Step kinds of the mixed (default) programs; float16 and +-inf/NaN programs use them too.
KINDS = (
    "unary",
    "binary",
    "reduce",
    "softmax",
    "layout",
    "layout",
    "matmul",
    "gather",
    "conv",
    "norm",
    "loss",
)


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def run_sg(program: Program, inputs: Sequence[Any]) -> list[Any]:
    """The program's outputs on shapegrad tensors (eager or traced)."""
    values = list(inputs)
    for step in program.steps:
        values.append(_sg_step(step, [values[a] for a in step.args]))
    return [values[o] for o in program.outputs]


def _sg_step(step: Step, xs: list[Any]) -> Any:
    op, kw = step.op, step.params
    if op in UNARY:
        return _sg_unary(op)(xs[0])
    if op in _ALL_BINARY:
        a, b = xs
        return {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "div": lambda: a / (sg.abs(b) + 1.0),
            "maximum": lambda: sg.maximum(a, b),
            "minimum": lambda: sg.minimum(a, b),
            "where": lambda: sg.where(a > b, a, b * 0.5),
            "select": lambda: sg.where(a > b, a, b),
        }[op]()
    x = xs[0]
    if op in REDUCE:
        fn = {
            "sum": sg.sum,
            "mean": sg.mean,
            "max": sg.max,
            "min": sg.min,
            "var": sg.var,
            "logsumexp": sg.logsumexp,
        }[op]
        return fn(x, axis=kw["axis"], keepdims=kw["keepdims"])
    if op == "softmax":
        return sg.softmax(x, axis=kw["axis"])
    if op == "log_softmax":
        return sg.log_softmax(x, axis=kw["axis"])
    if op == "transpose":
        return sg.transpose(x, kw["perm"])
    if op == "reshape":
        return sg.reshape(x, kw["shape"])
    if op == "slice":
        return sg.slice(x, kw["start"], kw["stop"], kw["step"], axis=kw["axis"])
    if op == "pad":
        return sg.pad(x, kw["width"], constant_values=kw["value"])
    if op == "concat":
        return sg.concat(xs, axis=kw["axis"])
    if op == "matmul":
        return sg.matmul(xs[0], xs[1])
    if op == "einsum":
        return sg.einsum(kw["spec"], *xs)
    if op == "take":
        return sg.take(x, kw["indices"], axis=kw["axis"])
    if op == "embedding":
        return sg.embedding(x, kw["indices"])
    if op == "conv2d":
        return sg.conv2d(xs[0], xs[1], stride=kw["stride"], padding=kw["padding"])
    if op == "max_pool2d":
        return sg.max_pool2d(x, kw["kernel"], padding=kw["padding"])
    if op == "avg_pool2d":
        return sg.avg_pool2d(x, kw["kernel"], padding=kw["padding"])
    if op == "layer_norm":
        return sg.layer_norm(x, axis=-1)
    if op == "cross_entropy":
        return sg.cross_entropy(x, kw["labels"])
    if op == "mse":
        return sg.mse(xs[0], xs[1])
    raise KeyError(op)


def run_torch(torch: Any, program: Program, inputs: Sequence[Any]) -> list[Any]:
    """The same program on PyTorch tensors."""
    values = list(inputs)
    for step in program.steps:
        values.append(_torch_step(torch, step, [values[a] for a in step.args]))
    return [values[o] for o in program.outputs]


def _axes(axis: int | None, ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim)) if axis is None else (axis % ndim,)


def _torch_step(torch: Any, step: Step, xs: list[Any]) -> Any:
    op, kw = step.op, step.params
    F = torch.nn.functional
    if op in UNARY:
        return _torch_unary(torch, op)(xs[0])
    if op in _ALL_BINARY:
        a, b = xs
        return {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "div": lambda: a / (torch.abs(b) + 1.0),
            "maximum": lambda: torch.maximum(a, b),
            "minimum": lambda: torch.minimum(a, b),
            "where": lambda: torch.where(a > b, a, b * 0.5),
            "select": lambda: torch.where(a > b, a, b),
        }[op]()
    x = xs[0]
    if op in REDUCE:
        dims = _axes(kw["axis"], x.ndim)
        keep = kw["keepdims"]
        if x.ndim == 0:
            return {"var": lambda: x * 0.0}.get(op, lambda: x * 1.0)()
        if op == "sum":
            return torch.sum(x, dim=dims, keepdim=keep)
        if op == "mean":
            return torch.mean(x, dim=dims, keepdim=keep)
        if op == "max":
            return torch.amax(x, dim=dims, keepdim=keep)
        if op == "min":
            return torch.amin(x, dim=dims, keepdim=keep)
        if op == "var":
            return torch.var(x, dim=dims, keepdim=keep, unbiased=False)
        return torch.logsumexp(x, dim=dims, keepdim=keep)
    if op == "softmax":
        return torch.softmax(x, dim=kw["axis"])
    if op == "log_softmax":
        return torch.log_softmax(x, dim=kw["axis"])
    if op == "transpose":
        return x.permute(*kw["perm"])
    if op == "reshape":
        return x.reshape(kw["shape"])
    if op == "slice":
        index = [slice(None)] * x.ndim
        index[kw["axis"]] = slice(kw["start"], kw["stop"], kw["step"])
        return x[tuple(index)]
    if op == "pad":
        flat = [v for pair in reversed(kw["width"]) for v in pair]
        return F.pad(x, flat, value=kw["value"])
    if op == "concat":
        return torch.cat(xs, dim=kw["axis"])
    if op == "matmul":
        return torch.matmul(xs[0], xs[1])
    if op == "einsum":
        return torch.einsum(kw["spec"], *xs)
    if op == "take":
        idx = torch.as_tensor(kw["indices"].astype(np.int64))
        axis = kw["axis"] % x.ndim
        picked = torch.index_select(x, axis, idx.reshape(-1) % x.shape[axis])
        shape = (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :])
        return picked.reshape(shape)
    if op == "embedding":
        return F.embedding(torch.as_tensor(kw["indices"].astype(np.int64)), x)
    if op == "conv2d":
        return F.conv2d(xs[0], xs[1], stride=kw["stride"], padding=kw["padding"])
    if op == "max_pool2d":
        return F.max_pool2d(x, kw["kernel"], padding=kw["padding"])
    if op == "avg_pool2d":
        return F.avg_pool2d(x, kw["kernel"], padding=kw["padding"])
    if op == "layer_norm":
        return F.layer_norm(x, (x.shape[-1],), eps=1e-5)
    if op == "cross_entropy":
        return F.cross_entropy(x, torch.as_tensor(kw["labels"].astype(np.int64)))
    if op == "mse":
        return F.mse_loss(xs[0], xs[1])
    raise KeyError(op)


# --- the generator ----------------------------------------------------------------------------


class _Builder:
    def __init__(self, rng: np.random.Generator, dtype: str) -> None:
        self.rng = rng
        self.program = Program(dtype, [], [], [], [])
        self.shapes: list[Shape] = []

    def dim(self, allow_zero: bool = True) -> int:
        choices = [0, 1, 2, 3, 4, 5] if allow_zero else [1, 2, 3, 4, 5]
        weights = [0.06, 0.2, 0.24, 0.22, 0.14, 0.14] if allow_zero else [0.2, 0.3, 0.2, 0.15, 0.15]
        return int(self.rng.choice(choices, p=np.array(weights) / sum(weights)))

    def new_input(self, shape: Shape) -> int:
        self.program.inputs.append(shape)
        self.program.transposed.append(bool(len(shape) >= 2 and self.rng.random() < 0.3))
        # inputs are numbered before every step: renumber step operands on the fly
        position = len(self.program.inputs) - 1
        for step in self.program.steps:
            step.args = tuple(a + 1 if a >= position else a for a in step.args)
        self.program.outputs = [o + 1 if o >= position else o for o in self.program.outputs]
        self.shapes.insert(position, shape)
        return position

    def add(self, op: str, args: Sequence[int], out: Shape, **params: Any) -> int:
        self.program.steps.append(Step(op, tuple(args), params))
        self.shapes.append(out)
        return len(self.shapes) - 1

    def pick(self, min_ndim: int = 0, nonempty: bool = False) -> int | None:
        ok = [
            k
            for k, s in enumerate(self.shapes)
            if len(s) >= min_ndim and (not nonempty or 0 not in s)
        ]
        return int(self.rng.choice(ok)) if ok else None


def generate(rng: np.random.Generator, kind: str = "mixed") -> Program:
    """One random, well-typed program.

    ``kind``: ``"mixed"`` (float32 or float64), ``"float16"``, ``"int32"`` (integer ops
    only, no gradients) or ``"special"`` (float32/float64 inputs holding +-inf and NaN).
    """
    if kind in ("mixed", "special"):
        dtype = "float64" if rng.random() < 0.5 else "float32"
    else:
        dtype = kind
    b = _Builder(rng, dtype)
    b.program.special = kind == "special"
    rank = int(rng.integers(0, 5))
    base = tuple(b.dim() for _ in range(rank))
    b.new_input(base)
    if rng.random() < 0.7:  # a broadcast-compatible second input
        keep = int(rng.integers(0, rank + 1))
        b.new_input(tuple(1 if rng.random() < 0.3 else d for d in base[rank - keep :]))
    for _ in range(int(rng.integers(2, 7))):
        _random_step(b)
    last = len(b.shapes) - 1
    b.program.outputs = sorted({last, int(rng.integers(0, last + 1))})
    return b.program


def _random_step(b: _Builder) -> None:
    rng = b.rng
    integer = b.program.dtype == "int32"
    kind = rng.choice(list(INT_KINDS if integer else KINDS))
    x = b.pick()
    assert x is not None
    shape = b.shapes[x]
    if kind == "unary":
        b.add(str(rng.choice(INT_UNARY if integer else UNARY)), [x], shape)
    elif kind == "binary":
        partners = [k for k, s in enumerate(b.shapes) if _broadcast(shape, s) is not None]
        partners = _not_itself(b, x, partners)
        y = int(rng.choice(partners))
        out = _broadcast(shape, b.shapes[y])
        assert out is not None
        b.add(str(rng.choice(INT_BINARY if integer else BINARY)), [x, y], out)
    elif kind == "reduce":
        op = str(rng.choice(INT_REDUCE if integer else REDUCE))
        axis = (
            None if not shape or rng.random() < 0.3 else int(rng.integers(-len(shape), len(shape)))
        )
        keep = bool(rng.random() < 0.5)
        axes = range(len(shape)) if axis is None else [axis % len(shape)]
        if op in ("max", "min", "var", "logsumexp") and any(shape[a] == 0 for a in axes):
            op = "sum" if op in ("max", "min") else op  # max of nothing has no value
        out = (
            tuple(1 if a in axes else d for a, d in enumerate(shape))
            if keep
            else tuple(d for a, d in enumerate(shape) if a not in axes)
        )
        if axis is None and not keep:
            out = ()
        b.add(op, [x], out, axis=axis, keepdims=keep)
    elif kind == "softmax" and shape:
        axis = int(rng.integers(-len(shape), len(shape)))
        b.add(str(rng.choice(["softmax", "log_softmax"])), [x], shape, axis=axis)
    elif kind == "layout" and shape:
        _layout_step(b, x, shape)
    elif kind == "matmul":
        _matmul_step(b, x, shape)
    elif kind == "gather" and shape:
        axis = int(rng.integers(0, len(shape)))
        if shape[axis] == 0:
            return
        n = shape[axis]
        idx_shape = tuple(b.dim() for _ in range(int(rng.integers(0, 3))))
        indices = rng.integers(-n, n, size=idx_shape).astype(np.int32)
        out = (*shape[:axis], *idx_shape, *shape[axis + 1 :])
        if len(shape) == 2 and axis == 0 and rng.random() < 0.5:
            b.add("embedding", [x], out, indices=indices % n)
        else:
            b.add("take", [x], out, indices=indices, axis=axis)
    elif kind == "conv":
        _conv_step(b)
    elif kind == "norm" and shape and shape[-1] > 0 and b.program.dtype != "float16":
        # Not in float16: its gradient divides float16 rounding noise by the row's std
        # (0.04 off float64 for 2-element rows; PyTorch computes it in float32).
        b.add("layer_norm", [x], shape)
    elif kind == "loss":
        if len(shape) == 2 and shape[1] > 0 and rng.random() < 0.6:
            labels = rng.integers(0, shape[1], size=shape[0]).astype(np.int32)
            b.add("cross_entropy", [x], (), labels=labels)
        else:
            same = _not_itself(b, x, [k for k, s in enumerate(b.shapes) if s == shape])
            b.add("mse", [x, int(rng.choice(same))], ())


def _not_itself(b: _Builder, x: int, candidates: list[int]) -> list[int]:
    """Partners of ``x`` for a binary op. In +-inf/NaN programs never ``x`` itself (when
    another fits): the C backend compiles with ``-fassociative-math``, under which gcc may
    fold ``x - x`` (and the ``g - g`` of its gradient) to 0 for a NaN ``x``; that known
    divergence is not what these programs look for."""
    if not b.program.special:
        return candidates
    others = [k for k in candidates if k != x]
    return others or candidates


def _layout_step(b: _Builder, x: int, shape: Shape) -> None:
    rng = b.rng
    choice = rng.choice(["transpose", "reshape", "slice", "pad", "concat"])
    n = len(shape)
    if choice == "transpose":
        perm = tuple(int(a) for a in rng.permutation(n))
        b.add("transpose", [x], tuple(shape[a] for a in perm), perm=perm)
    elif choice == "reshape":
        size = int(np.prod(shape))
        target: Shape = (size,) if rng.random() < 0.5 or size == 0 else (1, size, 1)
        b.add("reshape", [x], target, shape=target)
    elif choice == "slice":
        axis = int(rng.integers(0, n))
        d = shape[axis]
        start, stop = int(rng.integers(0, d + 1)), int(rng.integers(0, d + 2))
        step = int(rng.choice([1, 1, 2]))
        size = len(range(*slice(start, stop, step).indices(d)))
        out = tuple(size if a == axis else s for a, s in enumerate(shape))
        b.add("slice", [x], out, start=start, stop=stop, step=step, axis=axis)
    elif choice == "pad":
        width = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in shape)
        value: float = float(rng.choice([0.0, -2.0, 1.5]))
        value = int(value) if b.program.dtype == "int32" else value
        out = tuple(s + lo + hi for s, (lo, hi) in zip(shape, width, strict=True))
        b.add("pad", [x], out, width=width, value=value)
    else:
        axis = int(rng.integers(0, n))
        extra = tuple(b.dim() if a == axis else s for a, s in enumerate(shape))
        y = b.new_input(extra)
        x = x + 1 if x >= y else x
        out = tuple(s + extra[axis] if a == axis else s for a, s in enumerate(shape))
        b.add("concat", [x, y], out, axis=axis)


def _matmul_step(b: _Builder, x: int, shape: Shape) -> None:
    rng = b.rng
    if len(shape) < 1:
        return
    k, n = shape[-1], b.dim()
    w = b.new_input((k, n))
    x = x + 1 if x >= w else x
    out = (*shape[:-1], n)
    if len(shape) == 2 and rng.random() < 0.4:
        b.add("einsum", [x, w], out, spec="ij,jk->ik")
    else:
        b.add("matmul", [x, w], out)


def _conv_step(b: _Builder) -> None:
    rng = b.rng
    n, c, h, w = b.dim(), int(rng.integers(1, 4)), int(rng.integers(2, 7)), int(rng.integers(2, 7))
    x = b.new_input((n, c, h, w))
    choice = rng.choice(["conv2d", "max_pool2d", "avg_pool2d"])
    padding = int(rng.integers(0, 2))
    if choice == "conv2d":
        o, kh = int(rng.integers(1, 4)), int(rng.integers(1, min(h, w) + 1))
        wt = b.new_input((o, c, kh, kh))
        x = x + 1 if x >= wt else x
        stride = int(rng.integers(1, 3))
        oh = (h + 2 * padding - kh) // stride + 1
        ow = (w + 2 * padding - kh) // stride + 1
        b.add("conv2d", [x, wt], (n, o, oh, ow), stride=stride, padding=padding)
    else:
        kernel = int(rng.integers(1, min(h, w) + 1))
        padding = min(padding, kernel // 2)
        if b.program.special and choice == "max_pool2d":
            # Padding is the lowest finite value, so a window of padding and -inf gives
            # -3.4e38 where PyTorch gives -inf (a known difference, _conv._lowest).
            padding = 0
        oh, ow = (h + 2 * padding - kernel) // kernel + 1, (w + 2 * padding - kernel) // kernel + 1
        b.add(str(choice), [x], (n, c, oh, ow), kernel=kernel, padding=padding)


SPECIAL_VALUES = (np.inf, -np.inf, np.nan)
_HALF_GRID = np.unique(np.linspace(-3.0, 3.0, 6000).astype(np.float16))


def make_inputs(program: Program, rng: np.random.Generator) -> list[np.ndarray[Any, Any]]:
    """Random inputs; transposed ones are non-contiguous views of the same values.

    int32 programs get small integers (products stay far from int32's range); special
    programs get about one entry in five replaced by +inf, -inf or NaN.
    """
    arrays = []
    for shape, transposed in zip(program.inputs, program.transposed, strict=True):
        if program.dtype == "int32":
            values = rng.integers(-3, 4, size=shape).astype(np.int32)
        elif program.dtype == "float16":
            # Distinct values: rounded normals tie often in 11 bits, and tied maxima share
            # the gradient here (0.5 each) where PyTorch picks one.
            size = int(np.prod(shape))
            values = rng.choice(_HALF_GRID, size=size, replace=size > _HALF_GRID.size)
            values = values.reshape(shape)
        else:
            values = rng.standard_normal(shape).astype(program.dtype)
        if program.special and values.size:
            mask = rng.random(shape) < 0.2
            values[mask] = rng.choice(SPECIAL_VALUES, size=int(mask.sum()))
        arrays.append(np.ascontiguousarray(values.T).T if transposed else values)
    return arrays
