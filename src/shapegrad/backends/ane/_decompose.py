"""Primitives that become several MIL ops: EINSUM (-> matmul) and SCATTER_ADD (-> one-hot matmul).

EINSUM with two operands is arranged as one (batched) ``matmul``: the letters
split into batch (both operands and the output), contracted (both operands,
not the output), left-free and right-free. Each operand is transposed to
``[batch, free, contracted]`` or ``[batch, contracted, free]`` - whichever
needs no transpose, the other layout being expressed with ``transpose_x`` /
``transpose_y`` - and reshaped only when a group has other than one axis.
A plain ``ij,jk->ik`` (or ``ij,kj->ik``...) is therefore a single matmul.

SCATTER_ADD is a matmul with a one-hot matrix built from the indices, which
adds duplicate indices exactly and runs on the engine (MIL's ``scatter``
with mode ``add`` leaves duplicate handling to the runtime).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from shapegrad.dtypes import bool_
from shapegrad.ir import Node
from shapegrad.ops.einsum_roles import EinsumRoles
from shapegrad.ops.protocol import parse_einsum_spec

from ._errors import AneLoweringError
from ._mil import Var

if TYPE_CHECKING:
    from .lowering import _Lowerer


def _permute_to(lo: _Lowerer, x: Var, have: list[str], want: list[str]) -> tuple[Var, bool]:
    """Transpose ``x`` (axes named ``have``) to the order ``want``; returns (value, changed)."""
    if have == want:
        return x, False
    perm = np.array([have.index(letter) for letter in want], np.int32)
    return lo.mb.transpose(x=x, perm=perm), True


def _reshape(lo: _Lowerer, x: Var, shape: list[int]) -> tuple[Var, bool]:
    if list(x.shape) == shape:
        return x, False
    return lo.mb.reshape(x=x, shape=np.array(shape, np.int32)), True


def _sum_letters(lo: _Lowerer, x: Var, term: str, drop: set[str]) -> tuple[Var, str, bool]:
    """Sum away the axes of ``x`` whose letters are in ``drop`` (letters nobody else uses)."""
    axes = [i for i, letter in enumerate(term) if letter in drop]
    if not axes:
        return x, term, False
    kept = "".join(letter for letter in term if letter not in drop)
    return lo.mb.reduce_sum(x=x, axes=np.array(axes, np.int32), keep_dims=False), kept, True


def _arrange(
    lo: _Lowerer, x: Var, term: str, batch: list[str], free: list[str], inner: list[str], left: bool
) -> tuple[Var, bool, bool]:
    """``x`` as ``[batch.., F, K]`` (or ``[batch.., K, F]`` flagged transposed for matmul).

    ``left`` selects the matmul side: the left operand wants ``[F, K]`` untransposed,
    the right one ``[K, F]``. Returns (value, transpose flag, whether ops were added).
    """
    letters = list(term)
    plain = batch + (free + inner if left else inner + free)
    flipped = batch + (inner + free if left else free + inner)
    flag = letters == flipped and letters != plain
    layout = flipped if flag else plain
    x, moved = _permute_to(lo, x, letters, layout)
    sizes = {c: int(d) for c, d in zip(layout, x.shape, strict=True)}
    groups = (inner, free) if flag == left else (free, inner)
    shape = [sizes[b] for b in batch] + [math.prod(sizes[c] for c in g) for g in groups]
    x, reshaped = _reshape(lo, x, shape)
    return x, flag, moved or reshaped


def lower_einsum(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """EINSUM as reduce_sum / transpose (one operand) or one batched matmul (two operands)."""
    terms, out = parse_einsum_spec(node.attr["spec"], len(args))
    if len(args) == 1:
        return _einsum_unary(lo, node, args[0], terms[0], out)
    (a, ta), (b, tb) = zip(args, terms, strict=True)
    roles = EinsumRoles.of(node.attr["spec"])
    if _prefers_swap(roles):
        (a, ta), (b, tb), roles = (b, tb), (a, ta), roles.swapped()
    a, ta, ra = _sum_letters(lo, a, ta, set(roles.summed_a))
    b, tb, rb = _sum_letters(lo, b, tb, set(roles.summed_b))
    batch, inner = list(roles.batch), list(roles.contracted)
    left_free = [c for c in ta if c in roles.free_a]  # in the operand's order
    right_free = [c for c in tb if c in roles.free_b]
    sizes = {c: int(d) for t, v in ((ta, a), (tb, b)) for c, d in zip(t, v.shape, strict=True)}
    a, flag_a, ca = _arrange(lo, a, ta, batch, left_free, inner, left=True)
    b, flag_b, cb = _arrange(lo, b, tb, batch, right_free, inner, left=False)
    product = lo.mb.matmul(x=a, y=b, transpose_x=flag_a, transpose_y=flag_b)
    result_letters = batch + left_free + right_free
    product, cr = _reshape(lo, product, [sizes[c] for c in result_letters])
    product, cp = _permute_to(lo, product, result_letters, list(out))
    lo.mark(node.prim, "decomposed" if ra or rb or ca or cb or cr or cp else "native")
    return product


def _prefers_swap(roles: EinsumRoles) -> bool:
    """True when ``b @ a`` lands in the output's axis order and ``a @ b`` does not."""
    a_free = [c for c in roles.a if c in roles.free_a]
    b_free = [c for c in roles.b if c in roles.free_b]
    as_is = list(roles.batch) + a_free + b_free
    swapped = list(roles.batch) + b_free + a_free
    return list(roles.out) != as_is and list(roles.out) == swapped


def _einsum_unary(lo: _Lowerer, node: Node, x: Var, term: str, out: str) -> Var:
    x, kept, _ = _sum_letters(lo, x, term, {c for c in term if c not in out})
    x, _ = _permute_to(lo, x, list(kept), list(out))
    lo.mark(node.prim, "decomposed")
    return x


def lower_scatter_add(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """SCATTER_ADD as ``onehot(idx)^T @ updates`` with updates viewed as ``[P, C, Q]``."""
    updates, idx = args
    if node.aval.dtype == bool_:
        raise AneLoweringError("scatter_add", "bool updates (sum of bools has no MIL matmul)")
    mb = lo.mb
    axis, size = node.attr["axis"], node.attr["size"]
    upd_shape = [int(d) for d in updates.shape]
    n_idx = len(node.inputs[1].shape)
    pre = math.prod(upd_shape[:axis])
    count = math.prod(upd_shape[axis : axis + n_idx])
    post = math.prod(upd_shape[axis + n_idx :])
    flat, _ = _reshape(lo, idx, [count, 1])
    wrapped = mb.select(
        cond=mb.less(x=flat, y=np.int32(0)), a=mb.add(x=flat, y=np.int32(size)), b=flat
    )
    columns = mb.const(val=np.arange(size, dtype=np.int32).reshape(1, size))
    onehot = mb.cast(x=mb.equal(x=wrapped, y=columns), dtype=lo.mil_dtype(node.aval.dtype))
    grouped, _ = _reshape(lo, updates, [pre, count, post])
    summed = mb.matmul(x=onehot, y=grouped, transpose_x=True, transpose_y=False)
    lo.mark(node.prim, "decomposed")
    result, _ = _reshape(lo, summed, list(node.shape))
    return result
