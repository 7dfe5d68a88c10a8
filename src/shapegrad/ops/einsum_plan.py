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

from shapegrad.ops.einsum_roles import EinsumRoles

Array = npt.NDArray[Any]
Plan = Callable[[Array, Array], Array]


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def einsum_macs(spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> int:
    """Multiply-adds of the contraction: the product of every letter's size."""
    size = EinsumRoles.of(spec).sizes(shape_a, shape_b)
    return _size(tuple(size.values()))


def plan_einsum(spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Plan:
    """A function computing ``np.einsum(spec, a, b)`` for operands of these shapes."""
    roles = EinsumRoles.of(spec)
    ta, tb, out = roles.a, roles.b, roles.out
    size = roles.sizes(shape_a, shape_b)
    # letters summed inside one operand (absent from the other and from the output)
    sum_a = tuple(ta.index(c) for c in roles.summed_a)
    sum_b = tuple(tb.index(c) for c in roles.summed_b)
    ka = "".join(c for c in ta if c not in roles.summed_a)
    kb = "".join(c for c in tb if c not in roles.summed_b)
    batch, contracted = list(roles.batch), list(roles.contracted)
    free_a, free_b = list(roles.free_a), list(roles.free_b)
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
