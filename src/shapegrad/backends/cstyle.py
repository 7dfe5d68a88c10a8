"""The shared C-family renderer: loop IR -> C-like source text, one small rule per node.

:class:`CStyleRenderer` holds what C and CUDA C spell the same way: element type
names (per language, a table), constants, index and scalar expressions (op ->
template tables), and the statements that need no scheduling decision (stores,
scalar reductions, scratch arrays, data-dependent indices, bounds checks). A
language renderer subclasses it and supplies what differs: the type table, how a
loop is threaded (OpenMP pragmas in C, the grid on a GPU), how a failed bounds
check stops the program (the error-flag contract of ``compiler/loops.py``), and
library products (``Contract``, ``BatchFused``) and collectives (``Collective``).

Loops are printed as the IR has them: unrolling and index-set splitting are the
``split_index_sets`` loop stage (``compiler/splitting.py``). A renderer whose target
skips that stage (CUDA, ``split_at_print``) has each loop split by the stage's own
function as it prints it.

Every statement class of the loop IR has a rule here or in the subclass
(``loops.stmt_types()``; a test checks it).
"""

from __future__ import annotations

import math

from shapegrad.backends.sort_text import SortRowText
from shapegrad.compiler import loops as L
from shapegrad.compiler.segments import window_rows
from shapegrad.compiler.splitting import split_loop
from shapegrad.compiler.target import Tuning
from shapegrad.dtypes import DType

# C spellings shared by C and CUDA; a subclass may override entries (CUDA: float16 -> __half).
C_TYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "_Float16",
    "bfloat16": "float",  # computed in float32; stored as 16 bits (STORAGE_TYPES)
    "int32": "int32_t",
    "bool": "uint8_t",
    "int64": "int64_t",  # CUDA C++ has it too (the same type as long long there)
    "uint8": "uint8_t",
}

# How a buffer of each element type is stored, where that differs from how its values are
# computed: bfloat16 is the upper half of a float32 (no portable C type for it).
STORAGE_TYPES = {"bfloat16": "uint16_t"}

# Scalar helpers both languages need (NaN-propagating max/min, NumPy integer division and
# power, the counter-based generator shared with ``ops.reference.random_uniform``);
# ``{q}`` is the function qualifier (``static inline`` in C, ``__device__`` added on GPUs);
# ``{int_minmax}`` the int32 max/min (C_INT_MINMAX in C; CUDA has its own, see
# ``cuda/render.py``). Render with :func:`helpers`.
HELPERS = r"""
{q} float sg_maxf(float a, float b) {{ return (a > b || a != a) ? a : b; }}
{q} float sg_minf(float a, float b) {{ return (a < b || a != a) ? a : b; }}
{q} double sg_maxd(double a, double b) {{ return (a > b || a != a) ? a : b; }}
{q} double sg_mind(double a, double b) {{ return (a < b || a != a) ? a : b; }}
{int_minmax}{q} int32_t sg_idiv(int32_t a, int32_t b) {{
    /* NumPy reference: x / 0 -> x; INT_MIN / -1 wraps (never UB). */
    if (b == 0) return a;
    if (b == -1) return (int32_t)(0u - (uint32_t)a);
    return a / b;
}}
{q} int32_t sg_ipow(int32_t a, int32_t b) {{
    uint32_t r = 1u, base = (uint32_t)a;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) {{ if (b & 1) r *= base; base *= base; b >>= 1; }}
    return (int32_t)r;
}}
{q} int64_t sg_maxl(int64_t a, int64_t b) {{ return a > b ? a : b; }}
{q} int64_t sg_minl(int64_t a, int64_t b) {{ return a < b ? a : b; }}
{q} int64_t sg_ldiv(int64_t a, int64_t b) {{
    /* as sg_idiv, in 64 bits */
    if (b == 0) return a;
    if (b == -1) return (int64_t)(0ull - (uint64_t)a);
    return a / b;
}}
{q} int64_t sg_lpow(int64_t a, int64_t b) {{
    uint64_t r = 1u, base = (uint64_t)a;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) {{ if (b & 1) r *= base; base *= base; b >>= 1; }}
    return (int64_t)r;
}}
{q} float sg_bf2f(uint16_t h) {{
    union {{ uint32_t u; float f; }} v; v.u = (uint32_t)h << 16; return v.f;
}}
{q} uint16_t sg_f2bf(float f) {{
    /* to nearest, ties to even; NaN stays NaN (quiet), as ml_dtypes rounds */
    union {{ uint32_t u; float f; }} v; v.f = f;
    if ((v.u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}}
{q} float sg_bfround(float f) {{ return sg_bf2f(sg_f2bf(f)); }}
{q} double sg_rand(uint32_t counter, uint32_t seed_mix) {{
    uint32_t x = counter + seed_mix;
    x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return (double)(x >> 8) * (1.0 / 16777216.0);
}}
"""

