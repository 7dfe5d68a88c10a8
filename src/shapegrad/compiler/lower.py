"""Building kernels: an optimized Graph + its FusionPlan -> a loop-IR Program.

``build_kernels`` is the loop stage that turns the graph into loop IR (see
``compiler/pipeline.py`` for the whole ordered list of stages):

1. ``assign_buffers`` names a buffer for each materialized node: graph inputs,
   persistent state (inputs that an output updates, ``Graph.aliases``), outputs,
   constants, temps.
2. :class:`KernelBuilder` emits one kernel per materialized node. Inline nodes are
   expanded by :class:`ExprBuilder` at the index their consumer needs; layout ops
   (reshape, permute, broadcast, slice, pad, concat) become index maps. Every choice
   that depends on the machine (library products, row form, local rows) is read from
   the :class:`~shapegrad.compiler.target.Target`.

Reductions to a scalar per output point become ``Reduce`` statements; accumulating
stores whose order does not matter (scatter-add, row-form rows) are marked
``commutative``; every gather/scatter index buffer is checked by a ``CheckBounds``
whose error code is described in ``Program.errors``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from shapegrad.compiler import loops as L
from shapegrad.compiler.contract import ContractMatch, View, match_contraction
from shapegrad.compiler.expand import ExprBuilder, FlatIx, flat_index
from shapegrad.compiler.fusion import FusionPlan
from shapegrad.compiler.layerloop import emit_layer_loop
from shapegrad.compiler.sorting import emit_argsort
from shapegrad.compiler.target import Target
from shapegrad.dtypes import INTEGER_RANGES, DType, DTypeError, as_dtype, bool_, float32, int32
from shapegrad.ir import Graph, Node
from shapegrad.ops.protocol import COLLECTIVES, Prim
from shapegrad.shapes import size_of

# How a layer loop lowers its body: the whole loop pipeline (``pipeline.lower_program``),
# passed down by the pipeline's build_kernels stage so that this stage never imports it.
BodyLowering = Callable[[Graph, Target, str], tuple[L.Program, Any]]


def build_kernels(
    graph: Graph,
    plan: FusionPlan,
    target: Target,
    name: str = "fn",
    lower_body: BodyLowering | None = None,
) -> L.Program:
    """Lower ``graph`` to a loop-IR program (buffers named, kernels in graph order).

    Args:
        graph: an optimized graph.
        plan: its fusion plan (``fusion.plan_fusion``).
        target: the backend's lowering policy.
        name: program name (shows in dumps and error messages).
    Returns:
        a :class:`~shapegrad.compiler.loops.Program` with its calling convention set;
        memory is not planned yet (later loop stages do that).
    Example:
        >>> program = build_kernels(graph, plan_fusion(graph), C_TARGET)
    """
    buffers, names, state_of_output, constants, input_names = assign_buffers(graph, plan)
    builder = KernelBuilder(graph, plan, names, buffers, target)
    builder.lower_body = lower_body
    builder.constants = constants  # layer loops add their bodies' constants
    kernels = builder.build()
    return L.Program(
        name,
        buffers,
        kernels,
        inputs=input_names,
        outputs=builder.output_names,
        state_of_output=state_of_output,
        constants=constants,
        errors=builder.errors,
        communicators=builder.communicators,
    )


_LOCAL_IDS: dict[int, tuple[Graph, dict[int, int]]] = {}


def local_id(graph: Graph, node: Node) -> int:
    """``node``'s position in ``graph``'s topological order.

    Generated names use it instead of the global node id, so tracing the same function
    twice yields byte-identical source (and therefore the same disk-cache key).
    """
    entry = _LOCAL_IDS.get(id(graph))
    if entry is None or entry[0] is not graph:
        entry = (graph, {n.id: k for k, n in enumerate(graph.nodes())})
        _LOCAL_IDS.clear()  # only the graph being lowered is needed
        _LOCAL_IDS[id(graph)] = entry
    return entry[1][node.id]


def assign_buffers(
    graph: Graph, plan: FusionPlan
) -> tuple[
    dict[str, L.BufferSpec],
    dict[int, str],
    dict[int, int],
    dict[str, np.ndarray[Any, Any]],
    list[str],
]:
    """Name the buffer of each materialized node; returns (specs, node id -> name,
    output -> aliased input, constants, input buffer names)."""
    buffers: dict[str, L.BufferSpec] = {}
    names: dict[int, str] = {}
    state_inputs = {i: k for k, i in graph.aliases}
    slot = 0
    input_names = []
    for i, node in enumerate(graph.inputs):
        kind, bname = ("state", f"s{i}") if i in state_inputs else ("input", f"in{i}")
        buffers[bname] = L.BufferSpec(bname, node.aval.dtype, size_of(node.shape), kind, slot)
        names[node.id] = bname
        input_names.append(bname)
        slot += 1
    constants: dict[str, np.ndarray[Any, Any]] = {}
    for node in graph.nodes():
        if node.id in plan.materialized and node.id not in names:
            if node.prim is Prim.CONSTANT:
                bname = f"c{len(constants)}"
                constants[bname] = node.attr["value"].array
                spec = L.BufferSpec(bname, node.aval.dtype, size_of(node.shape), "const", slot)
                slot += 1
            else:
                bname = f"t{local_id(graph, node)}"
                spec = L.BufferSpec(bname, node.aval.dtype, size_of(node.shape), "temp")
            buffers[bname] = spec
            names[node.id] = bname
    state_of_output = {k: i for k, i in graph.aliases}
    return buffers, names, state_of_output, constants, input_names


def _neutral(op: str, dtype: DType) -> L.Const:
    if op == "add":
        return L.Const(dtype, False if dtype == bool_ else 0)
    if dtype.is_float:
        return L.Const(dtype, -math.inf)
    if dtype == bool_:
        return L.Const(dtype, False)
    return L.Const(dtype, INTEGER_RANGES[dtype.numpy][0])  # int32, int64; uint8: 0


class KernelBuilder:
    """Emits the kernels of one graph (see :func:`build_kernels`)."""

    def __init__(
        self,
        graph: Graph,
        plan: FusionPlan,
        names: dict[int, str],
        buffers: dict[str, L.BufferSpec],
        target: Target,
    ) -> None:
        self.graph = graph
        self.plan = plan
        self.names = names
        self.buffers = buffers
        self.target = target
        self.kernels: list[L.Kernel] = []
        self.output_names: list[str] = []
        self.errors: dict[int, str] = {}
        self.communicators: list[Any] = []
        self.constants: dict[str, np.ndarray[Any, Any]] = {}
        # outputs a layer loop writes directly (``layerloop._forwarded_output``): no kernel
        self.forwarded: set[int] = set()
        self.users: dict[int, list[Node]] | None = None
        self.lower_body: BodyLowering | None = None  # for SCAN nodes (``layerloop.py``)
        self._var_count = 0

    # -- helpers ---------------------------------------------------------------------
    def expr_builder(self) -> ExprBuilder:
        """An expression builder for one kernel, with this target's expansion choices."""
        return ExprBuilder(self.plan, self.names, self.target.exp_underflow_to_zero)

    def fresh(self, extent: int, prefix: str = "i") -> L.Var:
        self._var_count += 1
        return L.Var(f"{prefix}{self._var_count}", extent)

    def temp(self, dtype: DType, size: int, hint: str) -> str:
        name = f"{hint}_{len(self.buffers)}"
        self.buffers[name] = L.BufferSpec(name, dtype, size, "temp")
        return name

    def add(self, root: Node, body: tuple[L.Stmt, ...], work: int, ex: ExprBuilder) -> None:
        shown = [f"{n.prim.value}%{local_id(self.graph, n)}" for n in ex.inlined.values()]
        kernel = L.Kernel(
            f"k{len(self.kernels)}",
            body,
            work,
            f"{root.prim.value}%{local_id(self.graph, root)}",
            shown,
        )
        self.kernels.append(kernel)

    # -- driver ----------------------------------------------------------------------
    def build(self) -> list[L.Kernel]:
        for node in self.graph.nodes():
            if node.id not in self.plan.materialized or node.prim in (Prim.INPUT, Prim.CONSTANT):
                continue
            if node.id in self.forwarded:
                continue
            self.emit(node, self.names[node.id])
        self._bind_outputs()
        return self.kernels

    def _bind_outputs(self) -> None:
        """Each output gets its own buffer; repeated/aliased/source outputs get a copy."""
        used: set[str] = set()
        for k, node in enumerate(self.graph.outputs):
            src = self.names[node.id]
            spec = self.buffers[src]
            if k in dict(self.graph.aliases):
                self.output_names.append(src)  # memory planning redirects it to the state
                used.add(src)
                continue
            if spec.kind == "temp" and src not in used:
                self.buffers[src] = L.BufferSpec(src, spec.dtype, spec.size, "output", -1)
                self.output_names.append(src)
                used.add(src)
                continue
            dst = f"out{k}"
            self.buffers[dst] = L.BufferSpec(dst, spec.dtype, spec.size, "output", -1)
            self.output_names.append(dst)
            self.copy(node, src, dst)

    def copy(self, node: Node, src: str, dst: str) -> None:
        v = self.fresh(size_of(node.shape))
        load = L.Load(node.aval.dtype, src, L.var(v))
        body = (L.Loop(v, "parallel", (L.Store(dst, L.var(v), load),)),)
        self.kernels.append(L.Kernel(f"k{len(self.kernels)}", body, v.extent, f"copy {src}"))

    def emit(self, node: Node, dst: str) -> None:
        root = self.plan.fused_roots.get(node.id)
        if root is not None:
            self.emit_reduction(root, node, dst)
        elif node.prim in (Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.EINSUM):
            self.emit_reduction(node, None, dst)
        elif node.prim is Prim.GATHER:
            self.emit_gather(node, dst)
        elif node.prim is Prim.SCATTER_ADD:
            self.emit_scatter(node, dst)
        elif node.prim in COLLECTIVES:
            self.emit_collective(node, dst)
        elif node.prim is Prim.ARGSORT:
            emit_argsort(self, node, dst)
        elif node.prim is Prim.SCAN:
            emit_layer_loop(self, node, dst)
        else:
            self.emit_elementwise(node, dst)

    # -- elementwise / layout ------------------------------------------------------------
    def emit_elementwise(self, node: Node, dst: str) -> None:
        if node.prim is Prim.CONCAT:
            self.emit_concat(node, dst)
            return
        size = size_of(node.shape)
        ex = self.expr_builder()
        v = self.fresh(size)
        value = ex.expand(node, FlatIx(L.var(v)))
        if not _has_divmod(value):
            body: tuple[L.Stmt, ...] = (L.Loop(v, "parallel", (L.Store(dst, L.var(v), value),)),)
            self.add(node, body, size * max(1, self.plan.cost.get(node.id, 1)), ex)
            return
        ex = self.expr_builder()
        vars_ = [self.fresh(d) for d in node.shape]
        index = tuple(L.var(x) for x in vars_)
        stmt: L.Stmt = L.Store(dst, L.flatten(index, node.shape), ex.expand(node, index))
        self.add(node, _nest(vars_, "parallel", (stmt,)), size, ex)

    def emit_concat(self, node: Node, dst: str) -> None:
        """One loop nest per operand writing its slab: no per-element branch on the part."""
        axis = node.attr["axis"]
        ex = self.expr_builder()
        body: list[L.Stmt] = []
        offset = 0
        for operand in node.inputs:
            vars_ = [self.fresh(d) for d in operand.shape]
            index = tuple(L.var(v) for v in vars_)
            out_index = tuple(i + offset if d == axis else i for d, i in enumerate(index))
            store = L.Store(dst, L.flatten(out_index, node.shape), ex.value(operand, index))
            body.extend(_nest(vars_, "parallel", (store,)))
            offset += operand.shape[axis]
        ex.inlined[node.id] = node
        self.add(node, tuple(body), size_of(node.shape), ex)

    # -- reductions and contractions -------------------------------------------------------
    def emit_reduction(self, root: Node, epilogue: Node | None, dst: str) -> None:
        if root.prim is Prim.EINSUM and self._try_contract(root, epilogue, dst):
            return
        ex = self.expr_builder()
        out_vars = [self.fresh(d) for d in root.shape]
        op = "max" if root.prim is Prim.REDUCE_MAX else "add"
        dtype = root.aval.dtype
        # Sums accumulate in the target's accumulator type (float16 in float32), read back
        # rounded once; a max is exact in any type.
        acc_dtype = dtype if op == "max" else as_dtype(self.target.accumulator(dtype.name))
        red_vars, summand = self._summand(root, out_vars, ex, acc_dtype)
        out_index = tuple(L.var(v) for v in out_vars)
        flat_out = L.flatten(out_index, root.shape)
        work = size_of(root.shape) * max(1, math.prod(v.extent for v in red_vars)) * 2
        final = epilogue if epilogue is not None else root
        # A wider accumulator row lives in a local scratch array: only for rows that fit.
        row_ok = acc_dtype == dtype or root.shape[-1:] <= (self.target.local_row_max,)
        if (
            out_vars
            and row_ok
            and _prefers_row_accumulation(summand, out_vars[-1], red_vars, self.target)
        ):
            body = self._row_form(root, final, dst, out_vars, red_vars, summand, op, ex)
        else:
            acc = f"acc{self._var_count}"
            total = _rounded(L.Ref(acc_dtype, acc), dtype)
            ex.subst[root.id] = lambda ix: total
            result = ex.expand(final, out_index) if epilogue is not None else total
            reduce = L.Reduce(acc, op, _neutral(op, acc_dtype), tuple(red_vars), summand)
            inner: tuple[L.Stmt, ...] = (reduce, L.Store(dst, flat_out, result))
            body = _nest(out_vars, "parallel", inner)
        self.add(final, body, work, ex)

    def _row_form(
        self,
        root: Node,
        final: Node,
        dst: str,
        out_vars: list[L.Var],
        red_vars: list[L.Var],
        summand: L.Expr,
        op: str,
        ex: ExprBuilder,
    ) -> tuple[L.Stmt, ...]:
        """Accumulate a whole output row so the innermost loop runs over outputs.

        With an epilogue, the row lives in a local scratch array and ``dst`` is written
        once per element (so ``dst`` may be a state buffer updated in place).
        """
        dtype = root.aval.dtype
        acc_dtype = summand.dtype  # a wider accumulator always uses a local row
        last = out_vars[-1]
        index = tuple(L.var(v) for v in out_vars)
        flat = L.flatten(index, root.shape)
        row, row_ix = dst, flat
        stmts: list[L.Stmt] = []
        widened = acc_dtype != dtype
        use_local = widened or (final is not root and last.extent <= self.target.local_row_max)
        if use_local:
            row, row_ix = f"row{self._var_count}", L.var(last)
            stmts.append(L.Local(row, acc_dtype, last.extent))
        stmts.append(L.Loop(last, "parallel", (L.Store(row, row_ix, _neutral(op, acc_dtype)),)))
        stmts.extend(
            _nest(
                red_vars,
                "reduction",
                (L.Loop(last, "parallel", (L.Store(row, row_ix, summand, op, True),)),),
            )
        )
        if final is not root or widened:
            total = _rounded(L.Load(acc_dtype, row, row_ix), dtype)
            ex.subst[root.id] = lambda ix: total
            value = ex.expand(final, index) if final is not root else total
            stmts.append(L.Loop(last, "parallel", (L.Store(dst, flat, value),)))
        return _nest(out_vars[:-1], "parallel", tuple(stmts))

    def _summand(
        self, root: Node, out_vars: list[L.Var], ex: ExprBuilder, acc_dtype: DType
    ) -> tuple[list[L.Var], L.Expr]:
        """Reduction variables and the value accumulated at each point, in ``acc_dtype``
        (a product's factors are widened before they multiply: float16 x float16 is exact
        in float32)."""
        if root.prim is not Prim.EINSUM:
            (x,) = root.inputs
            axes = root.attr["axes"]
            red_vars: list[L.Var] = []
            it = iter(out_vars)
            idx = []
            for d, size in enumerate(x.shape):
                if d in axes:
                    v = self.fresh(size, "r")
                    red_vars.append(v)
                    idx.append(L.var(v))
                else:
                    idx.append(L.var(next(it)))
            return red_vars, _widened(ex.value(x, tuple(idx)), acc_dtype)
        terms, out = root.attr["spec"].split("->")
        letters: dict[str, L.Var] = dict(zip(out, out_vars, strict=True))
        red_vars = []
        for term, operand in zip(terms.split(","), root.inputs, strict=True):
            for letter, size in zip(term, operand.shape, strict=True):
                if letter not in letters:
                    letters[letter] = self.fresh(size, "r")
                    red_vars.append(letters[letter])
        product: L.Expr | None = None
        for term, operand in zip(terms.split(","), root.inputs, strict=True):
            value = _widened(ex.value(operand, tuple(L.var(letters[c]) for c in term)), acc_dtype)
            product = value if product is None else L.Binary(acc_dtype, "mul", product, value)
        assert product is not None
        return red_vars, product

    def _try_contract(self, root: Node, epilogue: Node | None, dst: str) -> bool:
        if len(root.inputs) != 2 or root.aval.dtype.name not in self.target.contract_dtypes:
            return False
        match = match_contraction(
            root,
            self.expr_builder(),
            self.target.contract_min_macs,
            self._pack,
            self.target.strided_batches,
        )
        if match is None:
            return False
        ex = self.expr_builder()
        dtype = root.aval.dtype
        # With an epilogue the product goes to its own temp: ``dst`` is then written once
        # per element, so it may be a state buffer that the epilogue also reads.
        update = None if epilogue is None else self._update_form(root, epilogue, dst, match, ex)
        if update is not None:
            work = 2 * match.m * match.n * match.k * match.batch * match.sum_batch
            assert epilogue is not None
            self.add(epilogue, update, work, ex)
            return True
        product = dst if epilogue is None else self.temp(dtype, size_of(root.shape), "prod")
        stmts: list[L.Stmt] = [match.statement(product, dtype)]
        if epilogue is not None:
            ex.subst[root.id] = lambda ix: L.Load(dtype, product, flat_index(ix, root.shape))
            vars_ = [self.fresh(d) for d in root.shape]
            index = tuple(L.var(x) for x in vars_)
            store = L.Store(dst, L.flatten(index, root.shape), ex.expand(epilogue, index))
            stmts.extend(_nest(vars_, "parallel", (store,)))
        work = 2 * match.m * match.n * match.k * match.batch * match.sum_batch
        self.add(epilogue if epilogue is not None else root, tuple(stmts), work, ex)
        return True

    def _update_form(
        self, root: Node, epilogue: Node, dst: str, match: ContractMatch, ex: ExprBuilder
    ) -> tuple[L.Stmt, ...] | None:
        """``dst = p -/+ c * product`` (an SGD-style update) as ``dst = p`` followed by a
        library call with ``alpha = -/+c, beta = 1``: no product temp, no second pass.

        Memory planning later renames ``dst`` to ``p``'s state buffer when the update is
        done in place, which turns the copy into a no-op that it drops.
        """
        if epilogue.prim not in (Prim.SUB, Prim.ADD) or epilogue.inputs[1] is root:
            return None
        base, term = epilogue.inputs
        scale: Node | None = None
        if term.prim is Prim.MUL and root in term.inputs:
            scale = term.inputs[1] if term.inputs[0] is root else term.inputs[0]
        elif term is not root:
            return None
        vars_ = [self.fresh(d) for d in root.shape]
        index = tuple(L.var(x) for x in vars_)
        flat = L.flatten(index, root.shape)
        alpha, alpha_buffer, alpha_index = 1.0, None, 0
        if scale is not None:
            value = ex.value(scale, index)
            if scale is root:
                return None
            if isinstance(value, L.Const):
                alpha = float(value.value)
            elif (
                self.target.runtime_alpha
                and isinstance(value, L.Load)
                and not value.index.terms  # one element, the same for every output
                and value.dtype == root.aval.dtype
            ):
                alpha_buffer, alpha_index = value.buffer, value.index.const
            else:
                return None
        if epilogue.prim is Prim.SUB:
            alpha = -alpha
        old = ex.value(base, index)
        if not (isinstance(old, L.Load) and old.index == flat and old.dtype == root.aval.dtype):
            return None  # the updated value is not a plain same-shaped buffer
        if (
            alpha_buffer == dst
            or old.buffer in (match.a.buffer, match.b.buffer)
            or dst
            in (
                match.a.buffer,
                match.b.buffer,
            )
        ):
            return None
        ex.inlined[epilogue.id] = epilogue
        if scale is not None:
            ex.inlined[term.id] = term
        call = replace(
            match.statement(dst, root.aval.dtype),
            alpha=alpha,
            beta=1.0,
            alpha_buffer=alpha_buffer,
            alpha_index=alpha_index,
        )
        copy = _nest(vars_, "parallel", (L.Store(dst, flat, old),))
        return (*copy, call)

    def _pack(self, operand: Node, term: str, order: str) -> View:
        """Write ``operand`` (axes named by ``term``) to a new temp with axes in ``order``."""
        sizes = dict(zip(term, operand.shape, strict=True))
        shape = tuple(sizes[c] for c in order)
        dst = self.temp(operand.aval.dtype, size_of(shape), "pack")
        ex = self.expr_builder()
        letter_vars = {c: self.fresh(sizes[c]) for c in order}
        index = tuple(L.var(letter_vars[c]) for c in order)
        value = ex.value(operand, tuple(L.var(letter_vars[c]) for c in term))
        store = L.Store(dst, L.flatten(index, shape), value)
        body = _nest([letter_vars[c] for c in order], "parallel", (store,))
        self.add(operand, body, size_of(shape), ex)
        strides, step = {}, 1
        for c in reversed(order):
            strides[c] = step
            step *= sizes[c]
        return View(dst, 0, strides)

    # -- indexing ----------------------------------------------------------------------------
    def _check(self, node: Node, idx: Node, n: int) -> L.CheckBounds:
        """The bounds check of ``node``'s index operand, with its entry in the error table."""
        code = len(self.errors) + 1
        what = "gather" if node.prim is Prim.GATHER else "scatter_add"
        where = (
            f"kernel k{len(self.kernels)} ({node.prim.value}%{local_id(self.graph, node)}, "
            f"index buffer {self.names[idx.id]} of shape {list(idx.shape)})"
        )
        custom = node.attr.get("what")  # the op's own words, e.g. cross_entropy's labels
        self.errors[code] = (
            f"{custom} (checked in {where})"
            if custom
            else f"{what} index out of range [{-n}, {n}) in {where}"
        )
        return L.CheckBounds(self.names[idx.id], size_of(idx.shape), n, code)

    def emit_gather(self, node: Node, dst: str) -> None:
        x, idx = node.inputs
        axis = node.attr["axis"]
        ex = self.expr_builder()
        out_vars = [self.fresh(d) for d in node.shape]
        idx_vars = out_vars[axis : axis + len(idx.shape)]
        j = self.fresh(x.shape[axis], "g")
        x_index = (
            *(L.var(v) for v in out_vars[:axis]),
            L.var(j),
            *(L.var(v) for v in out_vars[axis + len(idx.shape) :]),
        )
        load_idx = L.IndexLoad(
            j, self.names[idx.id], L.flatten(tuple(L.var(v) for v in idx_vars), idx.shape)
        )
        store = L.Store(
            dst, L.flatten(tuple(L.var(v) for v in out_vars), node.shape), ex.value(x, x_index)
        )
        body = (
            self._check(node, idx, x.shape[axis]),
            *_nest(out_vars, "parallel", (load_idx, store)),
        )
        self.add(node, body, size_of(node.shape), ex)

    def emit_scatter(self, node: Node, dst: str) -> None:
        updates, idx = node.inputs
        axis = node.attr["axis"]
        ex = self.expr_builder()
        size = node.attr["size"]
        dtype = node.aval.dtype
        # Accumulated in the target's accumulator type (float16 rows in a float32 temp).
        acc_dtype = as_dtype(self.target.accumulator(dtype.name))
        out = dst if acc_dtype == dtype else self.temp(acc_dtype, size_of(node.shape), "acc")
        zero_var = self.fresh(size_of(node.shape))
        zero = L.Loop(zero_var, "parallel", (L.Store(out, L.var(zero_var), L.Const(acc_dtype, 0)),))
        up_vars = [self.fresh(d) for d in updates.shape]
        idx_vars = up_vars[axis : axis + len(idx.shape)]
        j = self.fresh(size, "g")
        out_index = (
            *(L.var(v) for v in up_vars[:axis]),
            L.var(j),
            *(L.var(v) for v in up_vars[axis + len(idx.shape) :]),
        )
        load_idx = L.IndexLoad(
            j, self.names[idx.id], L.flatten(tuple(L.var(v) for v in idx_vars), idx.shape)
        )
        value = _widened(ex.value(updates, tuple(L.var(v) for v in up_vars)), acc_dtype)
        store = L.Store(out, L.flatten(out_index, node.shape), value, "add", commutative=True)
        body = (self._check(node, idx, size), zero, *_nest(up_vars, "reduction", (load_idx, store)))
        if out != dst:
            v = self.fresh(size_of(node.shape))
            total = _rounded(L.Load(acc_dtype, out, L.var(v)), dtype)
            body = (*body, L.Loop(v, "parallel", (L.Store(dst, L.var(v), total),)))
        self.add(node, body, size_of(updates.shape), ex)

    # -- collectives -----------------------------------------------------------------------------
    def emit_collective(self, node: Node, dst: str) -> None:
        """One ``Collective`` statement between staging loops: reductions of float16/bool run
        in float32/int32 (as the NumPy path does), a mean divides the sum afterwards. A
        communicator of one process makes every collective a copy."""
        (x,) = node.inputs
        comm = node.attr["comm"]
        src = self.names[x.id]
        dtype = node.aval.dtype
        ex = self.expr_builder()
        if comm.size == 1:
            self.add(node, _copy_loop(self.fresh(size_of(node.shape)), src, dst, dtype), 0, ex)
            return
        if comm not in self.communicators:
            self.communicators.append(comm)
        kind = {
            Prim.ALL_REDUCE: "all_reduce",
            Prim.ALL_GATHER: "all_gather",
            Prim.REDUCE_SCATTER: "reduce_scatter",
            Prim.BROADCAST_FROM: "broadcast",
        }[node.prim]
        op = node.attr.get("op", "sum")
        reduces = kind in ("all_reduce", "reduce_scatter")
        work = dtype
        if reduces and dtype.name in ("float16", "bfloat16", "bool", "uint8"):
            work = float32 if dtype.is_float else int32
        if reduces and dtype.name == "int64":  # native MPI handles: float32/64, int32, bytes
            raise DTypeError(
                f"{node.prim.value}: compiled collectives reduce float32, float64 and int32, "
                f"not int64 ({node.aval}); cast with .astype(sg.float64) or .int() first, or "
                "run it eagerly"
            )
        body: list[L.Stmt] = []
        n_in, n_out = size_of(x.shape), size_of(node.shape)
        send, recv = src, dst
        if work != dtype:
            send, recv = self.temp(work, n_in, "send"), self.temp(work, n_out, "recv")
            body.extend(_copy_loop(self.fresh(n_in), src, send, work, dtype))
        code = len(self.errors) + 1
        self.errors[code] = (
            f"MPI failed in {kind} ({node.prim.value}%{local_id(self.graph, node)} of "
            f"{dtype.name}{list(x.shape)}, kernel k{len(self.kernels)}, {comm!r})"
        )
        count = n_out if kind == "reduce_scatter" else n_in
        root = node.attr.get("root")
        index = self.communicators.index(comm)
        reduce_op = "max" if op == "max" else "sum"
        body.append(L.Collective(kind, send, recv, count, work, index, reduce_op, root, code))
        if op == "mean":
            v = self.fresh(n_out)
            mean = L.Binary(work, "div", L.Load(work, recv, L.var(v)), L.Const(work, comm.size))
            body.append(L.Loop(v, "parallel", (L.Store(recv, L.var(v), mean),)))
        if work != dtype:
            body.extend(_copy_loop(self.fresh(n_out), recv, dst, dtype, work))
        self.add(node, tuple(body), n_in, ex)


