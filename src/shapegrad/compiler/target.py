"""What a backend wants from lowering: the one place where schedule policy lives.

Lowering, fusion and the loop stages read every decision that depends on the
machine from a :class:`Target`; none of them hold a tuning constant of their own.
A backend passes its target to ``compiler.pipeline.lower_program``; the C backend's
values below are measured on the CPUs this project runs on (see each field).

A GPU target would, for example, allow float16 products (tensor cores), turn the
row form and batch fusion off (they trade parallelism for cache locality) and run
reductions as trees and scatters as atomics.

Example:
    >>> from shapegrad.compiler.target import C_TARGET
    >>> no_batch = C_TARGET.replace(batch_fusion=False, row_form=False)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Lowering policy of one backend.

    Attributes:
        name: the backend's name (shows in dumps).
        contract_min_macs: smallest contraction (multiply-adds) sent to a library product
            (``Contract``); smaller ones become generated loops with fused epilogues.
        contract_dtypes: element types a library product accepts (``"float16"`` only where
            the target has half-precision products with float accumulation).
        runtime_alpha: a library product's scale may be read from a buffer at run time (an
            SGD update ``w - lr * (a @ b)`` with the trainer's lr becomes one product).
        row_form: allow accumulating a whole output row (innermost loop over outputs)
            when the loads are contiguous along the output, not along the reduced axis.
        tie_row: on a tie in contiguity, prefer the row form for wide rows.
        local_row_max: largest row (elements) accumulated in a per-iteration scratch
            array when an epilogue follows.
        batch_fusion: produce a large batched product's operand one batch slice at a
            time (``BatchFused``) instead of materializing it.
        batch_fusion_slots: scratch slices reserved for concurrent batch indices.
        batch_fusion_min_operand: operands smaller than this (elements) stay materialized.
        fuse_epilogues: compute elementwise consumers inside the kernel of the reduction
            or contraction they consume.
        shared_cost_limit: a value read by several consumers is recomputed by each only
            while it costs at most this many ops per element.
        max_inline_cost: beyond this inline cost a value is written out regardless.
        alignment: byte alignment of every temp in the arena.
        reduction: how ``Reduce`` statements may run: ``"ordered"`` (one thread, in order)
            or ``"tree"`` (split and combined as a tree).
        scatter: how commutative accumulating stores may run: ``"ordered"`` or ``"atomic"``.
        skip_stages: names of optional loop stages this target does not run.
        exp_flush_denormal: ``exp`` gives 0 where its result would be denormal (argument
            below ln of the smallest normal: -87.33 in float32) and never hands such an
            argument to the math library: glibc's vector exp falls back to scalar code for
            a whole vector when one lane is out of range (masked attention scores made the
            softmax exp 8x slower). Exact elsewhere; see ``compiler.expand``.
        accumulators: ``(element type, accumulator type)`` pairs: sums and products of the
            first type accumulate in the second and round once at the end (float16 in
            float32, like NumPy and cuBLAS: a float16 accumulator stops at 2048 when adding
            ones). See :meth:`accumulator`.
    """

    name: str
    contract_min_macs: int = 4096
    contract_dtypes: frozenset[str] = frozenset({"float32", "float64"})
    runtime_alpha: bool = True
    row_form: bool = True
    tie_row: bool = False
    local_row_max: int = 4096
    batch_fusion: bool = True
    batch_fusion_slots: int = 8
    batch_fusion_min_operand: int = 1 << 18
    fuse_epilogues: bool = True
    shared_cost_limit: int = 2
    max_inline_cost: int = 40
    alignment: int = 64
    reduction: str = "ordered"
    scatter: str = "ordered"
    skip_stages: frozenset[str] = frozenset()
    exp_flush_denormal: bool = False
    accumulators: tuple[tuple[str, str], ...] = (("float16", "float32"),)

    def __post_init__(self) -> None:
        if self.reduction not in ("ordered", "tree"):
            raise ValueError(
                f"Target.reduction must be 'ordered' or 'tree', got {self.reduction!r}"
            )
        if self.scatter not in ("ordered", "atomic"):
            raise ValueError(f"Target.scatter must be 'ordered' or 'atomic', got {self.scatter!r}")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"Target.alignment must be a power of two, got {self.alignment}")

    def replace(self, **changes: object) -> Target:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def accumulator(self, dtype: str) -> str:
        """The type sums of ``dtype`` elements accumulate in (``dtype`` itself by default)."""
        return dict(self.accumulators).get(dtype, dtype)

    def runs(self, stage: str) -> bool:
        """Whether the optional loop stage ``stage`` runs for this target."""
        if stage == "fuse_batch_producers" and not self.batch_fusion:
            return False
        return stage not in self.skip_stages


# Measured on the project's 2-core x86-64 machines (single call incl. ~1 µs of Python):
# a lone matmul is faster through BLAS at every size tried (10x16x16: 1.3 vs 2.2 µs;
# 128^3: 47 vs 1876 µs), but inside the moons step the tiny products (<= 2560 MACs at
# batch 10) are better as loops sharing kernels with their fused epilogues (0.85-0.9
# µs/step vs 1.3-1.5 µs with BLAS everywhere); at batch 256 (4096-65536 MACs) BLAS wins
# (11.4 µs vs 12.5 µs with a 65536 threshold). Batch fusion keeps a CNN's 29 MB im2col
# patches out of memory (one 451 KB image slice per thread instead).
C_TARGET = Target(name="c", exp_flush_denormal=True)


# A GPU wants parallelism over cache locality: no row form (it serialises the output row
# per thread), no batch fusion (per-thread scratch slices), float16 products on tensor
# cores, reductions as block trees and scatters as atomics. Index checks of inputs still
# run first (one small kernel), so a failing step changes nothing.
CUDA_TARGET = Target(
    name="cuda",
    contract_min_macs=1 << 15,
    contract_dtypes=frozenset({"float16", "float32", "float64"}),
    runtime_alpha=False,  # cuBLAS reads alpha from the host here (device scalars: later)
    row_form=False,
    batch_fusion=False,
    alignment=256,
    reduction="tree",
    scatter="atomic",
    # Not yet run on a GPU: merged elementwise loops are one launch instead of several,
    # but the CUDA renderer's flattening of them is unmeasured (no GPU in CI).
    skip_stages=frozenset({"fuse_elementwise_kernels"}),
)
