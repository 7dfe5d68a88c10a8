"""Produce a batched product's operand one batch slice at a time (``BatchFused``).

A convolution lowers to ``patches = concat(slices of pad(x))`` (im2col) followed by a
batched product over the images. Materialized, the patch buffer is large (29 MB for
the benchmark CNN's second conv at batch 64) and is streamed through memory once to
write it and once per product that reads it. When a kernel does nothing but write such
an operand, with one outer loop per nest running over the batch axis, this pass removes
it and has every reading product rebuild the slice of the current batch index in a small
per-thread scratch (one image: 451 KB, which stays in cache) right before its library
call. Rebuilding is a copy, so values are exactly those of the materialized form.

Running the neighbouring per-image kernels (bias + ReLU + mean, the ReLU-masked
gradient) inside the product's per-index loop, so their second touch of a slice hits
cache, was built and measured no faster three times (1 thread 11.20 -> 11.28 ms; 2
threads quiet 6.725 -> 6.701 ms; with the own convolution products 9.40 -> 9.49 ms): the
GEMM's packed panels and the neighbours' slices share the L2, so what the neighbours
gain the products lose. It was removed (session 4); the reasoning stays here.
"""

from __future__ import annotations

from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.target import C_TARGET, Target


def fuse_batch_producers(program: L.Program, target: Target = C_TARGET) -> L.Program:
    """Apply the transformation to every eligible producer kernel of ``program``, in place
    (and its mirror image: a batched product whose only reader, the next kernel, consumes
    it one batch slice at a time, e.g. a convolution's col2im).

    ``target.batch_fusion_min_operand``: smaller operands stay materialized (they stay in
    cache anyway); ``target.batch_fusion_slots``: scratch slices for concurrent batch
    indices."""
    sizes = (target.batch_fusion_min_operand, target.batch_fusion_slots)
    for producer in list(program.kernels):
        _try_fuse(program, producer, *sizes)
    for kernel in list(program.kernels):
        _try_fuse_consumer(program, kernel, *sizes)
    return program


def _try_fuse_consumer(program: L.Program, kernel: L.Kernel, min_operand: int, slots: int) -> bool:
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], L.Contract):
        return False
    c = kernel.body[0]
    spec = program.buffers[c.c]
    slice_ = c.m * c.n
    if (
        not c.plain_batch
        or spec.kind != "temp"
        or spec.size < min_operand
        or c.sum_batch != 1
        or c.batch < 2
    ):
        return False
    if c.stride_c != slice_ or spec.size != slice_ * c.batch or c.c in (c.a, c.b) or c.beta:
        return False
    at = program.kernels.index(kernel)
    if at + 1 >= len(program.kernels):
        return False
    reader = program.kernels[at + 1]  # adjacent: nothing in between may change a or b
    others = program.kernels[:at] + program.kernels[at + 2 :]
    if any(c.c in L.reads(k.body) | L.writes(k.body) for k in others):
        return False
    if c.c in L.writes(reader.body) or not _reads_by_slices(reader, c.c, c.batch, slice_):
        return False
    scratch = f"{c.c}_slice"
    program.buffers[scratch] = L.BufferSpec(scratch, spec.dtype, slice_ * slots, "temp")
    consumer = tuple(_to_slice(s, c.c, scratch, slice_, load=True) for s in reader.body)
    product = replace(c, c=scratch)
    reader.body = (L.BatchFused((), product, "c", scratch, slice_, slots, consumer),)
    reader.inlined = [*reader.inlined, f"{kernel.root} (per batch index)"]
    program.kernels.remove(kernel)
    del program.buffers[c.c]
    return True


def _reads_by_slices(kernel: L.Kernel, target: str, batch: int, slice_: int) -> bool:
    """Every nest is a parallel ``for b`` reading ``target`` only at ``slice*b + r``."""
    for nest in kernel.body:
        if not isinstance(nest, L.Loop) or nest.kind != "parallel" or nest.var.extent != batch:
            return False
        if nest.start != 0 or nest.stop not in (None, batch):
            return False
        for s in L.walk(nest.body):
            if isinstance(s, L.IndexLoad | L.CheckBounds) and s.buffer == target:
                return False
        for load in L.loads_in(nest.body):
            if load.buffer != target:
                continue
            if load.index.coef(nest.var) != slice_:
                return False
            lo, hi = (load.index + L.var(nest.var) * (-slice_)).bounds()
            if lo < 0 or hi >= slice_:
                return False
    return True


