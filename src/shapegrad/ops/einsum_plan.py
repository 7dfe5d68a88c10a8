"""Two-operand primitive einsums as one batched matmul, planned once per (spec, shapes).

``np.einsum`` re-parses its spec and re-validates its contraction path on every call
(tens of microseconds), which dominated small eager steps. A primitive einsum (explicit
``->``, no repeated letter in an operand, see ``ops/protocol.py``) is always

    transpose + reshape each operand to [batch, free, contracted] / [batch, contracted, free]
    -> np.matmul -> reshape + transpose to the output order

with letters that only one operand has and the output lacks summed first. The plan
holds the permutations and shapes, so a call is a handful of NumPy calls on views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
Plan = Callable[[Array, Array], Array]


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def einsum_macs(spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> int:
    """Multiply-adds of the contraction: the product of every letter's size."""
    lhs = spec.split("->")[0]
    ta, tb = lhs.split(",")
    size = dict(zip(ta, shape_a, strict=True)) | dict(zip(tb, shape_b, strict=True))
    return _size(tuple(size.values()))


def plan_einsum(spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Plan:
    """A function computing ``np.einsum(spec, a, b)`` for operands of these shapes."""
    lhs, out = spec.split("->")
    ta, tb = lhs.split(",")
    size = dict(zip(ta, shape_a, strict=True)) | dict(zip(tb, shape_b, strict=True))
    # letters summed inside one operand (absent from the other and from the output)
    sum_a = tuple(i for i, c in enumerate(ta) if c not in tb and c not in out)
    sum_b = tuple(i for i, c in enumerate(tb) if c not in ta and c not in out)
    ka = "".join(c for c in ta if c in tb or c in out)
    kb = "".join(c for c in tb if c in ta or c in out)
    batch = [c for c in out if c in ka and c in kb]
    contracted = [c for c in ka if c in kb and c not in out]
    free_a = [c for c in out if c in ka and c not in kb]
    free_b = [c for c in out if c in kb and c not in ka]
    perm_a = tuple(ka.index(c) for c in batch + free_a + contracted)
    perm_b = tuple(kb.index(c) for c in batch + contracted + free_b)
    nb = _size(tuple(size[c] for c in batch))
    nfa = _size(tuple(size[c] for c in free_a))
    nfb = _size(tuple(size[c] for c in free_b))
    nk = _size(tuple(size[c] for c in contracted))
    mid = batch + free_a + free_b
    result_shape = tuple(size[c] for c in mid)
    perm_out = tuple(mid.index(c) for c in out)
    identity_out = perm_out == tuple(range(len(out)))

    def run(a: Array, b: Array) -> Array:
        if sum_a:
            a = a.sum(axis=sum_a)
        if sum_b:
            b = b.sum(axis=sum_b)
        if nb == 1:  # a plain 2-D product (NumPy's stacked matmul loop is not needed)
            a2 = a.transpose(perm_a).reshape(nfa, nk)
            c: Array = np.matmul(a2, b.transpose(perm_b).reshape(nk, nfb)).reshape(result_shape)
        else:
            a3 = a.transpose(perm_a).reshape(nb, nfa, nk)
            c = np.matmul(a3, b.transpose(perm_b).reshape(nb, nk, nfb)).reshape(result_shape)
        return c if identity_out else c.transpose(perm_out)

    return run
