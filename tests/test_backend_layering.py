"""Backends sit below tracing and differentiation: nothing in backends/ imports them.

A backend lowers and executes graphs it is handed; tracing (``shapegrad.jit``),
differentiation (``shapegrad.autodiff``) and training (``shapegrad.train``) live
above it (DESIGN.md: data only flows down). Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shapegrad"
FORBIDDEN = ("shapegrad.jit", "shapegrad.autodiff", "shapegrad.train")
BACKEND_FILES = sorted((PACKAGE / "backends").rglob("*.py"))


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module ``source`` (a module of ``package``) imports.

    Relative imports are resolved against ``package``; ``from a import b`` yields both
    ``a`` and ``a.b`` (``b`` may be a module, e.g. ``from shapegrad import jit``).
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def package_of(path: Path) -> str:
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def test_the_check_catches_every_import_form() -> None:
    source = (
        "import numpy\n"
        "def f():\n"
        "    import shapegrad.jit\n"
        "    from shapegrad import autodiff\n"
        "    from ...train import optim\n"
        "    from .lowering import lower_to_mil\n"
    )
    names = imported_modules(source, "shapegrad.backends.ane")
    assert forbidden(names) == [
        "shapegrad.autodiff",
        "shapegrad.jit",
        "shapegrad.train",
        "shapegrad.train.optim",
    ]
    assert "shapegrad.backends.ane.lowering.lower_to_mil" in names


def test_the_scan_sees_every_backend() -> None:
    found = {p.relative_to(PACKAGE / "backends").as_posix() for p in BACKEND_FILES}
    assert {"base.py", "numpy_ref.py", "c/executable.py", "ane/__init__.py"} <= found


@pytest.mark.parametrize("path", BACKEND_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_backends_do_not_import_tracing_autodiff_or_training(path: Path) -> None:
    bad = forbidden(imported_modules(path.read_text(encoding="utf-8"), package_of(path)))
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad} (backends sit below these)"
