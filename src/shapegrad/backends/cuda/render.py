"""The CUDA renderer: loop IR -> one CUDA C++ translation unit (a ``CStyleRenderer``).

The same loop IR as the C backend (lowered for ``CUDA_TARGET``: no row form, no
batch fusion), scheduled for a GPU:

* **Grid mapping.** Each top-level loop nest of a kernel becomes one
  ``__global__`` function. Its outer chain of loops that may run concurrently
  (``parallel`` loops, and ``reduction`` loops whose only writes are commutative
  accumulations, which then become atomics) is flattened into one thread index,
  the *innermost* variable fastest, so consecutive threads touch consecutive
  elements (coalesced). The rest of the nest runs in the thread.
* **Reductions.** A ``Reduce`` whose output points are few and whose reduced extent
  is long runs as a block tree: one block per output point, threads stride over the
  reduced elements, partials combine by warp shuffles and one shared-memory pass
  (:data:`TREE_MIN_REDUCED`, :data:`TREE_MAX_OUTPUTS`). A full reduction to a scalar
  therefore never runs on one thread. Float16 reductions accumulate in float.
* **Products.** ``Contract`` statements are ``cublasGemmStridedBatchedEx`` calls
  (row-major operands passed as their column-major transposes: ``C^T = B^T A^T``),
  float16 on tensor cores with float accumulation.
* **Errors.** A failed ``CheckBounds`` records its code and step in ``sg_err``
  (first failure wins, ``atomicCAS``); every kernel starts with ``if (*sg_err)
  return;``, so the rest of the program, and later steps, are skipped.
* **Layer loops** (``sg.scan``, ``sg.checkpoint``: ``loops.LayerLoop``). The body
  program's kernels become device functions once, and one host function
  ``sg_layerN(io, arena, ...)`` that enqueues them (and their cuBLAS calls) for one
  layer. The enclosing step calls it in a host loop over the layers with the body's
  I/O table pointed at each layer's slices (``buffer + offset + stride * layer``) of
  the stacked parameters, carries and outputs, then launches the carry moves. Under
  graph capture the loop records ``length`` copies of the body into the CUDA graph;
  the source and nvcc's time do not grow with the depth.
* **Host launcher.** ``sg_enqueue_steps`` launches every kernel and library call
  of ``k`` steps on one stream (stacked inputs advance by ``step[slot]`` bytes);
  ``sg_graph_build`` captures that into a CUDA graph and ``sg_graph_launch``
  replays it: one host call per step, or per ``k`` steps. Launch configurations
  are written next to each launch.

Compile-only use (no GPU needed): ``nvcc -cubin -arch=sm_90`` on the source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shapegrad.backends.c.collectives import mpi_prelude
from shapegrad.backends.cstyle import C_TYPES, helpers
from shapegrad.backends.cuda.host import (
    CUBLAS_DECL,
    HostLauncher,
    Launch,
    LayerCall,
    comment_safe,
)
from shapegrad.compiler import loops as L
from shapegrad.dtypes import DType

BLOCK = 256
# A Reduce runs as a block tree when it reduces at least TREE_MIN_REDUCED elements into at
# most TREE_WIDE_OUTPUTS output points, or at least TREE_MIN_REDUCED_WIDE elements into at
# most TREE_MAX_OUTPUTS; otherwise each thread reduces one output point by itself.
# Measured (benchmarks/cuda_thresholds.py, H200, 2026-11-26, sums per step): with up to
# 4096 outputs the tree wins from 64 reduced elements (16 x 64: 1.36 vs 1.95 us; 4096 x
# 64: 4.1 vs 9.5) and loses at 16; with 65536 and 262144 outputs it wins only from 256
# (65536 x 256: 59.8 vs 69.6; 65536 x 64: 43.8 vs 18.0 for one thread per output).
TREE_MIN_REDUCED = 64
TREE_WIDE_OUTPUTS = 4096
TREE_MIN_REDUCED_WIDE = 256
TREE_MAX_OUTPUTS = 1 << 18
ATOMIC_DTYPES = frozenset({"float32", "float64", "float16", "int32"})

INCLUDES = r"""#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
"""

# int32 max/min and negation, written so that ptxas cannot miscompile them. ptxas (seen with
# CUDA 13.0 for sm_90 on an H100; reported for 12.8-13.3 on sm_100) fuses chained int32
# max/min into a three-input VIMNMX3 and drops an operand's negation on the way:
# max(-a, -b, -c) ran as max(-a, b, -c), silently (int32 min is -max(-x); the GPU fuzzer
# found it). A compare-and-select is recognised as max all the same, so max/min are calls
# that ptxas keeps as calls (one VIMNMX each, nothing to fuse across), and -x is ~x + 1 (LOP3
# and an add, no negated operand anywhere). int32 max/min are rare on the GPU's hot paths
# (argmax, integer models); float max/min are untouched.
INT_MINMAX = r"""static __device__ __noinline__ int32_t sg_maxi(int32_t a, int32_t b) { return a > b ? a : b; }
static __device__ __noinline__ int32_t sg_mini(int32_t a, int32_t b) { return a < b ? a : b; }
{q} int32_t sg_negi(int32_t x) {
    int32_t r;
    asm("{ .reg .b32 t; not.b32 t, %1; add.s32 %0, t, 1; }" : "=r"(r) : "r"(x));
    return r;
}
"""

# Block-wide reduction: warp shuffles, then one shared-memory pass over the warps' partials.
BLOCK_REDUCE = r"""
static __device__ __forceinline__ uint8_t sg_shfl_down(uint8_t v, int o) { return (uint8_t)__shfl_down_sync(0xffffffffu, (int)v, o); }
static __device__ __forceinline__ int32_t sg_shfl_down(int32_t v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
static __device__ __forceinline__ float sg_shfl_down(float v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
static __device__ __forceinline__ double sg_shfl_down(double v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
template <typename T, typename Op>
static __device__ __forceinline__ T sg_block_reduce(T v, T neutral, Op op) {
    __shared__ T partial[32];
    for (int o = 16; o > 0; o >>= 1) v = op(v, sg_shfl_down(v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = threadIdx.x < warps ? partial[threadIdx.x] : neutral;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = op(v, sg_shfl_down(v, o));
    return v;
}
"""

CUDA_TYPES = {**C_TYPES, "float16": "__half"}


class CudaRenderer(HostLauncher):
    """Renders device functions into ``self.lines`` and records the host launch sequence."""

    types = CUDA_TYPES
    # Block-tree thresholds (class attributes so benchmarks/cuda_thresholds.py can vary them)
    tree_min_reduced = TREE_MIN_REDUCED
    tree_min_reduced_wide = TREE_MIN_REDUCED_WIDE
    tree_max_outputs = TREE_MAX_OUTPUTS

    def __init__(self, program: L.Program, parent: CudaRenderer | None = None) -> None:
        super().__init__(program, parent)
        self._atomic: set[str] = set()
        self._float_acc: set[str] = set()
        # A layer body's renderer shares its parent's output: device functions go to the
        # same lines, names are numbered by one counter.
        self._names: list[int] = parent._names if parent is not None else [0]
        if parent is not None:
            self.lines = parent.lines
            self.tree_min_reduced = parent.tree_min_reduced
            self.tree_min_reduced_wide = parent.tree_min_reduced_wide
            self.tree_max_outputs = parent.tree_max_outputs
        self._prefix = f"l{len(self.layer_functions)}_" if parent is not None else ""

    # -- expressions that differ from C ----------------------------------------------------
    def unary(self, op: str, dtype: DType, x: str) -> str:
        """int32 negation through ``sg_negi`` (see INT_MINMAX); the rest as in C."""
        if op == "neg" and dtype.name == "int32":
            return f"sg_negi({x})"
        if op == "abs" and dtype.name == "int32":  # abs.s32, not a select over -x
            return f"abs({x})"
        return super().unary(op, dtype, x)

    def expr(self, e: L.Expr) -> str:
        if isinstance(e, L.Ref) and e.name in self._float_acc:
            return f"((__half){e.name})"
        return super().expr(e)

    def store(self, s: L.Store) -> str:
        if s.accumulate and s.buffer in self._atomic:
            assert s.accumulate == "add" and s.commutative
            return f"atomicAdd(&{s.buffer}[{self.affine(s.index)}], {self.expr(s.value)});"
        return super().store(s)

    def fail(self, code: int) -> str:
        return f"if (atomicCAS(&sg_err[0], 0, {code}) == 0) sg_err[1] = (int)sg_step;"

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        if isinstance(s, _ThreadCheck):  # one element of a CheckBounds per thread
            x = f"{s.buffer}[{s.var.name}]"
            self.emit(depth, f"if ({x} < -{s.n} || {x} >= {s.n}) {{")
            self.emit(depth + 1, self.fail(s.code))
            self.emit(depth, "}")
            return
        super().stmt(s, depth, parallel_ok)

    def contract(self, s: L.Contract, depth: int) -> None:
        raise NotImplementedError("CUDA: library products are host calls, not device code")

    def layer_loop(self, s: L.LayerLoop, depth: int) -> None:
        raise NotImplementedError(
            "CUDA: a layer loop runs on the host (see layer_call); it must be a top-level "
            f"statement of its kernel, not inside device code (body {s.body.name})"
        )

    def batch_fused(self, s: L.BatchFused, depth: int) -> None:
        raise NotImplementedError(
            "CUDA: batch-fused products are not rendered; lower with CUDA_TARGET "
            "(batch_fusion=False)"
        )

    # -- kernels ----------------------------------------------------------------------------
    def kernel(self, k: L.Kernel) -> None:
        """Every top-level statement group of ``k`` becomes a launch (or a library call)."""
        for part in _parts(k.body):
            if len(part) == 1 and isinstance(part[0], L.Contract):
                self.launches.append((k.name, part[0]))
            elif len(part) == 1 and isinstance(part[0], L.BatchFused):
                self.batch_fused(part[0], 0)
            elif len(part) == 1 and isinstance(part[0], L.LayerLoop):
                self.launches.append((k.name, self.layer_call(k, part[0])))
            elif len(part) == 1 and isinstance(part[0], L.Collective):
                self.launches.append((k.name, part[0]))
                self.collective_function(part[0])
            else:
                self.launches.append((k.name, self.device_function(k, part)))

    def layer_call(self, k: L.Kernel, s: L.LayerLoop) -> LayerCall:
        """The body's kernels rendered once, as device functions and one host function
        ``sg_layerN`` that enqueues them for one layer; the host loop over the layers (see
        :meth:`host`) points the body's I/O table at each layer's slices. The ``after``
        statements (moving the next carry into place) are launches of the enclosing
        program, run after each layer."""
        sub = CudaRenderer(s.body, parent=self)
        number = len(self.layer_functions)
        self.layer_functions.append("")  # reserve the number; nested bodies come first
        for body_kernel in s.body.kernels:
            sub.kernel(body_kernel)
        fn = f"sg_layer{number}"
        text = [
            f"/* layer body {comment_safe(s.body.name)} */",
            f"static int {fn}(void **io, char *arena, int *sg_err, cudaStream_t stream,",
            "                 void *blas, int64_t t) {",
            "    (void)io; (void)arena; (void)blas;",
            *sub.launch_lines(1),
            "    return 0;",
            "}",
            "",
        ]
        self.layer_functions[number] = "\n".join(text)
        after = L.Kernel(f"{k.name}_after", s.after, 0, f"{k.root} (next carry)")
        moves = [self.device_function(after, part) for part in _parts(s.after)]
        return LayerCall(fn, s, moves, sub.launch_count())

    def device_function(self, k: L.Kernel, part: tuple[L.Stmt, ...]) -> Launch:
        name = f"sg_{self._prefix}{k.name}_{self._names[0]}"
        self._names[0] += 1
        chain, body = _grid_chain(part, self._atomic_ok(part))
        outputs = math.prod(v.var.extent for v in chain)
        tree = _tree_reduce(
            body, outputs, self.tree_min_reduced, self.tree_max_outputs, self.tree_min_reduced_wide
        )
        self._atomic = {
            s.buffer
            for loop in chain
            if loop.kind == "reduction"
            for s in L.walk(loop.body)
            if isinstance(s, L.Store) and s.accumulate
        }
        params = sorted(L.reads(part) | L.writes(part))
        checks = any(isinstance(s, L.CheckBounds) for s in L.walk(part))
        signature = [self._param(p) for p in params] + ["int *sg_err", "int64_t sg_step"]
        grid, block = (outputs, BLOCK) if tree is not None else (-(-outputs // BLOCK), BLOCK)
        if outputs == 0:
            grid = 0
        comment = f"{k.root}; grid {grid} x block {block}" + (
            f"; block-tree reduction over {math.prod(v.extent for v in tree.vars)} elements"
            if tree is not None
            else ""
        )
        self.emit(0, f"/* {k.name}: {comment} */")
        self.emit(
            0, f"__global__ void __launch_bounds__({BLOCK}) {name}({', '.join(signature)}) {{"
        )
        self.emit(1, "if (sg_err[0]) return;  /* an earlier check failed: skip the rest */")
        self.emit(1, "(void)sg_step;")
        if tree is not None:
            self.emit(1, "const int64_t sg_gid = blockIdx.x;")
        else:
            self.emit(1, "const int64_t sg_gid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;")
            self.emit(1, f"if (sg_gid >= {outputs}) return;")
        self._decompose("sg_gid", [loop.var for loop in chain], 1)
        if tree is not None:
            self._tree(tree, body[1:], 1)
        else:
            self.stmts(body, 1, parallel_ok=False)
        self.emit(0, "}")
        self.emit(0, "")
        self._atomic = set()
        return Launch(name, params, grid, block, comment, checks)

    def _param(self, name: str) -> str:
        spec = self.program.buffers[name]
        t = self.storage_name(spec.dtype)
        const = "const " if spec.kind in ("input", "const") else ""
        return f"{const}{t} *__restrict__ {name}"

    def _atomic_ok(self, part: tuple[L.Stmt, ...]) -> bool:
        stores = [s for s in L.walk(part) if isinstance(s, L.Store) and s.accumulate]
        return all(
            s.commutative and s.accumulate == "add" and s.value.dtype.name in ATOMIC_DTYPES
            for s in stores
        )

    def _decompose(self, flat: str, variables: list[L.Var], depth: int) -> None:
        """Loop variables from a flat index, the last (innermost) fastest."""
        stride = 1
        for v in reversed(variables):
            self.emit(depth, f"const int64_t {v.name} = ({flat} / {stride}) % {v.extent};")
            stride *= v.extent

    def _tree(self, r: L.Reduce, rest: tuple[L.Stmt, ...], depth: int) -> None:
        """One block per output point: strided partials, then ``sg_block_reduce``."""
        dtype = r.init.dtype
        acc_t = "float" if dtype.name == "float16" else self.type_name(dtype)
        total = math.prod(v.extent for v in r.vars)
        if dtype.name == "float16":
            self._float_acc.add(r.name)
        init = f"({acc_t})({self.expr(r.init)})"
        self.emit(depth, f"{acc_t} {r.name} = {init};")
        self.emit(depth, f"for (int64_t sg_r = threadIdx.x; sg_r < {total}; sg_r += blockDim.x) {{")
        self._decompose("sg_r", list(r.vars), depth + 1)
        value = self.accumuland(r.value)
        if dtype.name == "float16":
            value = f"(float)({value})"
        step = self.binary(r.op, _acc_dtype(dtype), r.name, value)
        self.emit(depth + 1, f"{r.name} = {step};")
        self.emit(depth, "}")
        op = self.binary(r.op, _acc_dtype(dtype), "a", "b")
        self.emit(
            depth, f"auto sg_op = [](const {acc_t} a, const {acc_t} b) {{ return ({acc_t}){op}; }};"
        )
        self.emit(depth, f"{r.name} = sg_block_reduce<{acc_t}>({r.name}, {init}, sg_op);")
        self.emit(depth, "if (threadIdx.x != 0) return;")
        self.stmts(rest, depth, parallel_ok=False)

    def reduce(self, s: L.Reduce, depth: int) -> None:
        """A per-thread reduction; float16 accumulates in float."""
        if s.init.dtype.name != "float16":
            super().reduce(s, depth)
            return
        self._float_acc.add(s.name)
        self.emit(depth, f"float {s.name} = (float)({self.expr(s.init)});")
        for d, v in enumerate(s.vars):
            self.emit(depth + d, f"for (int64_t {v.name} = 0; {v.name} < {v.extent}; ++{v.name})")
        step = self.binary(s.op, _acc_dtype(s.init.dtype), s.name, f"(float)({self.expr(s.value)})")
        self.emit(depth + len(s.vars), f"{s.name} = {step};")

    # -- the host side ----------------------------------------------------------------------


def _acc_dtype(dtype: DType) -> DType:
    from shapegrad.dtypes import float32

    return float32 if dtype.name == "float16" else dtype


def _parts(body: tuple[L.Stmt, ...]) -> list[tuple[L.Stmt, ...]]:
    """Top-level statements grouped into launches: each loop nest, product or check on its
    own; consecutive scalar statements (a full reduction and its store) together."""
    parts: list[tuple[L.Stmt, ...]] = []
    run: list[L.Stmt] = []
    for s in body:
        if isinstance(
            s, L.Loop | L.Contract | L.BatchFused | L.CheckBounds | L.LayerLoop | L.Collective
        ):
            if run:
                parts.append(tuple(run))
                run = []
            parts.append((s,))
        else:
            run.append(s)
    if run:
        parts.append(tuple(run))
    return parts


def _grid_chain(
    part: tuple[L.Stmt, ...], atomic_ok: bool
) -> tuple[list[L.Loop], tuple[L.Stmt, ...]]:
    """The outer loops mapped to threads, and the statements each thread runs."""
    chain: list[L.Loop] = []
    body = part
    while len(body) == 1 and isinstance(body[0], L.Loop):
        loop = body[0]
        if loop.kind != "parallel" and not (atomic_ok and loop.kind == "reduction"):
            break
        chain.append(loop)
        body = loop.body
    if len(part) == 1 and isinstance(part[0], L.CheckBounds):
        check = part[0]
        q = L.Var("sg_q", check.size)
        store = L.Loop(q, "parallel", (check,))
        return [store], (_ThreadCheck(check.buffer, check.n, check.code, q),)
    return chain, body


@dataclass(frozen=True)
class _ThreadCheck(L.Stmt):
    """One thread's share of a CheckBounds (element ``var``)."""

    buffer: str
    n: int
    code: int
    var: L.Var


def _tree_reduce(
    body: tuple[L.Stmt, ...],
    outputs: int,
    min_reduced: int,
    max_outputs: int,
    wide_min_reduced: int,
) -> L.Reduce | None:
    """The Reduce to run as a block tree, when the thread body is ``Reduce; stores``."""
    if not body or not isinstance(body[0], L.Reduce):
        return None
    r = body[0]
    reduced = math.prod(v.extent for v in r.vars)
    if outputs > TREE_WIDE_OUTPUTS:  # many outputs: threads are busy enough on their own
        min_reduced = wide_min_reduced
    if reduced < min_reduced or outputs > max_outputs:
        return None
    if any(isinstance(s, L.Reduce) for s in L.walk(body[1:])):
        return None
    return r


def uses_cublas(program: L.Program) -> bool:
    """Whether ``program`` (or a layer body inside it) has a library product: the launcher
    then declares and links cuBLAS."""
    for k in program.kernels:
        for s in L.walk(k.body):
            if isinstance(s, L.Contract) or (isinstance(s, L.LayerLoop) and uses_cublas(s.body)):
                return True
    return False


def launches_per_step(program: L.Program) -> int:
    """Kernel launches and cuBLAS calls one step of ``program`` enqueues (a layer loop's
    body counted once per layer): the size of the captured CUDA graph."""
    r = CudaRenderer(program)
    for k in program.kernels:
        r.kernel(k)
    return r.launch_count()


def render_cuda_unit(
    program: L.Program, namespace: str | None = None, tree: tuple[int, int] | None = None
) -> str:
    """Device functions and the host launcher of ``program`` (no includes).

    With ``namespace``, everything lives in that C++ namespace and the entry points are
    not ``extern "C"``: many programs can then share one translation unit (the
    compile-only tests build all op-table programs in a few ``nvcc`` runs). ``tree``
    replaces the block-tree thresholds ``(TREE_MIN_REDUCED, TREE_MAX_OUTPUTS)`` (what
    ``benchmarks/cuda_thresholds.py`` varies).
    """
    r = CudaRenderer(program)
    if tree is not None:
        r.tree_min_reduced, r.tree_max_outputs = tree
        r.tree_min_reduced_wide = tree[0]  # one rule for every width when forced
    head = [f"/* shapegrad generated (CUDA): program {comment_safe(program.name)} */"]
    head.append(helpers("static __device__ __forceinline__", INT_MINMAX))
    head.append(BLOCK_REDUCE)
    if uses_cublas(program):
        head.append(CUBLAS_DECL)
    if program.communicators:  # host code: MPI entry points bound after loading
        head.append(
            mpi_prelude(program, shared=False).replace(
                "int sg_mpi_bind(", 'extern "C" int sg_mpi_bind('
            )
        )
    head.append(f"#define SG_NSLOTS {max(program.n_slots, 1)}")
    for k in program.kernels:
        r.kernel(k)
    text = "\n".join([*head, "", *r.lines, *r.host()]) + "\n"
    if namespace is not None:
        text = text.replace('extern "C" int sg_', "int sg_").replace(
            'extern "C" void sg_', "void sg_"
        )
        text = text.replace("#define SG_USES_CUBLAS 1\n", "").replace(
            f"#define SG_NSLOTS {max(program.n_slots, 1)}",
            f"#undef SG_NSLOTS\n#define SG_NSLOTS {max(program.n_slots, 1)}",
        )
        text = f"namespace {namespace} {{\n{text}}}  // namespace {namespace}\n"
    return text


def render_cuda(program: L.Program, tree: tuple[int, int] | None = None) -> str:
    """The full CUDA source of ``program`` (its I/O table numbered)."""
    return INCLUDES + render_cuda_unit(program, tree=tree)
