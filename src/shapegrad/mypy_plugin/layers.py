"""Shape rules of the layer-level ops: conv/pool, losses, normalisation and indexing."""

from __future__ import annotations

from . import sizes
from .algebra import Mismatch, Operand, differ, resolve_axis
from .literals import DYNAMIC, UNKNOWN
from .spec import Expr, Item, TShape, Var, show, show_item

Pair = tuple[int, int] | None  # None: not a literal


def _window(size: Item, kernel: Item, stride: int | None, pad: int | None) -> Item:
    """Output size of a sliding window: ``(size + 2 pad - kernel) // stride + 1``."""
    if isinstance(size, int) and isinstance(kernel, int) and stride and pad is not None:
        return (size + 2 * pad - kernel) // stride + 1
    if stride == 1 and pad is not None and kernel is not None:
        return sizes.add(sizes.sub(size, kernel), 2 * pad + 1)  # exact: no rounding at stride 1
    return None


def _nchw(op: str, x: Operand) -> None:
    if x.shape.fixed and len(x.shape.dims) != 4:
        raise Mismatch(f"{op}: input must be [N, C, H, W], got {x.describe()}")


def conv2d(
    x: Operand, w: Operand, bias: Operand | None, stride: Pair, padding: Pair
) -> TShape | None:
    """``[N, C, H, W]`` conv ``[O, C, kh, kw]`` -> ``[N, O, Ho, Wo]``."""
    _nchw("conv2d", x)
    if w.shape.fixed and len(w.shape.dims) != 4:
        raise Mismatch(f"conv2d: weight must be [O, C, kh, kw], got {w.describe()}")
    if not (x.shape.fixed and w.shape.fixed):
        return None
    n, c, h, wd = x.shape.dims
    o, c_w, kh, kw = w.shape.dims
    if differ(c, c_w):
        raise Mismatch(
            f"conv2d: input channels disagree: {x.label or 'x'} is {show(x.shape.dims)}, "
            f"{w.label or 'w'} is {show(w.shape.dims)} ({show_item(c)} != {show_item(c_w)})"
        )
    if (
        bias is not None
        and bias.shape.fixed
        and (len(bias.shape.dims) != 1 or differ(bias.shape.dims[0], o))
    ):
        raise Mismatch(
            f"conv2d: bias must be [{show_item(o)}] for weight {w.describe()}, got {bias.describe()}"
        )
    sh, sw = stride or (None, None)
    ph, pw = padding or (None, None)
    return TShape((n, o, _window(h, kh, sh, ph), _window(wd, kw, sw, pw)), x.shape.dtype)


def pool2d(op: str, x: Operand, kernel: Pair, stride: Pair, padding: Pair) -> TShape | None:
    """``max_pool2d``/``avg_pool2d``: ``[N, C, H, W]`` -> ``[N, C, Ho, Wo]`` (stride defaults to kernel)."""
    _nchw(op, x)
    if not x.shape.fixed:
        return None
    n, c, h, w = x.shape.dims
    kh, kw = kernel or (None, None)
    sh, sw = stride or (None, None)
    ph, pw = padding or (None, None)
    return TShape((n, c, _window(h, kh, sh, ph), _window(w, kw, sw, pw)), x.shape.dtype)


def cross_entropy(logits: Operand, labels: Operand) -> TShape:
    """Mean cross-entropy of ``logits [b, c]`` with ``labels [b]`` (ints) or ``[b, c]``: a scalar."""
    dims = logits.shape.dims
    if logits.shape.fixed and len(dims) != 2:
        raise Mismatch(f"cross_entropy: logits must be [b, c], got {logits.describe()}")
    if logits.shape.fixed and labels.shape.fixed:
        want = dims[:1] if len(labels.shape.dims) == 1 else dims
        got = labels.shape.dims
        if len(got) not in (1, 2) or any(differ(a, b) for a, b in zip(want, got, strict=False)):
            raise Mismatch(
                f"cross_entropy: labels {labels.describe()} do not match logits "
                f"{logits.describe()} (expected {show(want)} class indices or {show(dims)} targets)"
            )
    return TShape((), logits.shape.dtype)


def same_shape(op: str, a: Operand, b: Operand) -> TShape:
    """``mse``/``hinge``: shapes must be equal; the result is a scalar."""
    if a.shape.fixed and b.shape.fixed:
        da, db = a.shape.dims, b.shape.dims
        if len(da) != len(db) or any(differ(x, y) for x, y in zip(da, db, strict=True)):
            raise Mismatch(f"{op}: {a.describe()} and {b.describe()} differ")
    return TShape((), a.shape.dtype)


