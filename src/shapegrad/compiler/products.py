"""Graph rewrites that turn batched products over shared operands into single large products.

``x @ W`` with ``x: [b, t, d]`` traces as ``einsum("aij,ajk->aik", x, broadcast(W))`` and
its weight gradient as ``reduce_sum(einsum("aik,aij->ajk", dy, x), axes=(0,))``. Lowered
as written, the first is ``b`` small library products that each re-pack the same ``W``,
and the second writes ``b`` partial ``[d, f]`` gradients (megabytes) only to sum them.
Two rules remove both shapes of waste at the root, for every model:

* :func:`_drop_broadcast_letters`: an operand that is a ``broadcast`` along letters the
  other operand also carries loses those letters (``aij,jk->aik``): the batch becomes
  part of the product's rows, one product of ``b*t`` rows.
* :func:`_sum_into_product`: ``reduce_sum`` over output letters that both operands carry
  moves the sum into the product (``aik,aij->jk``): the batch becomes part of the
  contracted dimension, one product and no partial results. Only when the product has
  no other consumer, so nothing is computed twice.
* :func:`_permute_into_product`: a ``permute`` of a product (a weight gradient in the
  weight's layout) is the product with its output letters reordered: the library writes
  the final layout, and the optimizer's update reads it contiguously instead of with a
  stride across its inner loop. Also only for a product with no other consumer.

Both are exact rewrites of the math; only the floating-point summation order changes
(as it does between BLAS blockings).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from shapegrad.compiler.rewrite import Builder, rewrite_graph
from shapegrad.ir import Graph, Node
from shapegrad.ops.protocol import Prim, parse_einsum_spec


def _drop_broadcast_letters(node: Node, b: Builder) -> Node | None:
    """``einsum(.., broadcast(x), ..)`` -> ``einsum`` of ``x`` without the broadcast letters."""
    if node.prim is not Prim.EINSUM or len(node.inputs) != 2:
        return None
    terms, out = parse_einsum_spec(node.attr["spec"], 2)
    for side in (0, 1):
        operand, term, other = node.inputs[side], terms[side], terms[1 - side]
        if operand.prim is not Prim.BROADCAST:
            continue
        x = operand.inputs[0]
        dims: tuple[int, ...] = operand.attr["dims"]
        # Axes of x that keep their size keep their letter; size-1 axes that the broadcast
        # expands are reshaped away (a pure relabelling of the same elements).
        kept = [i for i, d in enumerate(dims) if x.shape[i] == operand.shape[d]]
        kept_letters = "".join(term[dims[i]] for i in kept)
        dropped = [c for c in term if c not in kept_letters]
        if not dropped or any(c not in other for c in dropped):
            continue  # a letter only this operand carries would vanish from the product
        core = x
        if len(kept) != len(x.shape):
            core = b.make(Prim.RESHAPE, [x], shape=tuple(x.shape[i] for i in kept))
        new_terms = [kept_letters, other] if side == 0 else [other, kept_letters]
        inputs = [core, node.inputs[1]] if side == 0 else [node.inputs[0], core]
        return b.make(Prim.EINSUM, inputs, spec=f"{new_terms[0]},{new_terms[1]}->{out}")
    return None


def _sum_into_product(node: Node, b: Builder, uses: Counter[int]) -> Node | None:
    """``reduce_sum(einsum(a, b), axes)`` -> one einsum that also contracts those letters."""
    if node.prim is not Prim.REDUCE_SUM:
        return None
    product = node.inputs[0]
    if product.prim is not Prim.EINSUM or len(product.inputs) != 2 or uses[product.id] != 1:
        return None  # a product read elsewhere too (or new this round: counted next round)
    (ta, tb), out = parse_einsum_spec(product.attr["spec"], 2)
    axes: tuple[int, ...] = node.attr["axes"]
    summed = {out[a] for a in axes}
    if any(c not in ta or c not in tb for c in summed):
        return None  # a letter summed inside one operand is no longer a plain product
    kept = "".join(c for c in out if c not in summed)
    return b.make(Prim.EINSUM, list(product.inputs), spec=f"{ta},{tb}->{kept}")


def _permute_into_product(
    node: Node, b: Builder, uses: Counter[int], strided: bool = False
) -> Node | None:
    """``permute(einsum(a, b))`` -> one einsum writing its output in the permuted order
    (``strided``: batch letters may move between the rows and the columns too)."""
    if node.prim is not Prim.PERMUTE:
        return None
    product = node.inputs[0]
    if product.prim is not Prim.EINSUM or uses[product.id] != 1:
        return None
    terms, out = product.attr["spec"].split("->")
    ta, tb = terms.split(",") if "," in terms else (terms, terms)
    perm: tuple[int, ...] = node.attr["perm"]
    order = "".join(out[p] for p in perm)
    batch = "".join(c for c in out if c in ta and c in tb)
    if strided:  # a two-level batch: what is left must still read rows then columns
        kinds = "".join("m" if c in ta else "n" for c in order if c not in batch)
        if kinds not in ("".join(sorted(kinds)), "".join(sorted(kinds, reverse=True))):
            return None
        if order.startswith(batch):
            return None  # merge_product_batches' own case
    elif not order.startswith(batch):
        return None  # batch letters must stay a leading prefix for a batched library product
    return b.make(Prim.EINSUM, list(product.inputs), spec=f"{terms}->{order}")


def merge_product_batches(graph: Graph) -> Graph:
    """Products over broadcast operands and sums of products become single products.

    Example: ``einsum("aij,ajk->aik", x, broadcast(w))`` becomes
    ``einsum("aij,jk->aik", x, w)``, ``reduce_sum(einsum("aik,aij->ajk", g, x), (0,))``
    becomes ``einsum("aik,aij->jk", g, x)``, and ``permute(einsum("ij,jk->ik"), (1, 0))``
    becomes ``einsum("ij,jk->ki")``.
    """
    uses: Counter[int] = Counter()
    for n in graph.nodes():
        uses.update(i.id for i in n.inputs)
    uses.update(o.id for o in graph.outputs)

    def rule(node: Node, b: Builder) -> Node | None:
        found = _drop_broadcast_letters(node, b)
        if found is None:
            found = _sum_into_product(node, b, uses)
        return found if found is not None else _permute_into_product(node, b, uses)

    return rewrite_graph(graph, rule)


def permute_product_outputs(graph: Graph, max_rounds: int = 16) -> Graph:
    """``permute(einsum)`` -> an einsum whose output letters put batch letters between its
    rows and columns (attention's heads merged back: ``bhqk,bhkd->bqhd``), for targets
    whose library products take two-level batches (``Target.strided_batches``): the
    product writes the merged layout and the copy that merged it is gone. The
    ``permute_product_outputs`` loop stage (``pipeline.py``) runs it; CUDA does not.
    Repeated until nothing fires: a rebuilt product's uses are counted in the next round.
    """
    for _ in range(max_rounds):
        fired: list[Node] = []
        graph = rewrite_graph(graph, _permute_rule(_uses(graph), fired))
        if not fired:
            break
    return graph


def _uses(graph: Graph) -> Counter[int]:
    uses: Counter[int] = Counter()
    for n in graph.nodes():
        uses.update(i.id for i in n.inputs)
    uses.update(o.id for o in graph.outputs)
    return uses


def _permute_rule(uses: Counter[int], fired: list[Node]) -> Callable[[Node, Builder], Node | None]:
    """The rule of :func:`permute_product_outputs` (appends what it builds to ``fired``)."""

    def rule(node: Node, b: Builder) -> Node | None:
        if node.prim is not Prim.PERMUTE or len(node.inputs[0].inputs) != 2:
            return None
        found = _permute_into_product(node, b, uses, strided=True)
        if found is not None:
            fired.append(found)
        return found

    return rule