# The int32 max/min as C writes them (``{q}``: the qualifier, as in HELPERS).
C_INT_MINMAX = """\
{q} int32_t sg_maxi(int32_t a, int32_t b) { return a > b ? a : b; }
{q} int32_t sg_mini(int32_t a, int32_t b) { return a < b ? a : b; }
"""


def helpers(qualifier: str, int_minmax: str = C_INT_MINMAX) -> str:
    """The scalar helpers with ``qualifier`` on each function and ``int_minmax`` (a text
    with ``{q}`` where the qualifier goes) as the int32 max/min."""
    return HELPERS.format(q=qualifier, int_minmax=int_minmax.replace("{q}", qualifier))


FLOAT_FUNCTIONS = {
    "exp": "exp",
    "log": "log",
    "sin": "sin",
    "cos": "cos",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "erf": "erf",  # C99 erf/erff; CUDA has both as device functions
    "abs": "fabs",
}
ARITH = {"add": "+", "sub": "-", "mul": "*"}
COMPARE = {"lt": "<", "le": "<=", "eq": "==", "ne": "!="}
MINMAX_SUFFIX = {"float32": "f", "float64": "d", "int32": "i", "bfloat16": "f", "int64": "l"}
# Integer types with a 64-bit helper (``sg_ldiv``, ``sg_lpow``) instead of the int32 one.
WIDE_INT = frozenset({"int64"})
# Element types whose values are float32 in generated code (the f-suffixed functions).
FLOAT32_VALUES = frozenset({"float32", "float16", "bfloat16"})
NOT_ROUNDED = frozenset({*COMPARE, "and"})  # binary ops whose result is not a float


