"""The CUDA launcher's host side: what ``sg_enqueue_steps`` runs for one step.

Kernels are enqueued on one stream; products are ``cublasGemmStridedBatchedEx`` calls
(row-major operands passed as their column-major transposes: ``C^T = B^T A^T``; half and
bfloat16 on tensor cores with float accumulation); a layer loop calls the body's host
function ``sg_layerN`` once per layer with the body's I/O table at that layer's slices;
a collective waits for the stream and exchanges host copies over MPI
(``backends/c/collectives.py``). ``sg_graph_build`` captures a K-step sequence as a
CUDA graph and ``sg_graph_launch`` replays it. :class:`HostLauncher` is the part of
:class:`~shapegrad.backends.cuda.render.CudaRenderer` that writes this code; the device
functions are the renderer's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shapegrad.backends.c.collectives import render_collective
from shapegrad.backends.cstyle import CStyleRenderer
from shapegrad.compiler import loops as L

# The cuBLAS entry points we call (declared here: the toolkit may ship no cuBLAS headers;
# the library comes from NVIDIA's cuBLAS wheel). Enum values are cuBLAS's.
CUBLAS_DECL = r"""
#define SG_USES_CUBLAS 1
extern "C" int cublasCreate_v2(void **handle);
extern "C" int cublasSetStream_v2(void *handle, cudaStream_t stream);
extern "C" int cublasGemmStridedBatchedEx(void *handle, int transa, int transb, int m, int n,
    int k, const void *alpha, const void *A, int Atype, int lda, long long strideA,
    const void *B, int Btype, int ldb, long long strideB, const void *beta, void *C, int Ctype,
    int ldc, long long strideC, int batchCount, int computeType, int algo);