def layer_norm(x: Operand, params: list[Operand], axes: list[int] | None) -> TShape:
    """Shape-preserving; ``weight``/``bias`` must have the shape of the normalised axes."""
    if axes is not None and x.shape.fixed:
        positions = [resolve_axis("layer_norm", x, a) for a in axes]
        want = [x.shape.dims[p] for p in sorted(p for p in positions if p is not None)]
        for p in params:
            got = p.shape.dims
            if p.shape.fixed and (
                len(got) != len(want) or any(differ(a, b) for a, b in zip(got, want, strict=True))
            ):
                raise Mismatch(
                    f"layer_norm: {p.describe()} must be {show(want)} for {x.describe()}"
                )
    return x.shape


def _slice_length(size: Item, item: slice) -> Item:
    """Length of ``size[item]``; symbolic bounds are taken as in range (``wpe[:t]`` is ``t``)."""
    lo, hi, step = item.start, item.stop, item.step
    if any(b is UNKNOWN for b in (lo, hi, step)):
        return None
    if isinstance(size, int) and all(b is None or isinstance(b, int) for b in (lo, hi, step)):
        start, stop, stride = slice(lo, hi, step).indices(size)
        return max(0, -(-(max(stop, start) - start) // stride))
    if step not in (None, 1) or any(_from_the_end(b) for b in (lo, hi)):
        return None
    if isinstance(lo, int) and lo < 0:
        lo = sizes.add(size, lo)
    if isinstance(hi, int) and hi < 0:
        hi = sizes.add(size, hi)
    length = sizes.sub(size if hi is None else hi, 0 if lo is None else lo)
    return None if isinstance(length, int) and length < 0 else length


def _from_the_end(bound: object) -> bool:
    """A symbolic bound written negative (``x[-n:]``, ``x[: -(k + 1)]``): it counts from
    the end only while ``n > 0`` (``x[-0:]`` is all of ``x``), so its length is unknown."""
    return isinstance(bound, Expr) and all(
        coef < 0 for mono, coef in bound.terms if mono
    )


def index(x: Operand, items: list[object]) -> TShape | None:
    """Basic indexing with ints, slices (positive steps, sizes as bounds), None and ``...``."""
    if not x.shape.fixed:
        return None
    dims = list(x.shape.dims)
    real = [i for i in items if i is not None and i is not Ellipsis]
    if len(real) > len(dims):
        raise Mismatch(f"index: too many indices ({len(real)}) for {x.describe()}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + [slice(None)] * (len(dims) - len(real)) + items[at + 1 :]
    else:
        items = items + [slice(None)] * (len(dims) - len(real))
    out: list[Item] = []
    axis = 0
    for item in items:
        if item is None:
            out.append(1)
            continue
        size = dims[axis]
        if isinstance(item, int):
            if isinstance(size, int) and not -size <= item < size:
                raise Mismatch(
                    f"index: index {item} is out of bounds for axis {axis} of {x.describe()}"
                )
        elif isinstance(item, slice):
            out.append(size if item == slice(None) else _slice_length(size, item))
        elif item is not DYNAMIC:
            return None
        axis += 1
    return TShape(tuple(out), x.shape.dtype)


def prepend(prefix: TShape, rest: tuple[Item, ...], dtype: str | None) -> TShape | None:
    """``prefix.dims + rest`` (gather / embedding / one_hot results)."""
    if sum(isinstance(d, Var) for d in (*prefix.dims, *rest)) > 1:
        return None
    return TShape(prefix.dims + rest, dtype)


def linear(x: Operand, w: Operand, b: Operand | None, op: str = "linear") -> TShape | None:
    """``sg.nn.linear``: ``x [..., in]``, ``w [out, in]``, ``b [out]`` -> ``[..., out]``."""
    if w.shape.fixed and len(w.shape.dims) != 2:
        raise Mismatch(f"{op}: weight must be [out, in], got {w.describe()}")
    if not x.shape.dims or not w.shape.fixed:
        return None
    last = x.shape.dims[-1]
    out, fan_in = w.shape.dims
    if not isinstance(last, Var) and differ(last, fan_in):
        raise Mismatch(
            f"{op}: input {x.describe()} needs a weight [out, {show_item(last)}], got "
            f"{w.describe()} ({show_item(last)} != {show_item(fan_in)})"
        )
    if b is not None and b.shape.fixed and (len(b.shape.dims) != 1 or differ(b.shape.dims[0], out)):
        raise Mismatch(f"{op}: bias {b.describe()} should be [{show_item(out)}] for {w.describe()}")
    if isinstance(last, Var):
        return None
    dtype = x.shape.dtype if x.shape.dtype == w.shape.dtype else None
    return TShape((*x.shape.dims[:-1], out), dtype)
