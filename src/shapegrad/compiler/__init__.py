"""Graph optimization (passes) and compilation debugging helpers."""

from shapegrad.compiler.passes import PIPELINE, PassStat, count_nodes, optimize

__all__ = ["PIPELINE", "PassStat", "count_nodes", "optimize"]