"""
# cudaDataType: CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF; half and bfloat16
# products run on tensor cores and accumulate in float (CUBLAS_COMPUTE_32F = 68).
CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
COMPUTE = {"float32": 68, "float64": 70, "float16": 68, "bfloat16": 68}  # _COMPUTE_32F / _64F


@dataclass
class Launch:
    """One ``__global__`` function and how the host launches it."""

    name: str
    params: list[str]  # buffer names, in parameter order
    grid: int
    block: int
    comment: str
    checks: bool = False  # a bounds-check kernel: takes the step index


@dataclass
class LayerCall:
    """A layer loop's host side: the body's host function, called once per layer."""

    function: str  # sg_layerN
    loop: L.LayerLoop
    moves: list[Launch]  # the ``after`` statements' launches (enclosing program)
    body_launches: int  # launches and cuBLAS calls of one layer


class HostLauncher(CStyleRenderer):
    """The host code of a CUDA program (see the module docstring).

    A layer body's renderer shares its parent's list of host functions (nested bodies
    first); its I/O table is its host function's ``io`` argument, the step's is ``local``.
    """

    def __init__(self, program: L.Program, parent: HostLauncher | None = None) -> None:
        super().__init__(program)
        # (kernel name, what): a launch, a cuBLAS call, a layer loop or an MPI exchange
        self.launches: list[tuple[str, Launch | L.Contract | LayerCall | L.Collective]] = []
        self.collective_functions: list[str] = []
        self._collective_numbers: dict[int, int] = {}
        self.layer_functions: list[str] = parent.layer_functions if parent is not None else []
        self._io = "io" if parent is not None else "local"

    def launch_lines(self, depth: int) -> list[str]:
        """Host statements enqueueing this program's launches for one step ``t`` (I/O table
        ``self._io``, arena ``arena``, stream ``stream``, cuBLAS handle ``blas``)."""
        out: list[str] = []
        pad = self.indent * depth
        for kernel_name, what in self.launches:
            if isinstance(what, L.Contract):
                out.extend(f"{pad}{line}" for line in self._gemm(kernel_name, what))
            elif isinstance(what, LayerCall):
                out.extend(f"{pad}{line}" for line in self._layer_loop_lines(kernel_name, what))
            elif isinstance(what, L.Collective):
                out.extend(f"{pad}{line}" for line in self._collective_lines(kernel_name, what))
            else:
                out.extend(f"{pad}{line}" for line in self._launch(kernel_name, what))
        return out

    def _launch(self, kernel_name: str, what: Launch) -> list[str]:
        if what.grid == 0:
            return []  # an empty index space: nothing to launch
        args = ", ".join(f"({self._cast(p)}){self._address(p)}" for p in what.params)
        sep = ", " if args else ""
        return [
            f"/* {kernel_name}: {what.comment} */",
            f"{what.name}<<<{what.grid}, {what.block}, 0, stream>>>({args}{sep}sg_err, t);",
        ]

    def _layer_loop_lines(self, kernel_name: str, call: LayerCall) -> list[str]:
        """``for layer``: the body's I/O table at the layer's slices, the body's launches
        (``sg_layerN``), then the carry moves. Under graph capture this records
        ``length`` copies of the body: the graph holds them, the source does not."""
        s = call.loop
        layer = f"{s.length - 1} - sg_i" if s.reverse else "sg_i"
        lines = [
            f"/* {kernel_name}: layer loop {comment_safe(s.body.name)}, {s.length} layers */",
            "{",
            f"    void *sg_sub[{max(len(s.slots), 1)}];",
            f"    for (int64_t sg_i = 0; sg_i < {s.length}; ++sg_i) {{",
            f"        const int64_t layer = {layer};",
        ]
        for number, slot in enumerate(s.slots):  # byte offsets: right for every storage type
            size = self.program.buffers[slot.buffer].dtype.numpy.itemsize
            base = f"(char *){self._address(slot.buffer)}"
            lines.append(
                f"        sg_sub[{number}] = (void *)({base} + {slot.offset * size} + "
                f"{slot.stride * size} * layer);"
            )
        lines += [
            f"        int sg_rc = {call.function}(sg_sub, (char *){self._address(s.arena)}, "
            "sg_err, stream, blas, t);",
            "        if (sg_rc) return sg_rc;",
        ]
        for move in call.moves:
            lines.extend(f"        {line}" for line in self._launch(kernel_name, move))
        lines += ["    }", "}"]
        return lines

    # -- collectives: MPI on host copies (the exchange itself is backends/c/collectives.py's) --
    def collective_function(self, s: L.Collective) -> None:
        """``static int sg_collN(src, dst)``: the MPI call of ``s`` on host buffers."""
        t = self.storage_name(s.dtype)
        lines: list[str] = []
        staged = dataclasses.replace(s, src="src", dst="dst")
        render_collective(staged, t, lambda depth, text: lines.append("    " * depth + text), 1)
        number = len(self.collective_functions)
        self.collective_functions.append(
            "\n".join(
                [
                    f"static int sg_coll{number}({t} *src, {t} *dst) {{",
                    "    (void)src; (void)dst;",
                    *lines,
                    "    return 0;",
                    "}",
                    "",
                ]
            )
        )
        self._collective_numbers[id(s)] = number

    def _collective_lines(self, kernel_name: str, s: L.Collective) -> list[str]:
        """Wait for the stream, copy ``src`` to the host, exchange over MPI, copy the result
        back. A failed exchange records its error code and step in ``sg_err`` and ends the
        call (the error-flag contract: the steps before it completed). Not capturable in a
        CUDA graph: a bound step of a program with collectives enqueues its kernels per
        call (see ``executable.py``)."""
        size = self.program.communicators[s.comm].size
        item = s.dtype.numpy.itemsize
        count_in = s.count * (size if s.kind == "reduce_scatter" else 1)
        count_out = s.count * (size if s.kind == "all_gather" else 1)
        t = self.storage_name(s.dtype)
        number = self._collective_numbers[id(s)]
        return [
            f"/* {kernel_name}: {s.kind} over MPI ({count_in} -> {count_out} x {s.dtype}), "
            "staged through host memory */",
            "{",
            "    int sg_rc = (int)cudaStreamSynchronize(stream);",
            "    if (sg_rc) return sg_rc;",
            f"    {t} *sg_h = ({t} *)malloc({(count_in + count_out) * item + 1});",
            "    if (!sg_h) return (int)cudaErrorMemoryAllocation;",
            f"    sg_rc = (int)cudaMemcpy(sg_h, {self._address(s.src)}, {count_in * item}, "
            "cudaMemcpyDeviceToHost);",
            f"    int sg_code = sg_rc ? 0 : sg_coll{number}(sg_h, sg_h + {count_in});",
            "    if (!sg_rc && !sg_code)",
            f"        sg_rc = (int)cudaMemcpy({self._address(s.dst)}, sg_h + {count_in}, "
            f"{count_out * item}, cudaMemcpyHostToDevice);",
            "    free(sg_h);",
            "    if (sg_rc) return sg_rc;",
            "    if (sg_code) {",
            "        int sg_flag[2] = {sg_code, (int)t};",
            "        cudaMemcpy(sg_err, sg_flag, sizeof sg_flag, cudaMemcpyHostToDevice);",
            "        return 0;",
            "    }",
            "}",
        ]

    def launch_count(self) -> int:
        """Kernel launches and cuBLAS calls of one step (layer bodies counted per layer)."""
        total = 0
        for _, what in self.launches:
            if isinstance(what, L.Contract):
                total += what.sum_batch
            elif isinstance(what, LayerCall):
                moves = sum(1 for m in what.moves if m.grid)
                total += what.loop.length * (what.body_launches + moves)
            elif isinstance(what, L.Collective):
                continue  # a host exchange between launches, not a launch
            else:
                total += 1 if what.grid else 0
        return total

    def host(self) -> list[str]:
        """The layer functions, ``sg_enqueue_steps``, graph capture and replay, cuBLAS."""
        # layer functions are declared first: a body may call a nested body defined after it
        declarations = [
            f"static int sg_layer{n}(void **io, char *arena, int *sg_err, cudaStream_t stream, "
            "void *blas, int64_t t);"
            for n in range(len(self.layer_functions))
        ]
        out = [
            *declarations,
            *([""] if declarations else []),
            *self.collective_functions,
            *self.layer_functions,
            'extern "C" int sg_enqueue_steps(void **io, char *arena, int *sg_err, void *stream_,',
            "                                void *blas, int64_t k, const int64_t *step) {",
            "    cudaStream_t stream = (cudaStream_t)stream_;",
            "    void *local[SG_NSLOTS + 1];",
            "    (void)blas; (void)local;",
            "    cudaMemsetAsync(sg_err, 0, 2 * sizeof(int), stream);",
            "    for (int64_t t = 0; t < k; ++t) {",
            "        for (int s = 0; s < SG_NSLOTS; ++s) local[s] = (char *)io[s] + t * step[s];",
            *self.launch_lines(2),
        ]
        out += [
            "    }",
            "    return (int)cudaGetLastError();",
            "}",
            "",
            'extern "C" int sg_graph_build(void **io, char *arena, int *sg_err, void *stream_,',
            "                              void *blas, int64_t k, const int64_t *step, void **exec) {",
            "    cudaStream_t stream = (cudaStream_t)stream_;",
            "    cudaGraph_t graph;",
            "    int rc = (int)cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);",
            "    if (rc) return rc;",
            "    rc = sg_enqueue_steps(io, arena, sg_err, stream_, blas, k, step);",
            "    int end = (int)cudaStreamEndCapture(stream, &graph);",
            "    if (rc) return rc;",
            "    if (end) return end;",
            "    rc = (int)cudaGraphInstantiate((cudaGraphExec_t *)exec, graph, 0ULL);",
            "    cudaGraphDestroy(graph);",
            "    return rc;",
            "}",
            "",
            'extern "C" int sg_graph_launch(void *exec, void *stream) {',
            "    return (int)cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);",
            "}",
            "",
            'extern "C" void sg_graph_free(void *exec) { cudaGraphExecDestroy((cudaGraphExec_t)exec); }',
            "",
            'extern "C" int sg_blas_create(void **handle) {',
            "#ifdef SG_USES_CUBLAS",
            "    return cublasCreate_v2(handle);",
            "#else",
            "    *handle = 0;",
            "    return 0;",
            "#endif",
            "}",
        ]
        return out

    def _cast(self, name: str) -> str:
        spec = self.program.buffers[name]
        const = "const " if spec.kind in ("input", "const") else ""
        return f"{const}{self.storage_name(spec.dtype)} *"

    def _address(self, name: str) -> str:
        spec = self.program.buffers[name]
        return f"(arena + {spec.offset})" if spec.kind == "temp" else f"{self._io}[{spec.slot}]"

    def _gemm(self, kernel_name: str, s: L.Contract) -> list[str]:
        """``C = alpha * op(A) op(B) + beta * C`` per batch, as ``C^T = op(B)^T op(A)^T``."""
        if s.alpha_buffer is not None:
            raise NotImplementedError("CUDA: a run-time product scale needs runtime_alpha=False")
        if not s.plain_batch:
            raise NotImplementedError("CUDA: a two-level batch needs strided_batches=False")
        t = self.storage_name(s.dtype)
        scalar = "double" if s.dtype.name == "float64" else "float"
        dt, ct = CUDA_R[s.dtype.name], COMPUTE[s.dtype.name]
        a = f"(const {t} *){self._address(s.a)} + {s.offset_a}"
        b = f"(const {t} *){self._address(s.b)} + {s.offset_b}"
        c = f"({t} *){self._address(s.c)}"
        lines = [
            f"/* {kernel_name}: cuBLAS {s.m}x{s.n}x{s.k}, batch {s.batch}, summed {s.sum_batch} */",
            "{",
            "    cublasSetStream_v2(blas, stream);",
            f"    const {scalar} sg_alpha = ({scalar}){s.alpha!r}, sg_one = 1, sg_beta = ({scalar}){s.beta!r};",
            f"    for (int64_t si = 0; si < {s.sum_batch}; ++si) {{",
            "        int rc = cublasGemmStridedBatchedEx(blas, "
            f"{1 if s.trans_b else 0}, {1 if s.trans_a else 0}, {s.n}, {s.m}, {s.k}, &sg_alpha, "
            f"{b} + si * {s.sum_stride_b}, {dt}, {s.ldb}, {s.stride_b}, "
            f"{a} + si * {s.sum_stride_a}, {dt}, {s.lda}, {s.stride_a}, "
            f"si ? &sg_one : &sg_beta, {c}, {dt}, {s.n}, {s.stride_c}, {s.batch}, {ct}, -1);",
            "        if (rc) return 1000 + rc;",
            "    }",
            "}",
        ]
        return lines


def comment_safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_.-<> " else "_" for ch in text)
