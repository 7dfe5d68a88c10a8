"""Team splitting of library products: the C renderer's rules for ``Contract`` and
``BatchFused`` statements across the OpenMP team, and the work-sharing primitives they
share with loops.

A :class:`TeamRenderer` renders in one of three modes, fixed when it is made (``mode``,
chosen by the schedule, ``schedule.py``): ``"fork"`` (no enclosing OpenMP region: a split
opens its own), ``"shared"`` (inside the step's one region: an orphaned work-sharing
construct, ``nowait``; the caller places barriers) or ``"serial"`` (inside the region on
one thread: nothing is split). Large products are cut into blocks
of rows or columns of the result, each one single-threaded BLAS call taken dynamically
by whichever thread is free; sums of products into small outputs are cut into groups of
the summed axis whose partials are added in group order. Blocks and groups are cut by
the configured thread count ``sg_threads``, never by the team a call runs with, so the
result does not depend on that team (``render.py``'s adaptive choice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final

from shapegrad.backends.c import gemm_kernel
from shapegrad.backends.cstyle import CStyleRenderer
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import CTuning

# The split thresholds and block counts are fields of ``CTuning`` (``compiler/target.py``):
# ``contract_split_macs``, ``sum_split_max_out``, ``split_parts``, ``column_split``.
MODES = ("fork", "shared", "serial")
# The team a fork-mode split opens: the timed function's choice for this call, the full
# team (``sg_threads``) or one thread (``runtime.h``, ``render._function``). Work is still
# cut by ``sg_threads``.
FORK_TEAM = "sg_team_now"


class TeamRenderer(CStyleRenderer):
    """Work-sharing primitives and library products (see the module docstring)."""

    def __init__(
        self,
        program: L.Program,
        tuning: CTuning | None = None,
        flush_denormals: bool = False,
        mode: str = "fork",
    ) -> None:
        ctuning = tuning if tuning is not None else CTuning()
        super().__init__(program, ctuning)
        if mode not in MODES:
            raise ValueError(f"TeamRenderer: mode must be one of {MODES}, got {mode!r}")
        self.ctuning: Final = ctuning
        self.mode: Final = mode
        # every region sets flush-to-zero on its threads (``render_c(flush_denormals=True)``)
        self.flush_denormals: Final = flush_denormals

    def work_sharing(self, depth: int, schedule: str) -> None:
        """The pragma that splits the next ``for`` across the team."""
        if self.mode == "shared":
            self.emit(depth, f"#pragma omp for schedule({schedule}) nowait")
        elif self.flush_denormals:  # a region of its own, whose threads set the mode
            self.emit(depth, f"#pragma omp parallel num_threads({FORK_TEAM})")
            self.emit(depth, "{")
            self.emit(depth, "SG_FP_ENTER;")
            self.emit(depth, f"#pragma omp for schedule({schedule})")
        else:
            self.emit(
                depth, f"#pragma omp parallel for schedule({schedule}) num_threads({FORK_TEAM})"
            )

    def end_work_sharing(self, depth: int) -> None:
        """Close what ``work_sharing`` opened (after the loop)."""
        if self.mode != "shared" and self.flush_denormals:
            self.emit(depth, "SG_FP_LEAVE;")
            self.emit(depth, "}")

    def team_block(self, depth: int, team: str) -> None:
        """Open a block every thread of the team runs (a region of its own in fork mode, of
        ``team`` threads: an expression of ``FORK_TEAM``)."""
        if self.mode != "shared":
            self.emit(depth, "#ifdef _OPENMP")
            self.emit(depth, f"#pragma omp parallel num_threads({team})")
            self.emit(depth, "#endif")
        self.emit(depth, "{")
        if self.mode != "shared" and self.flush_denormals:
            self.emit(depth + 1, "SG_FP_ENTER;")

    def end_team_block(self, depth: int) -> None:
        """Close the block of ``team_block``."""
        if self.mode != "shared" and self.flush_denormals:
            self.emit(depth + 1, "SG_FP_LEAVE;")
        self.emit(depth, "}")

    def contract(self, s: L.Contract, depth: int) -> None:
        """Library products; large ones are split across the team (``_split_kind``):
        blocks of rows of ``c`` (or of columns, when ``a`` is the smaller operand: each
        call packs the whole of the other operand, so split the side that is cheaper to
        repeat), whole products of a batch, or the summed axis. Blocks are taken
        dynamically, so a thread that keeps running takes the work of one that was
        descheduled. Each block is one single-threaded BLAS call (``sg_set_threads``);
        every output element is computed by one call, as serially."""
        if is_streamed_outer(s, self.ctuning):
            self.outer_product(s, depth)
            return
        fn = gemm_kernel.function(s)  # the library's, or shapegrad's own (AVX-512 builds)
        f = "f" if s.dtype.name == "float32" else ""
        one, alpha, beta = f"1.0{f}", _alpha(s), f"{s.beta!r}{f}"
        ta, tb = (112 if s.trans_a else 111), (112 if s.trans_b else 111)
        kind = split_kind(s, self.ctuning) if self.mode != "serial" else None
        if kind == "sum":
            self.contract_sum_split(s, depth)
            return
        a_row = 1 if s.trans_a else s.lda  # elements between rows of op(a)
        b_col = s.ldb if s.trans_b else 1  # elements between columns of op(b)
        rows, cols, a_off, b_off, c_off = str(s.m), str(s.n), "", "", ""
        if kind == "batch":  # many independent products: whole products per thread
            self.work_sharing(depth, "dynamic, 1")
        elif kind in ("rows", "cols"):
            parts = split_parts(self.ctuning)
            extent = s.m if kind == "rows" else s.n
            self.work_sharing(depth, "dynamic, 1")
            self.emit(depth, f"for (int64_t part = 0; part < {parts}; ++part) {{")
            depth += 1
            self.emit(depth, f"const int64_t p0 = part * {extent} / {parts};")
            self.emit(depth, f"const int64_t p1 = (part + 1) * {extent} / {parts};")
            if kind == "rows":
                rows, a_off, c_off = "(int)(p1 - p0)", f" + p0 * {a_row}", f" + p0 * {s.row_c}"
            else:
                cols, b_off, c_off = "(int)(p1 - p0)", f" + p0 * {b_col}", " + p0"
        self.emit(depth, f"for (int64_t bi = 0; bi < {s.batch}; ++bi)")
        self.emit(depth + 1, f"for (int64_t si = 0; si < {s.sum_batch}; ++si)")
        self.emit(
            depth + 2,
            f"{fn}(101, {ta}, {tb}, {rows}, {cols}, {s.k}, {alpha}, "
            f"{s.a} + {s.offset_a} + {s.batch_offset('a', 'bi')} + si * {s.sum_stride_a}{a_off}, "
            f"{s.lda}, "
            f"{s.b} + {s.offset_b} + {s.batch_offset('b', 'bi')} + si * {s.sum_stride_b}{b_off}, "
            f"{s.ldb}, "
            f"si ? {one} : {beta}, {s.c} + {s.batch_offset('c', 'bi')}{c_off}, {s.row_c});",
        )
        if kind in ("rows", "cols"):
            depth -= 1
            self.emit(depth, "}")
        if kind is not None:
            self.end_work_sharing(depth)

    def outer_product(self, s: L.Contract, depth: int) -> None:
        """A large product with ``k = 1`` (a batch of outer products: the per-example
        weight gradients of ``vmap(grad(...))``) as rows written with streaming stores
        (``sg_outer_row_*``, ``runtime.h``) instead of one library call per product, which
        zeroes ``c`` and then reads it back to add the product. Rows are shared statically
        across the team; each element is one product, whatever the split."""
        suffix = "f32" if s.dtype.name == "float32" else "f64"
        a_row = 1 if s.trans_a else s.lda  # op(a)[i, 0]
        b_col = s.ldb if s.trans_b else 1  # op(b)[0, j]
        if self.mode != "serial":
            self.team_block(depth, "sg_threads")
            self.emit(depth + 1, "#pragma omp for schedule(static) nowait")
        self.emit(depth + 1, f"for (int64_t r = 0; r < {s.batch * s.m}; ++r) {{")
        self.emit(depth + 2, f"const int64_t bi = r / {s.m}, i = r - bi * {s.m};")
        self.emit(
            depth + 2,
            f"sg_outer_row_{suffix}({s.c} + bi * {s.stride_c} + i * {s.n}, "
            f"{s.a}[{s.offset_a} + bi * {s.stride_a} + i * {a_row}], "
            f"{s.b} + {s.offset_b} + bi * {s.stride_b}, {b_col}, {s.n});",
        )
        self.emit(depth + 1, "}")
        self.emit(depth + 1, "sg_stream_fence();")
        if self.mode != "serial":
            self.end_team_block(depth)

    def contract_sum_split(self, s: L.Contract, depth: int) -> None:
        """A sum of products (a convolution's weight gradient) split over the summed axis
        into one group per configured thread, each accumulated into a private partial and
        added into ``c`` in group order (``summed_groups``)."""
        fn = gemm_kernel.library_function(s)
        f = "f" if s.dtype.name == "float32" else ""
        e = self.emit
        e(depth, "{")
        self.team_block(depth, FORK_TEAM)

        def group(d: int) -> None:
            e(d, "for (int64_t si = s0; si < s1; ++si)")
            a = f"{s.a} + {s.offset_a} + si * {s.sum_stride_a}"
            b = f"{s.b} + {s.offset_b} + si * {s.sum_stride_b}"
            e(d + 1, _partial_product(fn, s, a, b, f"si > s0 ? 1.0{f} : 0.0{f}"))

        e(depth + 1, "const int nt = sg_team_size(), tid = sg_thread_id();")
        self.summed_groups(s, depth + 1, "sg_threads", s.sum_batch, group)
        self.end_team_block(depth)
        e(depth, "}")

    def summed_groups(
        self, s: L.Contract, d: int, groups: str, total: int, group: Callable[[int], None]
    ) -> None:
        """``groups`` partials of a sum of ``total`` products, added into ``s.c`` in group
        order (the first also applies ``beta``). With a full team (``nt == groups``) thread
        g computes group g and the adds take turns between barriers; with any other team
        thread 0 computes and adds every group in turn. The order of the adds is the same
        either way, so the result depends on the configured thread count only, not on the
        team a call actually ran with. ``group(d)`` emits the code filling ``part`` from
        the products ``s0 <= i < s1``."""
        e, f, size = self.emit, ("f" if s.dtype.name == "float32" else ""), s.m * s.n
        e(d, f"const int ng = {groups};")
        e(d, f"{self.type_name(s.dtype)} part[{size}];")
        e(d, "int64_t s0 = 0, s1 = 0;")
        e(d, "if (nt == ng) {")
        e(d + 1, f"s0 = tid * (int64_t){total} / ng; s1 = (tid + 1) * (int64_t){total} / ng;")
        group(d + 1)
        e(d, "}")
        e(d, "for (int q = 0; q < ng; ++q) {")
        e(d + 1, "if (nt != ng && tid == 0) {")
        e(d + 2, f"s0 = q * (int64_t){total} / ng; s1 = (q + 1) * (int64_t){total} / ng;")
        group(d + 2)
        e(d + 1, "}")
        e(d + 1, "#ifdef _OPENMP")
        e(d + 1, "#pragma omp barrier")
        e(d + 1, "#endif")
        e(d + 1, "if (nt == ng ? q != tid : tid != 0) continue;")
        init = f"0.0{f}" if s.beta == 0.0 else f"{s.beta!r}{f} * {s.c}[i]"
        if _partial_transposed(s):  # ``part`` is n x m (see ``_partial_product``)
            loop = f"for (int64_t i = 0, r = 0; r < {s.m}; ++r) for (int64_t j = 0; j < {s.n}; ++j, ++i) "
            got = f"part[j * {s.m} + r]"
        else:
            loop, got = f"for (int64_t i = 0; i < {size}; ++i) ", "part[i]"
        e(d + 1, "if (q == 0)")
        e(d + 2, f"{loop}{s.c}[i] = {init} + (s1 > s0 ? {got} : 0.0{f});")
        e(d + 1, "else if (s1 > s0)")
        e(d + 2, f"{loop}{s.c}[i] += {got};")
        e(d, "}")

    def batch_fused(self, s: L.BatchFused, depth: int) -> None:
        """Per batch index: the producer nests write this thread's scratch slice, then one
        library call reads it (see ``loops.BatchFused``). Threads share the batch indices
        (or, for a sum of products, split them into groups whose partials are added in
        group order, ``summed_groups``)."""
        c, e = s.contract, self.emit
        fn = gemm_kernel.function(c)
        t, f = self.type_name(c.dtype), ("f" if c.dtype.name == "float32" else "")
        summed = c.sum_batch > 1
        count = c.sum_batch if summed else c.batch
        team = f"(sg_threads < {s.slots} ? sg_threads : {s.slots})"  # groups: a cut
        e(depth, "{")
        self.team_block(depth, f"({FORK_TEAM} < {s.slots} ? {FORK_TEAM} : {s.slots})")
        d = depth + 1
        e(d, "const int tid = sg_thread_id(), nt = sg_team_size();")
        e(d, "(void)nt;")
        e(d, f"{t} *restrict sg_slice = {s.scratch} + tid * {s.slice};")
        product = replace(c, c="sg_slice", stride_c=0) if s.operand == "c" else c
        a_step = c.sum_stride_a if summed else c.stride_a
        b_step = c.sum_stride_b if summed else c.stride_b
        a = "sg_slice" if s.operand == "a" else f"{c.a} + {c.offset_a} + bi * {a_step}"
        b = "sg_slice" if s.operand == "b" else f"{c.b} + {c.offset_b} + bi * {b_step}"
        out = f"{product.c} + bi * {product.stride_c}"

        def index_body(d: int) -> None:
            self._slice_nests(s.producer, s.scratch, d)
            if summed:
                e(d, _partial_product(fn, c, a, b, f"bi > s0 ? 1.0{f} : 0.0{f}"))
            else:
                e(
                    d,
                    f"{fn}(101, {112 if c.trans_a else 111}, {112 if c.trans_b else 111}, "
                    f"{c.m}, {c.n}, {c.k}, {_alpha(c)}, {a}, {c.lda}, {b}, {c.ldb}, "
                    f"{c.beta!r}{f}, {out}, {c.n});",
                )
            self._slice_nests(s.consumer, s.scratch, d)

        if summed:

            def group(d: int) -> None:
                e(d, "for (int64_t bi = s0; bi < s1; ++bi) {")
                index_body(d + 1)
                e(d, "}")

            self.summed_groups(c, d, team, count, group)
        else:  # each index runs in the slice of the thread that takes it
            nowait = " nowait" if self.mode == "shared" else ""
            e(d, f"#pragma omp for schedule(dynamic, 1){nowait}")
            e(d, f"for (int64_t bi = 0; bi < {count}; ++bi) {{")
            index_body(d + 1)
            e(d, "}")
        self.end_team_block(depth)
        e(depth, "}")

    def _slice_nests(self, nests: tuple[L.Loop, ...], scratch: str, depth: int) -> None:
        """Each nest with its outer variable fixed to ``bi`` and the scratch addressed
        through this thread's slice."""
        for nest in nests:
            body = L.rename_buffers(nest.body, lambda n: "sg_slice" if n == scratch else n)
            self.emit(depth, "{")
            self.emit(depth + 1, f"int64_t {nest.var.name} = bi;")
            self.stmts(body, depth + 1, parallel_ok=False)
            self.emit(depth, "}")


def is_streamed_outer(s: L.Contract, tuning: CTuning) -> bool:
    """Whether ``s`` is rendered by ``outer_product``: ``k = 1``, no sum batch, a plain
    ``c = a b`` (alpha 1, beta 0) whose output is at least ``tuning.stream_outer_min_bytes``."""
    size = s.batch * s.m * s.n * (4 if s.dtype.name == "float32" else 8)
    plain = s.alpha == 1.0 and s.beta == 0.0 and s.alpha_buffer is None
    floats = s.dtype.name in ("float32", "float64")
    return (
        s.k == 1 and s.sum_batch == 1 and plain and floats and size >= tuning.stream_outer_min_bytes
    )


def split_kind(s: L.Contract, tuning: CTuning) -> str | None:
    """How a product is split across the team: ``"sum"`` (a large sum of few outputs: over
    the summed axis), ``"batch"`` (whole products of a batch of at least
    ``tuning.batch_split_min``), ``"rows"`` or ``"cols"`` (blocks of ``c``, each at least
    ``tuning.block_split_min`` long; columns when ``op(a)`` is smaller than ``op(b)``, so
    the operand every block packs again is the small one), or None (too small: one call)."""
    if s.m * s.n * s.k * s.batch * s.sum_batch < tuning.contract_split_macs:
        return None
    if s.batch == 1 and s.sum_batch >= 2 and s.m * s.n <= tuning.sum_split_max_out:
        return "sum"
    if s.batch >= tuning.batch_split_min:
        return "batch"
    rows = s.m >= tuning.block_split_min
    if s.batch > 1:
        return "rows" if rows else None
    if tuning.column_split and s.m < s.n and s.n >= tuning.block_split_min:
        return "cols"
    return "rows" if rows else None


def _partial_transposed(s: L.Contract) -> bool:
    """Whether a thread's private partial of a summed product is kept transposed.

    The partial is private, so its layout is free: OpenBLAS runs the form with more
    rows than columns faster (CNN weight gradient m=32, n=144, k=784: 75 -> 102 GF/s;
    m=16, n=144: 62 -> 81; m=64, n=576, k=196: 121 -> 138; one thread, this machine)."""
    return s.m < s.n


def _partial_product(fn: str, s: L.Contract, a: str, b: str, beta: str) -> str:
    """The library call adding one product of the summed ``s`` into ``part``: ``m x n`` as
    written, or ``n x m`` as ``op(b)^T @ op(a)^T`` when ``_partial_transposed(s)``."""
    ta, tb = (112 if s.trans_a else 111), (112 if s.trans_b else 111)
    # ``sg_gemm_abt_dot(...)`` takes the arguments of ``cblas_sgemm(101, 111, 112, ...)``,
    # the form both orientations of ``a @ b^T`` are (``gemm_kernel.takes_dot``)
    call = "sg_gemm_abt_dot(" if gemm_kernel.takes_dot(s) else f"{fn}(101, "
    if not _partial_transposed(s):
        trans = "" if gemm_kernel.takes_dot(s) else f"{ta}, {tb}, "
        return (
            f"{call}{trans}{s.m}, {s.n}, {s.k}, {_alpha(s)}, "
            f"{a}, {s.lda}, {b}, {s.ldb}, {beta}, part, {s.n});"
        )
    flip = {111: 112, 112: 111}
    trans = "" if gemm_kernel.takes_dot(s) else f"{flip[tb]}, {flip[ta]}, "
    return (
        f"{call}{trans}{s.n}, {s.m}, {s.k}, {_alpha(s)}, "
        f"{b}, {s.ldb}, {a}, {s.lda}, {beta}, part, {s.m});"
    )


def _alpha(s: L.Contract) -> str:
    """The product's scale: a literal, times a run-time scalar when it has one."""
    f = "f" if s.dtype.name == "float32" else ""
    if s.alpha_buffer is None:
        return f"{s.alpha!r}{f}"
    return f"({s.alpha!r}{f} * {s.alpha_buffer}[{s.alpha_index}])"


def split_parts(tuning: CTuning) -> str:
    """C expression: the blocks a split product or row reduction is cut into
    (``tuning.split_parts`` per configured thread; one block when threading is off)."""
    if tuning.split_parts == 1:
        return "sg_threads"
    return f"(sg_threads > 1 ? {tuning.split_parts} * sg_threads : 1)"
