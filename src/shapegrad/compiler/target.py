"""What a backend wants from lowering: the one place where schedule policy lives.

Lowering, fusion, the loop stages and the renderers read every decision that depends
on the machine from a :class:`Target`; none of them hold a tuning constant of their own.
A backend passes its target to ``compiler.pipeline.lower_program`` (and the C backend
its :class:`CTuning` to the renderer); the C backend's values below are measured on
the CPUs this project runs on (see each field, and the comment above each number in
:class:`Tuning` and :class:`CTuning`).

A GPU target would, for example, allow float16 products (tensor cores), turn the
row form and batch fusion off (they trade parallelism for cache locality) and run
reductions as trees and scatters as atomics.

Example:
    >>> from shapegrad.compiler.target import C_TARGET
    >>> no_batch = C_TARGET.replace(batch_fusion=False, row_form=False)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tuning:
    """Size limits of the loop stages and of the loops every C-like renderer writes.

    The base record every backend has; a backend with constants of its own extends it
    (:class:`CTuning`). Each value sits next to the reason or measurement that chose it.
    """

    # Index-set splitting (``compiler/segments.py``): more segments per loop than this are
    # not worth the code size.
    max_segments: int = 6
    # A nest cut by ``segments.presplit`` into more statements than this many times its own
    # is left to the top-down splitting (nested segments multiply: code size, compile time).
    presplit_growth: int = 32
    # Loops this short whose variable meets another one in a range test (``3*kh + kw`` of a
    # convolution's patch index) run as one copy per value; also the largest factor of a
    # div-split (``v = d*outer + r``, one body copy per r) and the largest pooling window
    # accumulated as a row (``segments.window_rows``).
    max_unroll: int = 8
    # Longest row of accumulators of ``segments.window_rows`` (a stack array per row).
    window_row_max: int = 4096
    # Loop fusion (``compiler/loopfuse.py``): kernels per merged loop; beyond this the
    # body's registers spill.
    fuse_max_group: int = 6
    # fuse_row_kernels: kernels per merged row loop (a softmax is 4, LayerNorm's forward 5,
    # their backward passes 3-6)
    row_fuse_max_group: int = 8
    # a per-row value (a LayerNorm's 1/std) forwarded into the row's later statements
    row_forward_max_nodes: int = 24
    # shortest row a merged reduction runs over (softmax rows 64, LayerNorm 128; a 2x2
    # pooling window, 4, keeps the renderer's row-of-accumulators form in its own kernel)
    row_fuse_min_row: int = 16
    # Expression size up to which a private temp of a merged loop is recomputed inline.
    fuse_max_forwarded_nodes: int = 160
    # Float sums (``cstyle.sum_blocks``): shorter sums keep one accumulator (exact enough,
    # fastest); longer ones are summed in blocks of ``sum_block`` terms into a double (one
    # float32 accumulator saturates: 2**28 ones summed one by one give 2**24 per lane).
    blocked_sum_min: int = 1 << 14
    # Terms per partial: long enough to vectorize, short enough to stay exact.
    sum_block: int = 1 << 10


@dataclass(frozen=True)
class CTuning(Tuning):
    """The C renderer's threading and translation-unit constants (``backends/c``)."""

    # Fork/join of a 2-thread OpenMP team costs ~2-5 µs here; a kernel needs roughly this
    # many scalar ops (≈ 20-40 µs of work) before splitting it pays off (fork mode: layer
    # bodies and programs with collectives, one ``parallel for`` per large statement).
    omp_min_work: int = 1 << 18
    # One OpenMP region per step (``backends/c/schedule.py``); False: one region per large
    # loop.
    one_region: bool = True
    # Inside the step's one region a split loop costs no fork, only the wait for the
    # slowest thread where a later kernel needs its result, so smaller loops are worth
    # splitting there.
    region_min_work: int = 1 << 18
    # Target work of one dynamically scheduled chunk of a parallel loop, in the scalar ops
    # of ``cstyle.estimate_work``: small enough that a thread which keeps running takes
    # most of the chunks when the other one is descheduled, large enough that taking a
    # chunk (one atomic increment) stays negligible. Measured: see
    # ``benchmarks/train_step.py`` and the README's threading section.
    chunk_work: int = 1 << 15
    # Library products at least this large (multiply-adds) are split into row blocks, one
    # single-threaded BLAS call per OpenMP thread (nested BLAS threading is never used).
    contract_split_macs: int = 1 << 20
    # Products with k = 1 (outer products) whose output has at least this many bytes are
    # written row by row with streaming stores (``teamsplit.outer_product``): beyond the
    # last-level cache the library call's zero-then-accumulate reads every line back.
    # Measured: 128 outer products 784 x 512 (205 MB, float32), 2 threads, AVX-512 EPYC under
    # load: plain stores 28.6-35.8 ms, streaming stores 20.0-22.4 ms.
    stream_outer_min_bytes: int = 1 << 23
    # A large sum of products whose output has at most this many elements is split over
    # the summed axis instead (each thread keeps a private partial of the output on its
    # stack): the products keep all their rows (m=32, not 16, for the CNN's weight
    # gradient).
    sum_split_max_out: int = 1 << 14
    # Blocks per configured thread of a split product or row reduction, taken dynamically
    # (a thread that keeps running takes a block the other has not started). Measured, 2
    # threads, MLP 784-512-512-10 step, in-process interleaved: 1 block per thread 1.95 ms,
    # 2 blocks 2.00 ms (quiet); 11.9 vs 13.7 ms (2 busy processes). Every extra block packs
    # the other operand again: 128x784x512 on one thread, 1 call 759 us, 2 row blocks 844
    # us, 4 row blocks 1027 us, 4 column blocks 857 us (CPU time). Again on the AMD EPYC
    # box (AVX-512), 2 busy processes, load average 6-9, ``threads_ab.py --tune
    # split_parts=2``, full team, 1 vs 2 blocks per thread: MLP 34.6 vs 36.8 ms, w1024 45.0
    # vs 49.1 ms, CNN 79.8 vs 77.3 ms (medians of one interleaved run).
    split_parts: int = 1
    # Split a product by columns of ``c`` when ``op(a)`` is the smaller operand (see
    # ``teamsplit.split_kind``).
    column_split: bool = True
    # A batch of at least this many large products is split into whole products per
    # thread (``teamsplit.split_kind``); smaller batches are split into blocks of rows.
    # Set with the rule, not measured separately.
    batch_split_min: int = 8
    # Rows (or columns) of ``c`` a product needs before it is cut into blocks. Set with
    # the rule, not measured separately.
    block_split_min: int = 16
    # A work-shared loop is cut into at least this many dynamic chunks (``chunk_work``
    # caps the chunk from above), so a descheduled thread's share can move to another.
    # Set with ``chunk_work``, not measured separately.
    min_chunks: int = 8
    # A translation unit holds about this many generated lines (consecutive kernels, never
    # split), as ONE function: gcc's per-function overhead made one function per kernel
    # cost 12-20% more compiler CPU than one per unit (GPT step 3.0-3.2 vs 2.7-2.9 s;
    # 64-layer MLP 1.8-1.9 vs 1.5 s). Units of 600 or 1200 lines cost the same CPU (GPT
    # 2.7-2.9 s, MLP 1.5 s); 600 gives 7-8 units, which balance better over the compiler
    # processes and recompile less after an edit. Per unit, gcc's start-up is ~0.1 s wall
    # (cc1 + as; the 70-line shared header parses in 0.04 s).
    unit_lines: int = 600
    # Programs below this many kernel lines stay one unit. Measured (gcc 12, -O2, compiler
    # CPU seconds, one unit vs 600-line units + step unit + link, load average 7 so wall
    # times are not comparable): MLP step depth 8 (~700 lines) 0.18 vs 0.21, depth 16
    # (~1300) 0.35 vs 0.37, depth 32 (~2000) 0.82 vs 0.76, depth 64 (3900) 1.9 vs 1.5, GPT
    # (4400) 2.5-2.8 vs 2.7-2.8. On two free cores the split finishes in about half its
    # CPU time, so it pays from ~1000 lines on; below, the extra units and the link cost
    # more than they save.
    split_min_lines: int = 1000

    @classmethod
    def of(cls, tuning: Tuning) -> CTuning:
        """``tuning`` as a C record (a base :class:`Tuning` gets the C defaults)."""
        if isinstance(tuning, CTuning):
            return tuning
        return cls(**{f.name: getattr(tuning, f.name) for f in dataclasses.fields(Tuning)})


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
        row_fusion: adjacent kernels over the same rows share one loop over the rows
            (the ``fuse_row_kernels`` stage, ``rowfuse.py``).
        strided_batches: a library product's batch may be two axes with strides of their
            own and its output rows wider than ``n`` (``loops.Contract.inner``/``ldc``), so
            attention's head views are read and written in place, not copied.
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
        tuning: the backend's size limits and thresholds (:class:`Tuning`; the C backend's
            :class:`CTuning`).
        exp_underflow_to_zero: ``exp`` gives 0 where its result would be denormal (argument
            below ln of the smallest normal: -87.33 in float32) and never hands such an
            argument to the math library: glibc's vector exp falls back to scalar code for
            a whole vector when one lane is out of range (masked attention scores made the
            softmax exp 8x slower). Exact elsewhere; see ``compiler.expand``.
        winograd_min_channels: ``sg.conv2d(algorithm="auto")`` becomes Winograd F(2x2, 3x3)
            (the ``choose_conv_algorithm`` stage, ``compiler/conv_algorithm.py``) for 3x3
            stride-1 float convolutions with at least this many input and output channels;
            None: "auto" stays im2col (every target today: ``_conv.WINOGRAD_MIN_CHANNELS``
            has the measurements, and why the rule is not on).
        accumulators: ``(element type, accumulator type)`` pairs: sums and products of the
            first type accumulate in the second and round once at the end (float16 and bfloat16
            in float32, like NumPy and cuBLAS: a float16 accumulator stops at 2048 when adding
            ones). See :meth:`accumulator`.
    """

    name: str
    contract_min_macs: int = 4096
    contract_dtypes: frozenset[str] = frozenset({"float32", "float64"})
    runtime_alpha: bool = True
    row_form: bool = True
    tie_row: bool = False
    local_row_max: int = 4096
    strided_batches: bool = True
    row_fusion: bool = True
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
    tuning: Tuning = field(default_factory=Tuning)
    exp_underflow_to_zero: bool = False
    winograd_min_channels: int | None = None
    accumulators: tuple[tuple[str, str], ...] = (("float16", "float32"), ("bfloat16", "float32"))

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
        if stage == "permute_product_outputs" and not self.strided_batches:
            return False
        if stage == "fuse_row_kernels" and not self.row_fusion:
            return False
        return stage not in self.skip_stages


# Measured on the project's 2-core x86-64 machines (single call incl. ~1 µs of Python):
# a lone matmul is faster through BLAS at every size tried (10x16x16: 1.3 vs 2.2 µs;
# 128^3: 47 vs 1876 µs), but inside the moons step the tiny products (<= 2560 MACs at
# batch 10) are better as loops sharing kernels with their fused epilogues (0.85-0.9
# µs/step vs 1.3-1.5 µs with BLAS everywhere); at batch 256 (4096-65536 MACs) BLAS wins
# (11.4 µs vs 12.5 µs with a 65536 threshold). Batch fusion keeps a CNN's 29 MB im2col
# patches out of memory (one 451 KB image slice per thread instead).
C_TARGET = Target(name="c", tuning=CTuning(), exp_underflow_to_zero=True)


# A GPU wants parallelism over cache locality: no row form (it serialises the output row
# per thread), no batch fusion (per-thread scratch slices), float16 and bfloat16 products
# on tensor cores, reductions as block trees and scatters as atomics. Index checks of
# inputs still run first (one small kernel), so a failing step changes nothing.
CUDA_TARGET = Target(
    name="cuda",
    # Measured (benchmarks/cuda_thresholds.py, H200, 2026-11-26; per step, K=32 steps in
    # one CUDA graph): generated loops beat cuBLAS up to 524288 multiply-adds (128x64x64:
    # 2.31 vs 6.09 us; 64^3: 2.27 vs 3.11), cuBLAS wins from 2097152 (128^3: 4.28 vs 4.50;
    # 256^3: 6.3 vs 111). The threshold sits between the two.
    contract_min_macs=1 << 20,
    contract_dtypes=frozenset({"float16", "bfloat16", "float32", "float64"}),
    runtime_alpha=False,  # cuBLAS reads alpha from the host here (device scalars: later)
    row_form=False,
    # a row loop would run each row's passes on one GPU thread, where separate launches
    # spread every pass over the grid
    row_fusion=False,
    # cublasGemmStridedBatchedEx takes one stride per operand: head views are copied
    strided_batches=False,
    batch_fusion=False,
    alignment=256,
    reduction="tree",
    scatter="atomic",
    # fuse_elementwise_kernels runs: a merged nest maps onto the grid whole (one launch);
    # tests/test_cuda_gpu.py's fused-program tests are its check on a GPU. Index-set
    # splitting is done by the CUDA renderer inside each thread's body (the stage's rule
    # for which loops stay whole is the C team's, not the grid's).
    skip_stages=frozenset(
        {"split_index_sets", "speculate_selects", "overlap_collectives", "collapse_loops"}
    ),
)
