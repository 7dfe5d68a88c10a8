"""Memory planning: in-place state updates and one arena for all intermediates.

Two loop stages (see ``compiler/pipeline.py``):

* ``place_state_updates``: an output that is the new value of an input
  (``Graph.aliases``, e.g. a parameter or an optimizer moment) is written
  straight into that input's persistent buffer when it is safe: its kernel is
  scheduled after every other reader of the old value, and reads the old value
  only at the element it writes. Otherwise the new value goes to a temp and a
  copy kernel at the end of the program moves it over.
* ``pack_arena``: temps get byte offsets in one arena; two temps share bytes
  when their live ranges (first writer .. last reader, in kernel order) are
  disjoint. First-fit by definition order, aligned to the target's ``alignment``.
"""

from __future__ import annotations

from dataclasses import replace

from shapegrad.compiler import loops as L


def buffers_read(kernel: L.Kernel) -> set[str]:
    """Buffers a kernel reads (see ``loops.reads``)."""
    return L.reads(kernel.body)


def buffers_written(kernel: L.Kernel) -> set[str]:
    """Buffers a kernel writes (see ``loops.writes``)."""
    return L.writes(kernel.body)


def place_state_updates(program: L.Program) -> L.Program:
    """Redirect aliased outputs into their state buffers (see module docstring)."""
    sources = {program.outputs[k] for k in program.state_of_output}
    program.kernels = _sinks_last(program.kernels, sources)
    # Read/write sets once per kernel; renames below update them in place.
    access = [(buffers_read(k), buffers_written(k)) for k in program.kernels]
    claimed: set[str] = set()
    copies: list[L.Kernel] = []
    for k, i in sorted(program.state_of_output.items()):
        src, state = program.outputs[k], program.inputs[i]
        program.outputs[k] = state
        if src == state:
            continue
        if src not in claimed and _can_write_in_place(program, access, src, state):
            _merge_buffer(program, access, src, state)
            program.outputs = [state if b == src else b for b in program.outputs]
            claimed.add(state)
            continue
        claimed.add(src)
        copies.append(_copy_kernel(program, src, state, len(program.kernels) + len(copies)))
    program.kernels.extend(copies)
    return program


def _sinks_last(kernels: list[L.Kernel], sources: set[str]) -> list[L.Kernel]:
    """Move kernels that only produce state updates nobody reads to the end (stable)."""
    access = [(buffers_read(k), buffers_written(k)) for k in kernels]
    readers: dict[str, int] = {}
    for read, written in access:
        for name in read - written:
            readers[name] = readers.get(name, 0) + 1
    keep: list[L.Kernel] = []
    sinks: list[L.Kernel] = []
    for kernel, (_, written) in zip(kernels, access, strict=True):
        is_sink = bool(written) and written <= sources and not any(readers.get(w) for w in written)
        (sinks if is_sink else keep).append(kernel)
    return keep + sinks


def _can_write_in_place(
    program: L.Program, access: list[tuple[set[str], set[str]]], src: str, state: str
) -> bool:
    spec = program.buffers.get(src)
    if spec is None or spec.kind != "temp":
        return False
    writers = [n for n, (_, written) in enumerate(access) if src in written]
    if len(writers) != 1:
        return False
    w = writers[0]
    if any(state in read for read, _ in access[w + 1 :]):
        return False
    kernel = program.kernels[w]
    statements = list(L.walk(kernel.body))
    stores = [s for s in statements if isinstance(s, L.Store) and s.buffer == src]
    # Exactly one plain store per element: the old value is read, then overwritten once.
    if len(stores) != 1 or stores[0].accumulate:
        return False
    for s in statements:
        if isinstance(s, L.IndexLoad) or (
            isinstance(s, L.Contract) and {s.a, s.b, s.c} & {src, state} and not _updates(s, src)
        ):
            return False
    index = stores[0].index
    return all(ld.index == index for ld in L.loads_in(kernel.body) if ld.buffer == state)


def _updates(s: L.Contract, src: str) -> bool:
    """A library call accumulating into ``src`` (after ``src = state`` in the same kernel)."""
    return s.c == src and s.beta != 0.0 and src not in (s.a, s.b)


def _rename(
    program: L.Program, access: list[tuple[set[str], set[str]]], old: str, new: str
) -> None:
    """Rename ``old`` to ``new`` in the kernels that use it (``access``: their read/write
    sets, aligned with ``program.kernels``); the others are left untouched (no rebuild)."""

    def fix(name: str) -> str:
        return new if name == old else name

    for kernel, (read, written) in zip(program.kernels, access, strict=True):
        if old not in read and old not in written:
            continue
        body = L.rename_buffers(kernel.body, fix)
        kernel.body = tuple(s for s in body if not _is_self_copy(s))


def _merge_buffer(
    program: L.Program, access: list[tuple[set[str], set[str]]], old: str, new: str
) -> None:
    """``old``'s kernels use ``new`` instead (``_rename``), ``access`` says so, and ``old``
    is no longer a buffer of the program."""
    _rename(program, access, old, new)
    for sets in access:
        for names in sets:
            if old in names:
                names.discard(old)
                names.add(new)
    del program.buffers[old]


