"""What a C executable needs at run time, stored next to its library: the warm-cache path.

A compiled program's library is cached by its source (``toolchain``); producing that
source takes the graph passes, the loop pipeline and the renderer. A *manifest* lets a
fresh process skip all three: ``sg.compile`` keys it on the traced graph, the backend's
options and toolchain (:func:`manifest_key`), and it holds the program's calling
convention (:class:`RuntimeInfo`: I/O slots, state updates, constants, error messages,
arena size, kernel names for the profile, budgets) plus the library's key and the graph
signature it was built for.

Format: ``<key>.manifest`` in the private cache directory; the first line is the SHA-256
(hex) of the rest, which is JSON (data only, never pickle; constants as base64 bytes with
dtype and shape). Written atomically (``_cache.atomic_write``). Read once through one
descriptor (``_cache.read_trusted``), and used only when that file is ours alone, its
checksum matches, it parses, its format and key agree and it describes the graph being
compiled; anything else reads as "no manifest" and the caller compiles in full (and
writes a fresh one). A cache on a read-only disk is read as it is.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad import _cache
from shapegrad.backends.base import Array
from shapegrad.backends.c import shmshard, toolchain
from shapegrad.compiler import loops as L
from shapegrad.compiler.budget import program_budget
from shapegrad.ir import Graph

FORMAT = 1


@dataclass(frozen=True)
class RuntimeInfo:
    """A program's calling convention and the facts its executable reports.

    Attributes:
        name: the program's name (error messages).
        n_slots / arena_bytes: size of the I/O table and of the arena.
        state_of_output: output index -> the input whose buffer it updates.
        output_slots: output index -> its I/O slot.
        constants: (slot, data) of every constant buffer.
        errors: error code -> message (``Program.errors``).
        collective_codes: codes raised by a failed MPI call (``DistributedError``).
        hoisted_codes: codes checked before any kernel (the failing step changed nothing).
        kernels: (name, root) per kernel, for ``CExecutable.profile``.
        budget: (arena bytes, kernels, layer loops), for ``Compiled.stats``.
        library_key: the key of the library that runs it.
        shard_flag: arena offset of the flag that turns sharded updates on (-1: none;
            ``shmshard``); ``arena_bytes`` includes it.
        shared_slots: the slots of the state kept once per node when sharded.
    """

    name: str
    n_slots: int
    arena_bytes: int
    state_of_output: dict[int, int]
    output_slots: dict[int, int]
    constants: tuple[tuple[int, Array], ...]
    errors: dict[int, str]
    collective_codes: frozenset[int]
    hoisted_codes: frozenset[int]
    kernels: tuple[tuple[str, str], ...]
    budget: tuple[int, int, int]
    library_key: str
    shard_flag: int = -1
    shared_slots: tuple[int, ...] = ()

    @classmethod
    def of(cls, program: L.Program, library_key: str) -> RuntimeInfo:
        """The runtime facts of a lowered ``program``."""
        statements = [s for k in program.kernels for s in L.walk(k.body)]
        first = program.kernels[0] if program.kernels else None
        hoisted = (
            frozenset(s.code for s in first.body if isinstance(s, L.CheckBounds))
            if first is not None and first.name == "k_checks"
            else frozenset()
        )
        plan = shmshard.shard_plan(program) if program.communicators else None
        return cls(
            program.name,
            program.n_slots,
            program.arena_bytes + (shmshard.FLAG_BYTES if plan else 0),
            dict(program.state_of_output),
            {k: program.buffers[name].slot for k, name in enumerate(program.outputs)},
            tuple(
                (program.buffers[name].slot, np.ascontiguousarray(value))
                for name, value in program.constants.items()
            ),
            dict(program.errors),
            frozenset(s.code for s in statements if isinstance(s, L.Collective)),
            hoisted,
            tuple((k.name, k.root) for k in program.kernels),
            program_budget(program),
            library_key,
            plan.flag if plan else -1,
            tuple(program.buffers[name].slot for name in plan.buffers) if plan else (),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n_slots": self.n_slots,
            "arena_bytes": self.arena_bytes,
            "state_of_output": sorted(self.state_of_output.items()),
            "output_slots": sorted(self.output_slots.items()),
            "constants": [
                {
                    "slot": slot,
                    "dtype": data.dtype.str,
                    "shape": list(data.shape),
                    "data": base64.b64encode(data.tobytes()).decode("ascii"),
                }
                for slot, data in self.constants
            ],
            "errors": sorted(self.errors.items()),
            "collective_codes": sorted(self.collective_codes),
            "hoisted_codes": sorted(self.hoisted_codes),
            "kernels": [list(k) for k in self.kernels],
            "budget": list(self.budget),
            "library_key": self.library_key,
            "shard_flag": self.shard_flag,
            "shared_slots": list(self.shared_slots),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RuntimeInfo:
        """Rebuild from :meth:`to_json` (raises KeyError/TypeError/ValueError when malformed)."""
        constants = []
        for c in d["constants"]:
            raw = base64.b64decode(c["data"], validate=True)
            array = np.frombuffer(raw, dtype=np.dtype(str(c["dtype"])))
            constants.append((int(c["slot"]), array.reshape([int(n) for n in c["shape"]]).copy()))
        budget = [int(n) for n in d["budget"]]
        return cls(
            str(d["name"]),
            int(d["n_slots"]),
            int(d["arena_bytes"]),
            {int(k): int(v) for k, v in d["state_of_output"]},
            {int(k): int(v) for k, v in d["output_slots"]},
            tuple(constants),
            {int(k): str(v) for k, v in d["errors"]},
            frozenset(int(c) for c in d["collective_codes"]),
            frozenset(int(c) for c in d["hoisted_codes"]),
            tuple((str(n), str(r)) for n, r in d["kernels"]),
            (budget[0], budget[1], budget[2]),
            str(d["library_key"]),
            int(d.get("shard_flag", -1)),
            tuple(int(n) for n in d.get("shared_slots", ())),
        )


def signature_of(graph: Graph) -> dict[str, Any]:
    """The graph facts an executable relies on: inputs (name, dtype, shape), outputs
    (dtype, shape) and aliases. A manifest is used only for a graph with the same."""
    return {
        "inputs": [
            [str(n.attr.get("name", "")), n.aval.dtype.name, list(n.shape)] for n in graph.inputs
        ],
        "outputs": [[n.aval.dtype.name, list(n.shape)] for n in graph.outputs],
        "aliases": sorted([int(k), int(i)] for k, i in graph.aliases),
    }


def manifest_key(graph_key: str, *context: str) -> str:
    """The file key: the graph's key plus what the C backend adds (target, toolchain)."""
    h = hashlib.sha256(f"manifest-{FORMAT}\0{graph_key}".encode())
    for part in context:
        h.update(b"\0" + part.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def _path(key: str) -> str:
    return os.path.join(toolchain.library_dir(), key + ".manifest")


def _stored(key: str) -> bytes | None:
    """The first trusted manifest file for ``key`` in the directories searched."""
    for folder in toolchain.library_dirs():
        found = _cache.read_trusted(os.path.join(folder, key + ".manifest"))
        if found is not None:
            return found.data
    return None


def write(key: str, info: RuntimeInfo, graph: Graph) -> None:
    """Store the manifest for ``key`` (best effort: a cache that cannot be written only
    costs the next process a full compile)."""
    body = json.dumps(
        {"format": FORMAT, "key": key, "signature": signature_of(graph), "runtime": info.to_json()},
        separators=(",", ":"),
        sort_keys=True,
    ).encode("utf-8")
    data = hashlib.sha256(body).hexdigest().encode("ascii") + b"\n" + body
    with contextlib.suppress(OSError):
        _cache.atomic_write(_path(key), data)


def read(key: str, graph: Graph) -> RuntimeInfo | None:
    """The stored runtime info for ``key`` when it is trusted, intact and describes
    ``graph``; None otherwise (never raises for a bad file)."""
    data = _stored(key)
    if data is None:
        return None
    try:
        digest, _, body = data.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode("ascii") != digest:
            return None
        doc = json.loads(body)
        if doc.get("format") != FORMAT or doc.get("key") != key:
            return None
        if doc.get("signature") != signature_of(graph):
            return None
        return RuntimeInfo.from_json(doc["runtime"])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return None


__all__ = ["RuntimeInfo", "manifest_key", "read", "signature_of", "write"]