def _copy_loop(
    v: L.Var, src: str, dst: str, dtype: DType, src_dtype: DType | None = None
) -> tuple[L.Stmt, ...]:
    """``dst[i] = dtype(src[i])`` for every element."""
    load: L.Expr = L.Load(src_dtype or dtype, src, L.var(v))
    if src_dtype is not None and src_dtype != dtype:
        load = L.Cast(dtype, load)
    return (L.Loop(v, "parallel", (L.Store(dst, L.var(v), load),)),)


def _widened(value: L.Expr, acc_dtype: DType) -> L.Expr:
    """``value`` in the accumulator type (unchanged when that is its own)."""
    return value if value.dtype == acc_dtype else L.Cast(acc_dtype, value)


def _rounded(total: L.Expr, dtype: DType) -> L.Expr:
    """An accumulated ``total`` back in the reduction's result type."""
    return total if total.dtype == dtype else L.Cast(dtype, total)


def _nest(vars_: list[L.Var], kind: str, body: tuple[L.Stmt, ...]) -> tuple[L.Stmt, ...]:
    for v in reversed(vars_):
        body = (L.Loop(v, kind, body),)
    return body


def _has_divmod(e: L.Expr) -> bool:
    for sub in L.walk_expr(e):
        index = getattr(sub, "index", None) or getattr(sub, "counter", None)
        if isinstance(index, L.Affine) and any(isinstance(a, L.DivMod) for a in index.atoms()):
            return True
    return False


def _prefers_row_accumulation(
    summand: L.Expr, last_out: L.Var, red_vars: list[L.Var], target: Target
) -> bool:
    """True when loads are contiguous along the last output axis but not the last reduced one."""
    if not red_vars or last_out.extent < 4 or not target.row_form:
        return False
    last_red = red_vars[-1]
    loads = [e for e in L.walk_expr(summand) if isinstance(e, L.Load)]
    out_unit = sum(1 for ld in loads if ld.index.coef(last_out) == 1)
    red_unit = sum(1 for ld in loads if ld.index.coef(last_red) == 1)
    # On a tie, a wide output row vectorizes better than a short dot product.
    return out_unit > red_unit or (out_unit == red_unit and last_out.extent >= 8 and target.tie_row)
