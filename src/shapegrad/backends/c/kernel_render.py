"""The C of one kernel: ``CRenderer``, the renderer ``render.py`` assembles a translation
unit with (its threading policy is described there).

A kernel is a ``{ ... }`` block: the ``restrict`` pointers of the buffers it touches, then
its statements; large parallel loops split across the team (``schedule.py`` plans which),
row reductions split over the row, library products in blocks (``teamsplit.py``),
all-reduces through ``collectives.py``, gradients summed where they are loaded
(``shmplan.ReaderSum``) and updates of state kept once per node run in this rank's chunk
(``shmshard.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shapegrad.backends.c.collectives import reader_sums, render_collective, shard_text
from shapegrad.backends.c.schedule import Region, Unit, chunk_size, fork_parallel
from shapegrad.backends.c.shm import reader_load, reader_pointers
from shapegrad.backends.c.teamsplit import TeamRenderer, split_parts
from shapegrad.compiler import loops as L
from shapegrad.compiler.splitting import row_of
from shapegrad.compiler.target import CTuning

# A compiler-only memory fence at the top of every kernel block (no instruction is emitted):
# each kernel loads its inputs from the arena instead of receiving an earlier kernel's
# vector registers through gcc's store-to-load forwarding. gcc 12.2 (-fassociative-math)
# vectorized a fully unrolled small sum of products fed by two such forwarded exp vectors
# as an SLP reduction in lane order [3, 2, 0, 1] and permuted only one of them: a silent
# wrong answer (issue 26; defined C, tests/data/gcc12_slp_reduction_miscompile.c;
# docs/DESIGN.md, known debts).
KERNEL_FENCE: Final = '__asm__ __volatile__("" ::: "memory"); /* kernel boundary */'


class CRenderer(TeamRenderer):
    """C with OpenMP threading and OpenBLAS products (see ``render.py``'s module docstring).

    ``mode`` (fixed per renderer; a region's units get renderers of their own, sharing the
    output) says how the statements run: ``"fork"`` (no enclosing region: a large loop
    opens its own ``parallel for``; layer bodies and programs with collectives),
    ``"shared"`` (inside the step's region, split by an orphaned work-sharing construct)
    or ``"serial"`` (inside the region, on one thread). ``fail_to`` (serial units of a
    group that can fail): the group's ``sg_fail`` index and skip label.
    """

    split_at_print = False  # the split_index_sets stage split the loops

    def __init__(
        self,
        program: L.Program,
        tuning: CTuning | None = None,
        flush_denormals: bool = False,
        mode: str = "fork",
        fail_to: tuple[int, str] | None = None,
    ) -> None:
        super().__init__(program, tuning, flush_denormals, mode)
        # functions of layer-loop bodies, shared by the renderers of one translation unit
        self.functions: list[str] = []
        self.fail_to: Final = fail_to
        # the all-reduces summed where they are loaded (backends/c/shmplan.py, ReaderSum), by
        # the names of their source and destination; none in layer bodies
        self.sums = {n: r for r in reader_sums(program) for n in (r.src, r.dst)}
        # state kept once per node, updated in shards (backends/c/shmshard.py)
        self.shard = shard_text(program, self.fail)
        self.sharded: set[str] = set()  # loop variables running this rank's chunk

    def _part(self, mode: str, fail_to: tuple[int, str] | None = None) -> CRenderer:
        """A renderer for one unit of the region, writing into this one's output."""
        part = CRenderer(self.program, self.ctuning, self.flush_denormals, mode, fail_to)
        part.lines = self.lines
        part.sums = self.sums
        part.shard = self.shard
        part.functions = self.functions
        return part

    def body(self, plan: Region, profile: bool, depth: int = 1) -> None:
        """The statements of a function running ``plan`` (``schedule.plan_region``) after
        its opening line, ending in ``return``.

        In fork mode each kernel is a block of its own. Otherwise the whole function is
        one ``#pragma omp parallel`` region: shared units are orphaned ``omp for`` loops,
        runs of serial units one ``omp single``, barriers where the plan puts them. A group
        that can fail records its code in its own ``sg_fail[g]``; after the group a barrier
        and a test of that flag send every thread to ``sg_end`` together, so the first
        failing check's code is returned and the rest skipped.
        """
        if not plan.groups:
            for number, k in enumerate(plan.kernels, plan.first):
                self.kernel(k, number, profile, plan.parallel[number - plan.first])
            self.emit(depth, "return 0;")
            return
        e = self.emit
        if plan.failing:
            e(depth, f"int sg_fail[{plan.failing}] = {{0}};")
        e(depth, "const int sg_pick = sg_team_pick();")
        e(depth, "const double sg_start = sg_threads > 1 && sg_adaptive == 1 ? sg_clock() : 0.0;")
        e(depth, f"#pragma omp parallel num_threads(sg_pick ? {plan.team} : 1)")
        e(depth, "{")
        d = depth + 1
        if self.flush_denormals:
            e(d, "SG_FP_ENTER;")
        for group in plan.groups:
            if group.barrier:
                e(d, "#pragma omp barrier")
            if group.shared:
                self._part("shared")._unit(group.units[0], d, profile)
                continue
            flag = group.flag
            e(d, "#pragma omp single nowait")
            e(d, "{")
            serial = self._part("serial", (flag, f"sg_skip{flag}") if flag >= 0 else None)
            for u in group.units:
                serial._unit(u, d + 1, profile)
            if flag >= 0:
                e(d + 1, f"sg_skip{flag}:;")
            e(d, "}")
            if flag >= 0:
                e(d, "#pragma omp barrier")
                e(d, f"if (sg_fail[{flag}]) goto sg_end;")
        if plan.failing:
            e(d, "sg_end:;")
        if self.flush_denormals:
            e(d, "SG_FP_LEAVE;")
        e(depth, "}")
        e(depth, "if (sg_start != 0.0) sg_team_record(sg_pick, sg_clock() - sg_start);")
        if plan.failing:
            e(depth, f"for (int g = 0; g < {plan.failing}; ++g)")
            e(depth + 1, "if (sg_fail[g]) return sg_fail[g];")
        e(depth, "return 0;")

    def _unit(self, u: Unit, depth: int, profile: bool) -> None:
        k = u.kernel
        if self.shard is not None and self.shard.touches(k):  # collectives force fork mode
            raise AssertionError(f"{k.name}: a sharded update rendered inside a region")
        self.emit(
            depth, f"/* {k.name}: root {k.root}; work {k.work}{' (shared)' if u.shared else ''} */"
        )
        if k.inlined:
            self.emit(depth, f"/*   inlined: {', '.join(k.inlined)} */")
        self.emit(depth, "{")
        self.emit(depth + 1, KERNEL_FENCE)
        if profile:
            self.emit(depth + 1, "double sg_t0 = sg_now();")
        loaded = {ld.buffer for ld in L.loads_in(u.body)}
        for name in sorted(u.reads | u.writes):
            for line in self._pointers(name, name in loaded):
                self.emit(depth + 1, line)
        for s in u.body:
            self.stmt(s, depth + 1, parallel_ok=u.shared)
        if profile:
            if u.shared:  # thread 0 times the whole construct, stragglers included
                self.emit(depth + 1, "#pragma omp barrier")
                self.emit(depth + 1, "if (sg_thread_id() == 0)")
                self.emit(depth + 2, f"sg_profile[{u.number}] += sg_now() - sg_t0;")
            else:
                self.emit(depth + 1, f"sg_profile[{u.number}] += sg_now() - sg_t0;")
        self.emit(depth, "}")

    def kernel(self, k: L.Kernel, number: int, profile: bool, parallel: tuple[bool, ...]) -> None:
        """One kernel as a block of its own (fork mode); ``parallel``: per top-level
        statement, whether it may split across threads (``schedule.fork_parallel``)."""
        self.emit(1, f"/* {k.name}: root {k.root}; work {k.work} */")
        if k.inlined:
            self.emit(1, f"/*   inlined: {', '.join(k.inlined)} */")
        self.emit(1, "{")
        self.emit(2, KERNEL_FENCE)
        if profile:
            self.emit(2, "double sg_t0 = sg_now();")
        loaded = {ld.buffer for ld in L.loads_in(k.body)}
        for name in sorted(L.reads(k.body) | L.writes(k.body)):
            for line in self._pointers(name, name in loaded):
                self.emit(2, line)
        lines, self.sharded = self.shard.enter(k) if self.shard else ([], set())
        for line in lines:
            self.emit(2, line)
        for s, ok in zip(k.body, parallel, strict=True):
            self.stmt(s, 2, parallel_ok=ok)
        for line in self.shard.leave(k) if self.shard else []:
            self.emit(2, line)
        self.sharded = set()
        if profile:
            self.emit(2, f"sg_profile[{number}] += sg_now() - sg_t0;")
        self.emit(1, "}")

    def _pointers(self, name: str, loaded: bool) -> list[str]:
        """The declarations of buffer ``name`` in a kernel (``loaded``: the kernel loads it;
        an all-reduce summed at its readers declares a pointer per rank there)."""
        spec = self.program.buffers[name]
        t = self.storage_name(spec.dtype)
        const = "const " if spec.kind in ("input", "const") else ""
        src = f"(arena + {spec.offset})" if spec.kind == "temp" else f"io[{spec.slot}]"
        if name in self.sums:
            return reader_pointers(self.sums[name], name, src, loaded)
        return [f"{const}{t} *restrict {name} = ({const}{t} *){src};"]

    def expr(self, e: L.Expr) -> str:
        """A load of an all-reduce's result summed at its readers is the ranks' sum."""
        if isinstance(e, L.Load) and e.buffer in self.sums and self.sums[e.buffer].dst == e.buffer:
            return reader_load(self.sums[e.buffer], self.affine(e.index))
        return super().expr(e)

    def loop(self, s: L.Loop, depth: int, parallel_ok: bool) -> None:
        """A large parallel loop is split across the team; a large reduction over rows
        (a bias gradient) is split over the row instead (``_split_rows``). Nothing inside
        a serial loop forks a team: a region per iteration would fork thousands of times."""
        if parallel_ok and s.kind == "parallel" and s.trips > 1:
            self.work_sharing(depth, f"dynamic, {chunk_size(s, self.ctuning)}")
            self.emit(depth, self.for_header(s))
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            self.end_work_sharing(depth)
            return
        if parallel_ok and s.kind == "reduction" and (row := row_of(s)) is not None:
            self._split_rows(s, row, depth)
            return
        super().loop(s, depth, parallel_ok and s.var.extent <= 1)

    def _split_rows(self, nest: L.Loop, row: L.Loop, depth: int) -> None:
        """``for r (reduction): for j (parallel): x[j] op= ...`` with the j range split across
        the team, each thread running every r over its own block of j: per element the sum
        runs in the same order as serially, so results are identical."""
        j = row.var
        e = self.emit
        parts = split_parts(self.ctuning)
        self.work_sharing(depth, "dynamic, 1")
        e(depth, f"for (int64_t part = 0; part < {parts}; ++part) {{")
        e(depth + 1, f"const int64_t j0 = part * {j.extent} / {parts};")
        e(depth + 1, f"const int64_t j1 = (part + 1) * {j.extent} / {parts};")

        def blocked(x: L.Stmt) -> L.Stmt:
            return _BlockLoop(j, x.body) if isinstance(x, L.Loop) and x.var == j else x

        self.stmts(L.map_body((nest,), stmt=blocked), depth + 1, False)
        e(depth, "}")
        self.end_work_sharing(depth)

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        if isinstance(s, _BlockLoop):
            v = s.var.name
            self.emit(depth, f"for (int64_t {v} = j0; {v} < j1; ++{v}) {{")
            self.stmts(s.body, depth + 1, False)
            self.emit(depth, "}")
            return
        super().stmt(s, depth, parallel_ok)

    def for_header(self, s: L.Loop) -> str:
        """A loop of a sharded update runs this rank's chunk (``shmshard``)."""
        v = s.var.name
        if v in self.sharded:
            return f"for (int64_t {v} = sg_lo_{v}; {v} < sg_hi_{v}; ++{v}) {{"
        return super().for_header(s)

    def fail(self, code: int) -> str:
        if self.fail_to is None:
            return f"return {code};"
        flag, label = self.fail_to
        return f"{{ sg_fail[{flag}] = {code}; goto {label}; }}"

    def layer_loop(self, s: L.LayerLoop, depth: int) -> None:
        """The body as its own function (rendered once, fork mode), called per layer with
        its I/O table pointing at the layer's slices (see ``loops.LayerLoop``)."""
        fn = f"sg_layer{len(self.functions)}"
        self.functions.append("")  # reserve the number; nested bodies come first
        sub = CRenderer(s.body, self.ctuning, self.flush_denormals)
        sub.functions = self.functions
        sub.sums = {}
        sub.lines.append(f"/* layer body {comment_safe(s.body.name)} */")
        sub.lines.append(f"static int {fn}(void **restrict io, char *restrict arena) {{")
        sub.emit(1, "(void)io; (void)arena;")
        for number, k in enumerate(s.body.kernels):
            sub.kernel(k, number, False, fork_parallel(k, self.ctuning))
        sub.emit(1, "return 0;")
        sub.lines.append("}")
        self.functions[int(fn[len("sg_layer") :])] = "\n".join(sub.lines)
        e = self.emit
        e(depth, "{")
        e(depth + 1, f"void *sg_sub[{max(len(s.slots), 1)}];")
        e(depth + 1, f"for (int64_t sg_i = 0; sg_i < {s.length}; ++sg_i) {{")
        layer = f"{s.length - 1} - sg_i" if s.reverse else "sg_i"
        e(depth + 2, f"int64_t layer = {layer};")
        for number, slot in enumerate(s.slots):
            e(
                depth + 2,
                f"sg_sub[{number}] = (void *)({slot.buffer} + {slot.offset} + {slot.stride} * layer);",
            )
        e(depth + 2, f"int sg_rc = {fn}(sg_sub, (char *){s.arena});")
        e(depth + 2, "if (sg_rc) return sg_rc;")
        self.stmts(s.after, depth + 2, False)
        e(depth + 1, "}")
        e(depth, "}")

    def collective(self, s: L.Collective, depth: int) -> None:
        """MPI through the pointers bound by ``sg_mpi_bind`` (``backends/c/collectives.py``)."""
        fused = self.sums.get(s.dst)
        render_collective(s, self.type_name(s.dtype), self.emit, depth, fused)


@dataclass(frozen=True)
class _BlockLoop(L.Stmt):
    """``for var in [j0, j1)``: one thread's block of a split row (render-time only)."""

    var: L.Var
    body: tuple[L.Stmt, ...]


def comment_safe(text: str) -> str:
    """``text`` made harmless inside a C comment (a user-chosen function name)."""
    return "".join(ch if ch.isalnum() or ch in "_.-<> " else "_" for ch in text)
