"""Data flows down: no module imports a layer above its own, and there is no import cycle.

The layers, bottom to top, are those of DESIGN.md's flow of data. Every import of a
``shapegrad`` module counts (module level, inside functions, under TYPE_CHECKING):
a lazy import is still a dependency. The core layer is ordered into sub-layers
(IR data -> Tensor -> primitives -> interpreters -> composites -> control ->
annotations): Tensor's operators are installed from above (``_tensor_methods.py``),
and SCAN's IR data lives in ``ops/scan.py``, below everything that builds or lowers it.

Cycles are counted over every import that runs (module level and inside functions);
imports under ``TYPE_CHECKING`` only name types for the checker and never run, so they
are left out of the cycle count (they still count for the layers).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "shapegrad"

# Bottom to top. A module's layer is that of its first component under ``shapegrad``.
LAYERS: list[set[str]] = [
    {"shapes", "dtypes", "_version", "_cache", "_names"},
    {
        "tensor",
        "ops",
        "functional",
        "_conv",
        "_winograd",
        "_einsum",
        "_creation",
        "_indexing",
        "_norms",
        "_composites",
        "_resample",
        "_sorting",
        "_tensor_methods",
        "random",
        "_specs",
        "typing",
        "_typechecked",
        "autodiff",
        "transforms",
        "_custom_vjp",
        "_batching",
        "_custom_jvp",
        "_fused",
        "tree",
        "ir",
        "control",
        "_remat",
        "_scan",
    },
    {"distributed"},  # communicators + collectives: used by compiler stages, backends, train
    {"compiler"},
    {"backends"},
    {"jit"},
    {"nn", "data", "io", "train", "models"},
    {"plot", "cli"},
    {"<package>", "mypy_plugin"},
]

# The core layer's sub-layers, bottom to top (a module imports its own or lower ones).
CORE_SUBLAYERS: list[tuple[str, set[str]]] = [
    (
        "IR data",  # primitives, shape rules, NumPy semantics, the graph IR, SCAN's bodies
        {
            "shapegrad.ops",
            "shapegrad.ops.protocol",
            "shapegrad.ops.einsum_plan",
            "shapegrad.ops.einsum_roles",
            "shapegrad.ops.reference",
            "shapegrad.ops.special",
            "shapegrad.ops.scan",
            "shapegrad.ops.kernels",
            "shapegrad.ir",
        },
    ),
    ("tensor", {"shapegrad.tensor"}),  # Tensor, the Ops protocol, the tape record
    ("primitives", {"shapegrad.ops.prims"}),
    (
        "interpreters",  # eager + tape, graph builder, the VJP rules, autodiff
        {
            "shapegrad.ops.eager",
            "shapegrad.ops.graph",
            "shapegrad.ops.vjp",
            "shapegrad.autodiff",
            "shapegrad.transforms",
            "shapegrad._custom_vjp",
            "shapegrad._batching",
            "shapegrad._custom_jvp",
            "shapegrad._fused",
            "shapegrad.tree",
        },
    ),
    (
        "composites",  # functional ops written once against Tensor; Tensor's operators
        {
            "shapegrad.random",
            "shapegrad._creation",
            "shapegrad._indexing",
            "shapegrad._winograd",
            "shapegrad._conv",
            "shapegrad._einsum",
            "shapegrad._norms",
            "shapegrad.functional",
            "shapegrad._composites",
            "shapegrad._resample",
            "shapegrad._sorting",
            "shapegrad._tensor_methods",
        },
    ),
    ("control", {"shapegrad._scan", "shapegrad._remat", "shapegrad.control"}),
    ("annotations", {"shapegrad._specs", "shapegrad.typing", "shapegrad._typechecked"}),
]

# Known cycles being removed (each names its owner); nothing may be added here, and an
# entry that no longer exists fails the test (delete it).
KNOWN_CYCLES: list[set[str]] = []  # none left; nothing may be added here


# Known violations being removed (each names its issue); nothing may be added here.
KNOWN_UPWARD: set[str] = set()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    module_level: bool
    type_only: bool = False  # under ``if TYPE_CHECKING:``: never runs


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


class _Collector(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, modules: dict[str, Path]) -> None:
        self.name, self.is_package, self.modules = name, is_package, modules
        self.depth = 0
        self.type_only = 0
        self.found: list[Import] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):  # annotations only: never run
            self.depth += 1
            self.type_only += 1
            for child in node.body:
                self.visit(child)
            self.type_only -= 1
            self.depth -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _add(self, module: str, node: ast.stmt) -> None:
        if not module.startswith("shapegrad"):
            return
        while module not in self.modules and "." in module:
            module = module.rsplit(".", 1)[0]
        if module != self.name:
            self.found.append(
                Import(self.name, module, node.lineno, self.depth == 0, self.type_only > 0)
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.name.split(".")
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        submodules = [a for a in node.names if f"{module}.{a.name}" in self.modules]
        if len(submodules) < len(node.names):  # names from the module itself
            self._add(module, node)
        for alias in submodules:
            self._add(f"{module}.{alias.name}", node)


def _imports() -> list[Import]:
    modules = _modules()
    found: list[Import] = []
    for name, path in sorted(modules.items()):
        collector = _Collector(name, path.name == "__init__.py", modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8")))
        found.extend(collector.found)
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "<package>"
    for rank, names in enumerate(LAYERS):
        if key in names:
            return rank
    raise AssertionError(f"{module}: add its package to LAYERS in tests/test_import_layers.py")


def test_every_module_has_a_layer() -> None:
    for name in _modules():
        _layer(name)


def test_no_upward_imports() -> None:
    upward = [
        f"{i.importer}:{i.line} imports {i.imported}"
        for i in _imports()
        if _layer(i.imported) > _layer(i.importer) and i.importer not in KNOWN_UPWARD
    ]
    assert upward == [], "data flows down (DESIGN.md); these import a higher layer:\n" + "\n".join(
        upward
    )


def _cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _runtime_cycles() -> list[set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in _modules()}
    for i in _imports():
        if not i.type_only and i.imported != "shapegrad":
            edges[i.importer].add(i.imported)
    return _cycles(edges)


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    cycles = _runtime_cycles()
    unexpected = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert unexpected == [], f"import cycles (imports inside functions count): {unexpected}"
    stale = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert stale == [], f"these known cycles are gone: delete them from KNOWN_CYCLES: {stale}"


def _sublayer(module: str) -> int | None:
    for rank, (_, names) in enumerate(CORE_SUBLAYERS):
        if module in names:
            return rank
    return None


def test_every_core_module_has_a_sublayer() -> None:
    core = [m for m in _modules() if _layer(m) == 1]
    missing = [m for m in core if _sublayer(m) is None]
    assert missing == [], f"add these to CORE_SUBLAYERS in tests/test_import_layers.py: {missing}"
    listed = [m for _, names in CORE_SUBLAYERS for m in names]
    assert sorted(listed) == sorted(set(listed)), "a module is in two sub-layers"
    assert set(listed) <= set(core), set(listed) - set(core)


def test_core_sublayers_import_downward() -> None:
    """Within the core, every import (lazy and type-only ones included) goes to the same
    sub-layer or a lower one: the IR never reaches up to Tensor, Tensor never to the
    primitives or interpreters, the primitives never to an interpreter, and so on."""
    upward = []
    for i in _imports():
        src, dst = _sublayer(i.importer), _sublayer(i.imported)
        if src is not None and dst is not None and dst > src:
            upward.append(
                f"{i.importer}:{i.line} ({CORE_SUBLAYERS[src][0]}) imports {i.imported} "
                f"({CORE_SUBLAYERS[dst][0]})"
            )
    assert upward == [], "core sub-layers (DESIGN.md):\n" + "\n".join(upward)


def test_compiler_lowers_scan_without_the_user_api() -> None:
    """The compiler reads SCAN's IR data (``ops/scan.py``), never ``control.py``."""
    bad = [
        f"{i.importer}:{i.line} imports {i.imported}"
        for i in _imports()
        if i.importer.startswith(("shapegrad.compiler", "shapegrad.backends"))
        and i.imported in ("shapegrad.control", "shapegrad._remat", "shapegrad._scan")
    ]
    assert bad == []


