"""``SHAPEGRAD_DEBUG=<dir>``: write every IR stage of a compilation as numbered text files.

Layout: ``<dir>/<function>-<signature hash>/000_traced.txt`` is the traced
graph; ``NNN_r<round>_<pass>.txt`` is the graph after that pass application
(so each file is the "before" of the next one). Backends may write their own
artifacts (generated source) into the same folder, which they receive as
``CompileOptions.debug_dir``.
"""

from __future__ import annotations

import hashlib
import os
import re

from shapegrad import _cache
from shapegrad.compiler.passes import count_nodes
from shapegrad.ir import Graph

ENV_VAR = "SHAPEGRAD_DEBUG"


def debug_root() -> str | None:
    """The dump directory from ``SHAPEGRAD_DEBUG`` (None when unset or empty)."""
    value = os.environ.get(ENV_VAR, "").strip()
    return value or None


def write_dump(folder: str, filename: str, text: str) -> str:
    """Write ``text`` to ``folder/filename`` atomically (temp file + rename); returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, filename)
    # Atomic (parallel readers, and the ranks of an MPI job dumping together, never see
    # half a file); not flushed to disk: it is a debug dump.
    _cache.atomic_write(path, text.encode("utf-8"), 0o644, durable=False)
    return path


class GraphDumper:
    """Writes numbered graph dumps for one compilation into ``folder``."""

    def __init__(self, root: str, function_name: str, signature: object) -> None:
        digest = hashlib.sha256(repr(signature).encode()).hexdigest()[:10]
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", function_name) or "fn"
        self.folder = os.path.join(root, f"{safe}-{digest}")
        os.makedirs(self.folder, exist_ok=True)
        self.counter = 0

    def dump(self, label: str, graph: Graph) -> str:
        """Write ``graph`` as ``NNN_<label>.txt``; returns the path."""
        filename = f"{self.counter:03d}_{label}.txt"
        self.counter += 1
        header = f"# {label}: {count_nodes(graph)} nodes\n"
        return write_dump(self.folder, filename, header + graph.format() + "\n")

    def on_pass(self, round_: int, name: str, graph: Graph) -> None:
        """Hook for ``passes.optimize``."""
        self.dump(f"r{round_}_{name}", graph)