def _is_self_copy(s: L.Stmt) -> bool:
    """A loop nest whose only effect is ``x[i] = x[i]`` (left by an in-place update)."""
    while isinstance(s, L.Loop) and len(s.body) == 1:
        s = s.body[0]
    return (
        isinstance(s, L.Store)
        and s.accumulate is None
        and isinstance(s.value, L.Load)
        and s.value.buffer == s.buffer
        and s.value.index == s.index
    )


def _copy_kernel(program: L.Program, src: str, dst: str, number: int) -> L.Kernel:
    spec = program.buffers[src]
    v = L.Var(f"c{number}", spec.size)
    store = L.Store(dst, L.var(v), L.Load(spec.dtype, src, L.var(v)))
    return L.Kernel(f"k{number}", (L.Loop(v, "parallel", (store,)),), spec.size, f"copy {src}")


def forward_output_copies(program: L.Program) -> L.Program:
    """Drop each kernel that only copies a whole temp into a program output (an output
    that is a reshape of a value another kernel writes: a layer-loop residual stored in
    the layout its reader wants): the temp's writers write the output buffer instead and
    its readers read it there. Only when no other kernel writes the output and the output
    is no state (state updates have their own rule, ``place_state_updates``)."""
    state = {program.outputs[k] for k in program.state_of_output}
    access = [(buffers_read(k), buffers_written(k)) for k in program.kernels]
    dropped: set[int] = set()
    for n, kernel in enumerate(program.kernels):
        pair = _whole_copy(kernel, program)
        if pair is None:
            continue
        src, dst = pair
        if dst in state or program.outputs.count(dst) != 1 or dst in program.inputs:
            continue
        if program.buffers[src].kind != "temp":
            continue
        others = [w for m, (_, w) in enumerate(access) if m != n and m not in dropped]
        if any(dst in w for w in others):  # its readers come after the copy: they stay
            continue
        dropped.add(n)
        _merge_buffer(program, access, src, dst)
    program.kernels = [k for m, k in enumerate(program.kernels) if m not in dropped]
    return program


def _whole_copy(kernel: L.Kernel, program: L.Program) -> tuple[str, str] | None:
    """(src, dst) when ``kernel`` is one perfect loop nest ``dst[i] = src[i]`` visiting
    every element of two buffers of one size and dtype once, in row-major order."""
    if len(kernel.body) != 1:
        return None
    s, nest = kernel.body[0], []
    while isinstance(s, L.Loop) and len(s.body) == 1 and s.start == 0 and s.end == s.var.extent:
        nest.append(s.var)
        s = s.body[0]
    if not nest or not isinstance(s, L.Store) or s.accumulate is not None:
        return None
    if not isinstance(s.value, L.Load) or s.value.index != s.index:
        return None
    src, dst = s.value.buffer, s.buffer
    a, b = program.buffers.get(src), program.buffers.get(dst)
    if src == dst or a is None or b is None or (a.size, a.dtype) != (b.size, b.dtype):
        return None
    row_major, stride = L.const(0), 1
    for v in reversed(nest):
        row_major = row_major + L.var(v) * stride
        stride *= v.extent
    return (src, dst) if stride == a.size and s.index == row_major else None


def schedule_outputs_early(program: L.Program) -> L.Program:
    """Move each kernel that writes only (non-state) outputs to just after the last earlier
    kernel it depends on. Graph order can put such a kernel far from its operands (all the
    gradients of a model come out after the whole backward pass), keeping every temp it
    reads alive until then; right after its producers those temps die early. Only true
    dependencies bound the move (temps have no arena offsets yet, so no false sharing)."""
    state = {program.outputs[k] for k in program.state_of_output}
    outputs = set(program.outputs) - state
    placed: list[tuple[L.Kernel, set[str], set[str]]] = []
    for kernel in program.kernels:
        read, written = buffers_read(kernel), buffers_written(kernel)
        position = len(placed)
        if written and written <= outputs and not (read & written):
            position = 0
            for i, (_, r, w) in enumerate(placed):
                if w & (read | written) or r & written:
                    position = i + 1
        placed.insert(position, (kernel, read, written))
    program.kernels = [k for k, _, _ in placed]
    return program


def pack_arena(program: L.Program, alignment: int = 64) -> L.Program:
    """Assign arena offsets to temps by liveness; sets ``program.arena_bytes``."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for n, kernel in enumerate(program.kernels):
        for name in buffers_read(kernel) | buffers_written(kernel):
            first.setdefault(name, n)
            last[name] = n
    placed: list[tuple[int, int, int, int]] = []  # (offset, nbytes, first, last)
    top = 0
    temps = [b for b in program.buffers.values() if b.kind == "temp"]
    temps.sort(key=lambda b: (first.get(b.name, -1), b.name))
    for spec in temps:
        nbytes = _round(spec.size * spec.dtype.numpy.itemsize, alignment)
        lo, hi = first.get(spec.name, 0), last.get(spec.name, 0)
        offset = 0
        for o, size, f, la in sorted(placed):
            overlaps_time = not (la < lo or hi < f)
            if overlaps_time and o < offset + nbytes and offset < o + size:
                offset = _round(o + size, alignment)
        placed.append((offset, nbytes, lo, hi))
        top = max(top, offset + nbytes)
        program.buffers[spec.name] = replace(spec, offset=offset)
    program.arena_bytes = top
    return program


def _round(n: int, alignment: int) -> int:
    return max(alignment, (n + alignment - 1) // alignment * alignment)