@pytest.mark.parametrize("package", ["backends", "compiler"])
def test_compiler_and_backends_never_import_tracing_or_autodiff(package: str) -> None:
    bad = [
        f"{i.importer}:{i.line} imports {i.imported}"
        for i in _imports()
        if i.importer.startswith(f"shapegrad.{package}")
        and i.importer not in KNOWN_UPWARD
        and i.imported in ("shapegrad.jit", "shapegrad.autodiff", "shapegrad.ops.eager")
    ]
    assert bad == []


def test_tensor_operators_installed_from_above_match_their_declarations() -> None:
    """``tensor.py`` declares Tensor's operators for the type checker; ``_tensor_methods.py``
    (above the ops they forward to) defines and installs them: the two lists agree."""
    import shapegrad._tensor_methods as methods
    from shapegrad.tensor import Tensor

    tree = ast.parse((ROOT / "tensor.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor"]
    declared = {
        f.name
        for block in cls.body
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for f in block.body
        if isinstance(f, ast.FunctionDef)
    }
    defined = {
        name
        for name, value in vars(methods._TensorMethods).items()
        if callable(value) or isinstance(value, property)
    }
    assert declared == defined
    for name in declared:
        value = vars(Tensor)[name]
        function = value.fget if isinstance(value, property) else value
        assert function.__module__ == "shapegrad._tensor_methods", name
