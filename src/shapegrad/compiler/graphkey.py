"""A canonical, stable text of a traced graph, and the cache key made from it.

``sg.compile`` keys its on-disk artifacts on what determines them *before*
optimization (the traced graph, the backend, its options, the package version), so a
fresh process whose cache is warm skips the graph passes, the loop pipeline and the
renderer (see ``backends/c/manifest.py``).

The text must not depend on anything a new process would see differently: nodes are
numbered by their position in a topological walk from the inputs and outputs (never by
``Node.id``, a process-wide counter), attributes are already sorted by name
(``ir.freeze_attrs``), arrays are written as dtype, shape and a SHA-256 of their bytes,
floats by ``repr`` (round-trips exactly), frozen dataclasses field by field (a field
whose metadata says ``key=False`` is left out: a SCAN ``Body``'s process-wide serial
number), so a SCAN node's traced body is keyed by its sub-graph's content. A value the
encoder does not know (a function,
an arbitrary object, a communicator) makes the graph *unkeyable*: :func:`graph_key`
returns None and the caller takes the full compile path. Unknown means "not cached",
never "cached under a guess". The package's own source is part of the key too
(:func:`code_fingerprint`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
from typing import Any

import numpy as np

from shapegrad._version import __version__
from shapegrad.dtypes import DType
from shapegrad.ir import Graph, topological_order
from shapegrad.ops.protocol import AVal, ConstValue

FORMAT = "graphkey-1"  # bump when the text below changes meaning


class Unkeyable(Exception):
    """A value in the graph or options has no canonical text."""


def _encode(value: Any, out: list[str]) -> None:
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        out.append(f"{kind.__name__[0]}{value!r}")
    elif kind is float:
        out.append(f"f{value!r}")
    elif kind is tuple or kind is list:
        out.append("(")
        for item in value:
            _encode(item, out)
            out.append(",")
        out.append(")")
    elif isinstance(value, ConstValue):
        out.append(f"const:{value.dtype.name}")
        _encode(value.array, out)
    elif kind is frozenset or kind is set:  # iteration order varies with hash seeds: sort
        items = []
        for item in value:
            part: list[str] = []
            _encode(item, part)
            items.append("".join(part))
        out.append("set{" + ",".join(sorted(items)) + "}")
    elif isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        digest = hashlib.sha256(data.tobytes()).hexdigest()
        out.append(f"array<{data.dtype.str}{list(data.shape)}:{digest}>")
    elif isinstance(value, np.generic):
        out.append(f"{value.dtype.str}:{value.item()!r}")
    elif isinstance(value, DType):
        out.append(f"dtype:{value.name}")
    elif isinstance(value, AVal):
        out.append(f"aval:{value}")
    elif isinstance(value, enum.Enum):
        out.append(f"{kind.__qualname__}.{value.name}")
    elif isinstance(value, Graph):
        out.append("graph{")
        _encode_graph(value, out)
        out.append("}")
    elif kind is dict:
        out.append("{")
        for key in sorted(value, key=repr):
            _encode(key, out)
            out.append(":")
            _encode(value[key], out)
            out.append(",")
        out.append("}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not kind.__dataclass_params__.frozen:
            raise Unkeyable(f"mutable dataclass {kind.__qualname__}")
        out.append(f"{kind.__module__}.{kind.__qualname__}(")
        for f in dataclasses.fields(value):
            if f.metadata.get("key", True) is False:  # e.g. a SCAN Body's serial number
                continue
            out.append(f"{f.name}=")
            _encode(getattr(value, f.name), out)
            out.append(",")
        out.append(")")
    else:
        raise Unkeyable(f"{kind.__module__}.{kind.__qualname__}")


def _encode_graph(graph: Graph, out: list[str]) -> None:
    order = topological_order([*graph.inputs, *graph.outputs])
    number = {node.id: n for n, node in enumerate(order)}
    for node in order:
        args = ",".join(str(number[i.id]) for i in node.inputs)
        out.append(f"\n{node.prim.value}({args})")
        if node.attrs:
            _encode(node.attrs, out)
        out.append(f":{node.aval}")
    out.append("\nin " + ",".join(str(number[n.id]) for n in graph.inputs))
    out.append("\nout " + ",".join(str(number[n.id]) for n in graph.outputs))
    out.append(f"\naliases {sorted(graph.aliases)}")


def graph_text(graph: Graph) -> str:
    """The canonical text of ``graph`` (raises :class:`Unkeyable`)."""
    out: list[str] = []
    _encode_graph(graph, out)
    return "".join(out)


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 of every ``.py`` and ``.h`` file of the installed shapegrad package (path and bytes).

    Part of every key: the version string does not change while someone edits the
    lowering or a renderer in a checkout, and several checkouts may share one cache
    directory; a manifest must never send a changed compiler to a library built by the
    old one. Read once per process (~120 files, a few milliseconds).
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".h")):  # .h: packaged C runtime text
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as handle:
                    h.update(handle.read() + b"\0")
    return h.hexdigest()


def canonical_text(value: Any) -> str:
    """The canonical text of one value (e.g. a backend's Target; raises :class:`Unkeyable`)."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def graph_key(graph: Graph, *context: Any) -> str | None:
    """SHA-256 (hex) of ``graph``'s canonical text, ``context`` (backend name, options)
    and the package version; None when something in them has no canonical text.

    Example:
        >>> graph_key(traced, "c", options.name, c_options.canonical())   # doctest: +SKIP
        '5d1f...'
    """
    out: list[str] = [FORMAT, __version__, code_fingerprint()]
    try:
        _encode_graph(graph, out)
        out.append("\ncontext ")
        _encode(context, out)
    except Unkeyable:
        return None
    return hashlib.sha256("".join(out).encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["Unkeyable", "canonical_text", "graph_key", "graph_text"]
