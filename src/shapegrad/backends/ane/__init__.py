"""Backend ``"ane"``: graphs lowered to Core ML ML Programs (MIL) for the Apple Neural Engine.

Pipeline: optimized graph -> :func:`lower_to_mil` (fp16 compute, fp32 I/O)
-> ``ct.convert`` -> ``.mlpackage`` cached by content hash -> on macOS 13+
``MLModel.predict`` with compute units CPU_AND_NE. On other systems
compiling works (the package is built and saved) and *calling* raises
:class:`AneExecutionUnavailable`; there is no silent fallback.

Backend options (:class:`~shapegrad.backends.ane.options.AneOptions`): ``precision``
(``"fp16"`` default, or ``"fp32"``), ``cache_dir``. :meth:`AneBackend.build` converts and
saves the package without loading it (returns its path).

Example:
    >>> f = sg.compile(loss, backend="ane")      # doctest: +SKIP
    >>> f(params, x, y)                          # macOS only
"""

from __future__ import annotations

from pathlib import Path

from shapegrad.backends.base import CompileOptions, Generated, register_backend
from shapegrad.ir import Graph

from ._errors import AneLoweringError
from .executable import (
    AneExecutable,
    AneExecutionUnavailable,
    IoSignature,
    MilRunner,
    can_execute,
)
from .lowering import MilProgram, lower_to_mil
from .options import AneOptions
from .package import Package, build_package, dump_mil


def compile_graph(
    graph: Graph,
    name: str = "fn",
    precision: str = "fp16",
    cache_dir: str | None = None,
    debug_dir: str | None = None,
) -> AneExecutable:
    """Lower, convert (or load from cache) and wrap ``graph`` as an executable.

    Args:
        graph: an optimized graph.
        name: readable name for dumps and the package file.
        precision: ``"fp16"`` or ``"fp32"`` compute.
        cache_dir: package cache (default ``$SHAPEGRAD_CACHE_DIR/ane``).
        debug_dir: where to dump the MIL text (default ``$SHAPEGRAD_DEBUG``).
    Returns:
        an :class:`AneExecutable` (callable on macOS 13+).
    """
    return compile_graph_lowered(lower_to_mil(graph, precision), name, cache_dir, debug_dir)


def compile_graph_lowered(
    mil: MilProgram, name: str = "fn", cache_dir: str | None = None, debug_dir: str | None = None
) -> AneExecutable:
    """Like :func:`compile_graph` for an already lowered program (which conversion consumes)."""
    dump_mil(mil, name, debug_dir)
    signature = IoSignature.of(mil)
    lowering = dict(mil.lowering)
    package = build_package(mil, name, Path(cache_dir) if cache_dir else None)
    stats = {
        "mil_ops": package.mil_ops,
        "converted_ops": package.converted_ops,
        "convert_seconds": package.convert_seconds,
        "cached": package.cached,
        "lowering": lowering,
    }
    return AneExecutable(mil.graph, signature, package.path, stats)


class AneBackend:
    """Backend ``"ane"``: available wherever coremltools imports (execution needs macOS)."""

    name = "ane"
    binds_state = False

    def compile(self, graph: Graph, options: CompileOptions) -> AneExecutable:
        opts = options.of(AneOptions)
        return compile_graph(graph, options.name, opts.precision, opts.cache_dir, options.debug_dir)

    def generate(self, graph: Graph, options: CompileOptions) -> Generated:
        """The MIL program of ``graph`` and its text (nothing converted yet)."""
        mil = lower_to_mil(graph, options.of(AneOptions).precision)
        return Generated(mil, mil.text(), "mil")

    def compile_generated(
        self, graph: Graph, generated: Generated, options: CompileOptions
    ) -> AneExecutable:
        """Convert and wrap the MIL program :meth:`generate` made (conversion consumes it)."""
        assert isinstance(generated.program, MilProgram)
        cache_dir = options.of(AneOptions).cache_dir
        return compile_graph_lowered(generated.program, options.name, cache_dir, options.debug_dir)

    def build(self, graph: Graph, options: CompileOptions) -> str:
        """Lower, convert and save ``graph``'s ``.mlpackage`` in the cache without loading
        it; returns the package's path."""
        opts = options.of(AneOptions)
        mil = lower_to_mil(graph, opts.precision)
        dump_mil(mil, options.name, options.debug_dir)
        root = Path(opts.cache_dir) if opts.cache_dir else None
        return str(build_package(mil, options.name, root).path)

    def is_available(self) -> tuple[bool, str]:
        try:
            from ._mil import coremltools

            coremltools()
        except ImportError as exc:
            return False, str(exc)
        return True, ""


register_backend("ane", AneBackend, options=AneOptions)

__all__ = [
    "AneBackend",
    "AneExecutable",
    "AneExecutionUnavailable",
    "AneLoweringError",
    "AneOptions",
    "IoSignature",
    "MilProgram",
    "MilRunner",
    "Package",
    "build_package",
    "can_execute",
    "compile_graph",
    "compile_graph_lowered",
    "dump_mil",
    "lower_to_mil",
]
