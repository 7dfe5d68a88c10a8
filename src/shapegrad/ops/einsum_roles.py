"""The role of each letter of a two-operand primitive einsum, derived once.

``"ta,tb->out"`` (explicit ``->``, no letter repeated inside one operand; see
``ops/protocol.py``) is a batched matrix product once each letter has its role:

* ``batch``: in both operands and the output (kept, multiplied elementwise);
* ``contracted``: in both operands, not the output (summed by the product);
* ``free_a`` / ``free_b``: in one operand and the output (the product's rows / columns);
* ``summed_a`` / ``summed_b``: in one operand only (summed inside it before the product).

Every consumer reads these instead of re-deriving them: the eager plan
(``ops/einsum_plan.py``), the library-product matcher (``compiler/contract.py``) and the
Core ML lowering (``backends/ane/_decompose.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class EinsumRoles:
    """Letter roles of ``a,b->out``; groups keep the order named in each field's comment."""

    a: str
    b: str
    out: str
    batch: str  # output order
    contracted: str  # ``a``'s order
    free_a: str  # output order
    free_b: str  # output order
    summed_a: str  # ``a``'s order
    summed_b: str  # ``b``'s order

    @staticmethod
    def of(spec: str) -> EinsumRoles:
        """The roles of a two-operand primitive spec such as ``"bij,bjk->bik"``."""
        return _roles(spec)

    @property
    def plain_product(self) -> bool:
        """No letter is summed inside one operand: the einsum is one (batched) matmul."""
        return not self.summed_a and not self.summed_b

    def swapped(self) -> EinsumRoles:
        """The roles of ``b,a->out`` (the same product with the operands exchanged)."""
        return _roles(f"{self.b},{self.a}->{self.out}")

    def sizes(self, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> dict[str, int]:
        """Each letter's extent, from the operands' shapes."""
        return dict(zip(self.a, shape_a, strict=True)) | dict(zip(self.b, shape_b, strict=True))


@functools.lru_cache(maxsize=1024)
def _roles(spec: str) -> EinsumRoles:
    lhs, out = spec.split("->")
    a, b = lhs.split(",")
    return EinsumRoles(
        a=a,
        b=b,
        out=out,
        batch="".join(c for c in out if c in a and c in b),
        contracted="".join(c for c in a if c in b and c not in out),
        free_a="".join(c for c in out if c in a and c not in b),
        free_b="".join(c for c in out if c in b and c not in a),
        summed_a="".join(c for c in a if c not in b and c not in out),
        summed_b="".join(c for c in b if c not in a and c not in out),
    )


__all__ = ["EinsumRoles"]
