"""Fast entry point of shapegrad's mypy plugin: ``plugins = shapegrad_mypy``.

``plugins = shapegrad.mypy_plugin`` works too, but importing a subpackage runs
``shapegrad/__init__.py`` first, which loads the whole runtime (NumPy,
jaxtyping, beartype, the compiler): a few hundred ms on every mypy run, more
than the checking itself on a warm cache. The plugin needs none of it, so this
module loads the plugin's own package (``shapegrad/mypy_plugin``, which only
imports mypy and itself) from its files, without importing ``shapegrad``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["plugin"]

_ALIAS = "_shapegrad_mypy_plugin"


def _load() -> ModuleType:
    loaded = sys.modules.get("shapegrad.mypy_plugin") or sys.modules.get(_ALIAS)
    if loaded is not None:
        return loaded
    found = importlib.util.find_spec("shapegrad")  # a top-level lookup imports nothing
    if found is None or not found.submodule_search_locations:
        raise ImportError("shapegrad_mypy: the shapegrad package is not installed")
    where = Path(next(iter(found.submodule_search_locations))) / "mypy_plugin"
    spec = importlib.util.spec_from_file_location(
        _ALIAS, where / "__init__.py", submodule_search_locations=[str(where)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"shapegrad_mypy: cannot load the plugin from {where}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_ALIAS] = module
    spec.loader.exec_module(module)
    return module


plugin = _load().plugin