def _to_slice(s: L.Stmt, old: str, new: str, slice_: int, load: bool) -> L.Loop:
    """A nest ``for b: ...`` with its loads (``load``) or stores of ``old[slice*b + r]`` sent
    to ``new[r]``: the current batch index's slice of the scratch (see ``BatchFused``)."""
    assert isinstance(s, L.Loop)
    b = s.var

    def rel(index: L.Affine) -> L.Affine:
        return index + L.var(b) * (-slice_)

    def expr(e: L.Expr) -> L.Expr:
        if load and isinstance(e, L.Load) and e.buffer == old:
            return replace(e, buffer=new, index=rel(e.index))
        return e

    def stmt(x: L.Stmt) -> L.Stmt:
        if not load and isinstance(x, L.Store) and x.buffer == old:
            return replace(x, buffer=new, index=rel(x.index))
        return x

    return replace(s, body=L.map_body(s.body, expr, stmt))


def _try_fuse(program: L.Program, producer: L.Kernel, min_operand: int, slots: int) -> bool:
    written = L.writes(producer.body)
    if len(written) != 1:
        return False
    (target,) = written
    spec = program.buffers[target]
    if spec.kind != "temp" or spec.size < min_operand:
        return False
    nests = _nests_over_batch(producer, target)
    if nests is None:
        return False
    batch, slice_ = nests
    start = program.kernels.index(producer)
    readers = [k for k in program.kernels if target in L.reads(k.body)]
    later_writes = set().union(*(L.writes(k.body) for k in program.kernels[start + 1 :]))
    sources = L.reads(producer.body)
    if any(program.buffers[b].kind not in ("temp", "input", "const") for b in sources):
        return False  # state may be updated in place before a reader runs
    if sources & later_writes or not readers:
        return False
    if any(program.kernels.index(k) < start for k in readers):
        return False
    plans = [_reader_plan(k, target, batch, slice_) for k in readers]
    if any(p is None for p in plans):
        return False
    scratch = f"{target}_slice"
    program.buffers[scratch] = L.BufferSpec(scratch, spec.dtype, slice_ * slots, "temp")
    loops = tuple(_to_slice(s, target, scratch, slice_, load=False) for s in producer.body)
    for kernel, plan in zip(readers, plans, strict=True):
        assert plan is not None
        contract, operand = plan
        named = replace(contract, **{operand: scratch})  # type: ignore[arg-type]
        fused = L.BatchFused(loops, named, operand, scratch, slice_, slots)
        kernel.body = (fused,)
        kernel.inlined = [*kernel.inlined, f"{producer.root} (per batch index)"]
    program.kernels.remove(producer)
    del program.buffers[target]
    return True


def _nests_over_batch(kernel: L.Kernel, target: str) -> tuple[int, int] | None:
    """(batch, slice size) when every nest is ``for b: ...`` storing ``target[slice*b + r]``
    with ``0 <= r < slice``, or None."""
    batch = None
    for nest in kernel.body:
        if not isinstance(nest, L.Loop) or nest.kind != "parallel":
            return None
        if batch is None:
            batch = nest.var.extent
        if nest.var.extent != batch or batch < 2:
            return None
    if batch is None:
        return None
    size = None
    for nest in kernel.body:
        assert isinstance(nest, L.Loop)
        stores = [s for s in L.walk(nest.body) if isinstance(s, L.Store)]
        if any(not isinstance(s, L.Loop | L.Store) for s in L.walk(nest.body)):
            return None
        for s in stores:
            if s.accumulate or s.buffer != target:
                return None
            step = s.index.coef(nest.var)
            lo, hi = (s.index + L.var(nest.var) * (-step)).bounds()
            if step <= 0 or lo < 0 or hi >= step or (size is not None and step != size):
                return None
            size = step
    if size is None or size * batch > 1 << 31:
        return None
    return batch, size


def _reader_plan(
    kernel: L.Kernel, target: str, batch: int, slice_: int
) -> tuple[L.Contract, str] | None:
    """(contract, operand) when ``kernel`` is one product reading ``target`` by batch slices."""
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], L.Contract):
        return None
    c = kernel.body[0]
    if (c.a == target) == (c.b == target) or c.c == target or not c.plain_batch:
        return None
    operand = "a" if c.a == target else "b"
    offset = c.offset_a if operand == "a" else c.offset_b
    if offset != 0:
        return None
    stride, sum_stride = (
        (c.stride_a, c.sum_stride_a) if operand == "a" else (c.stride_b, c.sum_stride_b)
    )
    if c.batch == batch and c.sum_batch == 1 and stride == slice_:
        return c, operand
    if c.batch == 1 and c.sum_batch == batch and sum_stride == slice_ and c.m * c.n <= 1 << 14:
        return c, operand
    return None