class CStyleRenderer:
    """Renders statements and expressions of one program; subclasses add scheduling.

    Attributes:
        program: the program being rendered.
        tuning: the target's size limits (window rows, blocked sums).
        lines: the output so far.
        split_at_print: split each loop while printing it (for targets that skip the
            ``split_index_sets`` stage); False: print the loops of the IR as they are.
    """

    types = C_TYPES
    indent = "    "
    split_at_print = True

    def __init__(self, program: L.Program, tuning: Tuning | None = None) -> None:
        self.program = program
        self.tuning = tuning if tuning is not None else Tuning()
        self.lines: list[str] = []

    # -- types, constants, indices ---------------------------------------------------------
    def type_name(self, dtype: DType) -> str:
        """This language's spelling of an element type's values."""
        return self.types[dtype.name]

    def storage_name(self, dtype: DType) -> str:
        """This language's spelling of an element type in memory (a buffer's pointer type)."""
        return STORAGE_TYPES.get(dtype.name) or self.types[dtype.name]

    def is_bf16_buffer(self, name: str) -> bool:
        """Whether ``name`` is a program buffer stored as bfloat16 (locals hold floats)."""
        spec = self.program.buffers.get(name)
        return spec is not None and spec.dtype.name == "bfloat16"

    def const(self, c: L.Const) -> str:
        v, dtype = c.value, c.dtype
        if dtype.is_float:
            f = float(v)
            if math.isnan(f):
                text = "NAN"
            elif math.isinf(f):
                text = "INFINITY" if f > 0 else "(-INFINITY)"
            else:
                text = repr(f) + ("f" if dtype.name in ("float32", "bfloat16") else "")
            if dtype.name == "float16":
                return f"(({self.type_name(dtype)}){text})"
            return text if text[0] != "-" else f"({text})"
        if dtype.name == "bool":
            return "1" if v else "0"
        iv = int(v)
        if iv == -(2**31):
            return "(-2147483647 - 1)"
        if iv == -(2**63):
            return "(-9223372036854775807LL - 1)"
        text = str(iv) if -(2**31) < iv < 2**31 else f"{iv}LL"  # a literal beyond int32
        return text if iv >= 0 else f"({text})"

    def affine(self, a: L.Affine) -> str:
        parts = []
        for atom, coef in a.terms:
            text = atom.name if isinstance(atom, L.Var) else self._divmod(atom)
            parts.append(text if coef == 1 else f"{coef} * {text}")
        if a.const or not parts:
            parts.append(str(a.const))
        return " + ".join(parts).replace("+ -", "- ")

    def _divmod(self, atom: L.DivMod) -> str:
        return f"(({self.affine(atom.inner)}) {'%' if atom.is_mod else '/'} {atom.divisor})"

    # -- scalar expressions ------------------------------------------------------------------
    def expr(self, e: L.Expr) -> str:
        """Expression text for a scalar loop-IR expression."""
        if isinstance(e, L.Const):
            return self.const(e)
        if isinstance(e, L.Load):
            if self.is_bf16_buffer(e.buffer):
                return f"sg_bf2f({e.buffer}[{self.affine(e.index)}])"
            return f"{e.buffer}[{self.affine(e.index)}]"
        if isinstance(e, L.Ref):
            return self.rounded(e, e.name)
        if isinstance(e, L.Unary):
            return self.rounded(e, self.unary(e.op, e.dtype, self.expr(e.x)))
        if isinstance(e, L.Binary):
            return self.rounded(e, self.binary(e.op, e.dtype, self.expr(e.a), self.expr(e.b)))
        if isinstance(e, L.Select):
            if e.speculate:  # both arms computed, then picked: gcc blends, the loop vectorizes
                t = self.type_name(e.dtype)
                a, b = self.expr(e.a), self.expr(e.b)
                return f"({{ {t} sg_a = {a}; {t} sg_b = {b}; {self.expr(e.cond)} ? sg_a : sg_b; }})"
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, L.Cast):
            if e.dtype.name == "bool":
                return f"(uint8_t)({self.expr(e.x)} != 0)"
            if e.dtype.name == "bfloat16":
                return f"sg_bfround((float)({self.expr(e.x)}))"
            if e.dtype.name == "uint8" and e.x.dtype.is_float:
                # via int64: an out-of-range float wraps modulo 256 as NumPy's cast does on
                # x86 (a direct float -> uint8_t conversion is undefined in C)
                return f"(uint8_t)(int64_t)({self.expr(e.x)})"
            return f"({self.type_name(e.dtype)})({self.expr(e.x)})"
        if isinstance(e, L.IndexValue):
            return f"(int32_t)({self.affine(e.index)})"
        if isinstance(e, L.InRange):
            x = self.affine(e.index)
            return f"({e.lo} <= ({x}) && ({x}) < {e.hi})"
        if isinstance(e, L.Random):
            mix = (e.seed * 0x9E3779B9) & 0xFFFFFFFF
            counter = self.affine(e.counter)
            sample = f"({self.type_name(e.dtype)})sg_rand((uint32_t)({counter}), {mix}u)"
            return f"sg_bfround({sample})" if e.dtype.name == "bfloat16" else sample
        raise NotImplementedError(f"{type(self).__name__}: no rule for {type(e).__name__}")

    def rounded(self, e: L.Expr, text: str) -> str:
        """A bfloat16 value computed in float, rounded to bfloat16 as eager rounds each op's
        result (comparisons give bool; an accumulator is read rounded, as eager's sum is)."""
        if e.dtype.name != "bfloat16" or (isinstance(e, L.Binary) and e.op in NOT_ROUNDED):
            return text
        return f"sg_bfround({text})"

    def accumuland(self, e: L.Expr) -> str:
        """The value a reduction accumulates: a bfloat16 term is not rounded before the
        float accumulator adds it (eager sums and multiplies bfloat16 in float32)."""
        if e.dtype.name == "bfloat16" and isinstance(e, L.Binary) and e.op not in NOT_ROUNDED:
            return self.binary(e.op, e.dtype, self.expr(e.a), self.expr(e.b))
        if e.dtype.name == "bfloat16" and isinstance(e, L.Unary):
            return self.unary(e.op, e.dtype, self.expr(e.x))
        return self.expr(e)

    def unary(self, op: str, dtype: DType, x: str) -> str:
        if op == "neg":
            if dtype.name == "int64":  # wraps like NumPy (no signed-overflow UB)
                return f"(int64_t)(0ull - (uint64_t)({x}))"
            if dtype.name == "int32":  # -INT_MIN wraps to INT_MIN, as in NumPy
                return f"(int32_t)(0u - (uint32_t)({x}))"
            if dtype.name == "uint8":  # modulo 256
                return f"(uint8_t)(-({x}))"
            return f"(-({x}))"
        if dtype.name == "uint8":  # abs: unsigned values are their own
            return x
        if not dtype.is_float:
            return f"({x} < 0 ? -{x} : {x})" if op == "abs" else x
        suffix = "f" if dtype.name in FLOAT32_VALUES else ""
        fn = FLOAT_FUNCTIONS[op] + suffix
        if dtype.name == "float16":
            return f"(({self.type_name(dtype)}){fn}((float){x}))"
        return f"{fn}({x})"

    def binary(self, op: str, dtype: DType, a: str, b: str) -> str:
        if op in COMPARE:
            return f"(uint8_t)({a} {COMPARE[op]} {b})"
        if op == "and":
            return f"({a} && {b})"
        if op == "add" and dtype.name == "bool":
            return f"(uint8_t)({a} | {b})"
        if op in ARITH:
            if dtype.name == "int32":  # wrap like NumPy instead of signed-overflow UB
                return f"(int32_t)((uint32_t){a} {ARITH[op]} (uint32_t){b})"
            if dtype.name == "int64":
                return f"(int64_t)((uint64_t){a} {ARITH[op]} (uint64_t){b})"
            if dtype.name == "uint8":  # computed in int, wrapped modulo 256 by the cast
                return f"(uint8_t)({a} {ARITH[op]} {b})"
            return f"({a} {ARITH[op]} {b})"
        if op == "div":
            if dtype.is_float:
                return f"({a} / {b})"
            return self._integer(dtype, f"sg_{'l' if dtype.name in WIDE_INT else 'i'}div({a}, {b})")
        if op == "pow":
            if not dtype.is_float:
                return self._integer(
                    dtype, f"sg_{'l' if dtype.name in WIDE_INT else 'i'}pow({a}, {b})"
                )
            if dtype.name == "float16":
                return f"(({self.type_name(dtype)})powf((float){a}, (float){b}))"
            return f"pow{'f' if dtype.name in FLOAT32_VALUES else ''}({a}, {b})"
        if op in ("max", "min"):
            if dtype.name == "bool":
                return f"({a} {'|' if op == 'max' else '&'} {b})"
            if dtype.name == "uint8":
                return f"(uint8_t)sg_{op}i({a}, {b})"
            kind = MINMAX_SUFFIX.get(dtype.name)
            if kind is None:
                return f"(({self.type_name(dtype)})sg_{op}f((float){a}, (float){b}))"
            return f"sg_{op}{kind}({a}, {b})"
        raise NotImplementedError(f"{type(self).__name__}: binary {op}")

    def _integer(self, dtype: DType, call: str) -> str:
        """An int32/int64 helper's result in ``dtype`` (uint8 values go through int32 and
        come back modulo 256, as NumPy's uint8 arithmetic wraps)."""
        return f"(uint8_t){call}" if dtype.name == "uint8" else call

    # -- statements ---------------------------------------------------------------------------
    def emit(self, depth: int, text: str) -> None:
        self.lines.append(self.indent * depth + text)

    def stmts(self, body: tuple[L.Stmt, ...], depth: int, parallel_ok: bool) -> None:
        for s in body:
            self.stmt(s, depth, parallel_ok)

    def stmt(self, s: L.Stmt, depth: int, parallel_ok: bool) -> None:
        """One statement; ``parallel_ok`` says whether the renderer may still split a loop."""
        if isinstance(s, L.Loop):
            self.loop(s, depth, parallel_ok)
        elif isinstance(s, L.Block):
            self.block(s, depth)
        elif isinstance(s, L.Store):
            self.emit(depth, self.store(s))
        elif isinstance(s, L.Reduce):
            self.reduce(s, depth)
        elif isinstance(s, L.Local):
            self.emit(depth, f"{self.type_name(s.dtype)} {s.name}[{s.size}];")
        elif isinstance(s, L.IndexLoad):
            v = s.var.name
            self.emit(depth, f"int64_t {v} = {s.buffer}[{self.affine(s.index)}];")
            self.emit(depth, f"if ({v} < 0) {v} += {s.var.extent};")
        elif isinstance(s, L.CheckBounds):
            self.check_bounds(s, depth)
        elif isinstance(s, L.Contract):
            self.contract(s, depth)
        elif isinstance(s, L.BatchFused):
            self.batch_fused(s, depth)
        elif isinstance(s, L.Collective):
            self.collective(s, depth)
        elif isinstance(s, L.LayerLoop):
            self.layer_loop(s, depth)
        elif isinstance(s, L.SortRow):
            SortRowText(self, s).emit(depth)
        else:
            raise NotImplementedError(f"{type(self).__name__}: statement {type(s).__name__}")

    def loop(self, s: L.Loop, depth: int, parallel_ok: bool) -> None:
        """A serial loop as the IR has it (a pooling window as a row of accumulators,
        ``window_rows``); split first when ``split_at_print``."""
        if self.split_at_print:
            for part in split_loop(s, self.tuning):
                self._print(part, depth)
            return
        if (window := window_rows(s, self.tuning)) is not None:
            self.window_row(s, window, depth)
            return
        self.emit(depth, self.for_header(s))
        self.stmts(s.body, depth + 1, parallel_ok)
        self.emit(depth, "}")

    def _print(self, s: L.Stmt, depth: int) -> None:
        """A statement of an already split loop: its loops and copies printed, not split."""
        if isinstance(s, L.Loop):
            if (window := window_rows(s, self.tuning)) is not None:
                self.window_row(s, window, depth)
                return
            self.emit(depth, self.for_header(s))
            for x in s.body:
                self._print(x, depth + 1)
            self.emit(depth, "}")
        elif isinstance(s, L.Block):
            self.emit(depth, f"{{ /* {s.note} */")
            for x in s.body:
                self._print(x, depth + 1)
            self.emit(depth, "}")
        else:
            self.stmt(s, depth, False)

    def for_header(self, s: L.Loop) -> str:
        """``for (...) {`` over the loop's range."""
        v = s.var.name
        return f"for (int64_t {v} = {s.start}; {v} < {s.end}; ++{v}) {{"

    def block(self, s: L.Block, depth: int) -> None:
        """One copy of an unrolled or div-split loop's body (nothing in it is threaded)."""
        self.emit(depth, f"{{ /* {s.note} */")
        self.stmts(s.body, depth + 1, False)
        self.emit(depth, "}")

    def window_row(self, s: L.Loop, r: L.Reduce, depth: int) -> None:
        """``for v: acc = reduce(window); store`` as a row of accumulators (``window_rows``):
        the loop over outputs becomes the inner loop, which vectorizes."""
        v, n, t = s.var.name, s.var.extent, self.type_name(r.init.dtype)
        row = f"{r.name}_row"
        e = self.emit
        e(depth, "{")
        e(depth + 1, f"{t} {row}[{n}];")
        e(depth + 1, f"for (int64_t {v} = 0; {v} < {n}; ++{v}) {row}[{v}] = {self.expr(r.init)};")
        d = depth + 1
        for w in r.vars:
            e(d, f"for (int64_t {w.name} = 0; {w.name} < {w.extent}; ++{w.name})")
            d += 1
        step = self.binary(r.op, r.value.dtype, f"{row}[{v}]", self.expr(r.value))
        e(d, f"for (int64_t {v} = 0; {v} < {n}; ++{v}) {row}[{v}] = {step};")
        e(depth + 1, f"for (int64_t {v} = 0; {v} < {n}; ++{v}) {{")
        e(depth + 2, f"{t} {r.name} = {row}[{v}];")
        store = s.body[1]
        assert isinstance(store, L.Store)
        e(depth + 2, self.store(store))
        e(depth + 1, "}")
        e(depth, "}")

    def store(self, s: L.Store) -> str:
        target = f"{s.buffer}[{self.affine(s.index)}]"
        value = self.expr(s.value)
        if self.is_bf16_buffer(s.buffer):  # computed in float, rounded once on the way out
            if s.accumulate is not None:
                value = self.binary(s.accumulate, s.value.dtype, f"sg_bf2f({target})", value)
            return f"{target} = sg_f2bf({value});"
        if s.accumulate is None:
            return f"{target} = {value};"
        dtype = s.value.dtype
        return f"{target} = {self.binary(s.accumulate, dtype, target, value)};"

    def reduce(self, s: L.Reduce, depth: int) -> None:
        """In order, one thread: ``acc = init; for ...: acc = op(acc, value)``.

        A long float sum is accumulated in blocks (two levels, like NumPy's pairwise sums):
        one accumulator saturates (2**28 float32 ones summed one by one give 2**24 per
        vector lane) and its rounding error grows with the count; see :func:`sum_blocks`.
        """
        split = sum_blocks(s, self.tuning)
        if split is not None:
            self.blocked_sum(s, depth, *split)
            return
        self.emit(depth, f"{self.type_name(s.init.dtype)} {s.name} = {self.expr(s.init)};")
        for d, v in enumerate(s.vars):
            self.emit(depth + d, f"for (int64_t {v.name} = 0; {v.name} < {v.extent}; ++{v.name})")
        step = self.binary(s.op, s.value.dtype, s.name, self.accumuland(s.value))
        self.emit(depth + len(s.vars), f"{s.name} = {step};")

    def blocked_sum(self, s: L.Reduce, depth: int, j: int, chunk: int) -> None:
        """``vars[j]`` split into chunks of ``chunk``: each chunk (times the inner vars) is
        summed into a fresh partial of the value's type (a loop the compiler vectorizes),
        and the partials into a double accumulator."""
        ctype = self.type_name(s.init.dtype)
        wide, part, block = f"{s.name}_wide", f"{s.name}_part", f"{s.name}_blk"
        self.emit(depth, f"{ctype} {s.name};")
        self.emit(depth, "{")
        d = depth + 1
        self.emit(d, f"double {wide} = (double)({self.expr(s.init)});")
        for v in s.vars[:j]:
            self.emit(d, f"for (int64_t {v.name} = 0; {v.name} < {v.extent}; ++{v.name})")
            d += 1
        vj = s.vars[j]
        self.emit(d, f"for (int64_t {block} = 0; {block} < {vj.extent}; {block} += {chunk}) {{")
        self.emit(d + 1, f"{ctype} {part} = {self.expr(L.Const(s.init.dtype, 0.0))};")
        end = f"({block} + {chunk} < {vj.extent} ? {block} + {chunk} : {vj.extent})"
        self.emit(d + 1, f"for (int64_t {vj.name} = {block}; {vj.name} < {end}; ++{vj.name})")
        inner = d + 2
        for v in s.vars[j + 1 :]:
            self.emit(inner, f"for (int64_t {v.name} = 0; {v.name} < {v.extent}; ++{v.name})")
            inner += 1
        self.emit(
            inner, f"{part} = {self.binary('add', s.value.dtype, part, self.accumuland(s.value))};"
        )
        self.emit(d + 1, f"{wide} += (double){part};")
        self.emit(d, "}")
        self.emit(depth + 1, f"{s.name} = ({ctype}){wide};")
        self.emit(depth, "}")

    def check_bounds(self, s: L.CheckBounds, depth: int) -> None:
        self.emit(depth, f"for (int64_t q = 0; q < {s.size}; ++q)")
        self.emit(depth + 1, f"if ({s.buffer}[q] < -{s.n} || {s.buffer}[q] >= {s.n}) {{")
        self.emit(depth + 2, self.fail(s.code))
        self.emit(depth + 1, "}")

    # -- what each language supplies ------------------------------------------------------------
    def fail(self, code: int) -> str:
        """The statement that records error ``code`` and skips the rest of the program."""
        raise NotImplementedError(f"{type(self).__name__}: no error-flag rule")

    def contract(self, s: L.Contract, depth: int) -> None:
        raise NotImplementedError(f"{type(self).__name__}: no rule for library products")

    def batch_fused(self, s: L.BatchFused, depth: int) -> None:
        raise NotImplementedError(f"{type(self).__name__}: no rule for batch-fused products")

    def collective(self, s: L.Collective, depth: int) -> None:
        raise NotImplementedError(f"{type(self).__name__}: no rule for collectives")

    def layer_loop(self, s: L.LayerLoop, depth: int) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}: layer loops (sg.scan / sg.checkpoint) are not supported by "
            "this backend yet; use backend='c' or 'numpy'"
        )


def sum_blocks(s: L.Reduce, tuning: Tuning) -> tuple[int, int] | None:
    """``(j, chunk)``: how to block a long float sum, or None to keep one accumulator.

    A block (``chunk`` iterations of ``vars[j]`` times all inner vars) holds about
    ``tuning.sum_block`` terms, summed in the value's type; the partials go to a double,
    so the error is that of a ``sum_block``-term sum, not an ``n``-term one. ``vars[j]``
    is the outermost var whose inner product still fits in one block. Sums shorter than
    ``tuning.blocked_sum_min`` keep one accumulator.
    """
    n = math.prod(v.extent for v in s.vars)
    if s.op != "add" or not s.value.dtype.is_float or n < tuning.blocked_sum_min:
        return None
    block = tuning.sum_block
    inner = 1
    for j in range(len(s.vars) - 1, -1, -1):
        extent = s.vars[j].extent
        if inner * extent > block:
            return j, max(1, block // inner)
        inner *= extent
    return None
