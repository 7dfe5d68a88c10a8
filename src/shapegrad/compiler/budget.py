"""What a compiled program costs: arena bytes, kernels, layer loops, compile time.

``sg.compile(...).stats(*args)`` returns a :class:`CompileStats`: the per-pass graph
statistics (a list of ``PassStat``, as before) plus these budgets, so a user can see
what ``sg.checkpoint`` (a smaller arena) and ``sg.scan`` (kernels and compile time
independent of depth) buy. The same numbers head the ``SHAPEGRAD_DEBUG`` loop dumps.
"""

from __future__ import annotations

from typing import Any

from shapegrad.compiler import loops as L
from shapegrad.compiler.passes import PassStat


def program_budget(program: L.Program) -> tuple[int, int, int]:
    """(arena bytes, kernels including each layer body's once, layer loops) of ``program``."""
    kernels = loops = 0
    for nested in L.nested_programs(program):
        kernels += len(nested.kernels)
        loops += sum(isinstance(s, L.LayerLoop) for k in nested.kernels for s in L.walk(k.body))
    return program.arena_bytes, kernels, loops


class CompileStats(list[PassStat]):
    """Per-pass statistics plus the budgets of the compiled program.

    Attributes:
        arena_bytes: bytes of scratch memory one call uses (None: the backend plans no arena).
        kernels: generated kernels, a layer body's counted once (None: not a loop backend).
        layer_loops: ``LayerLoop`` statements (``sg.scan`` / ``sg.checkpoint`` regions).
        compile_seconds: trace + graph passes + backend (lowering, C compiler or cache).
    Example:
        >>> s = fast.stats(params, x, y); print(s.summary())
        arena 1.2 MB, 41 kernels (2 layer loops), compiled in 0.84 s
    """

    arena_bytes: int | None = None
    kernels: int | None = None
    layer_loops: int = 0
    compile_seconds: float = 0.0

    @classmethod
    def of(cls, passes: list[PassStat], executable: Any, seconds: float) -> CompileStats:
        stats = cls(passes)
        budget = getattr(executable, "budget", None)  # known without the program (C)
        program = None if budget is not None else getattr(executable, "program", None)
        if budget is not None:
            stats.arena_bytes, stats.kernels, stats.layer_loops = budget
        elif isinstance(program, L.Program):
            stats.arena_bytes, stats.kernels, stats.layer_loops = program_budget(program)
        stats.compile_seconds = seconds
        return stats

    def summary(self) -> str:
        """One line: arena, kernels, layer loops, compile time."""
        if self.arena_bytes is None:
            return f"compiled in {self.compile_seconds:.2f} s"
        return (
            f"arena {self.arena_bytes / 1e6:.3g} MB, {self.kernels} kernels "
            f"({self.layer_loops} layer loops), compiled in {self.compile_seconds:.2f} s"
        )
