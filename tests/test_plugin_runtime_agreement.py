"""One annotation language, two checkers that agree.

The fixture models in tests/mypy_fixtures (and the correct corpus in its
corpus/ folder) are checked statically by the mypy plugin
(tests/test_mypy_plugin.py). Here the same functions run on real tensors under
``sg.typechecked``: the correct models run cleanly (so "no error" on them is
not a missed bug) and every
buggy one fails at run time. When the run-time failure comes from an op (a
ShapeError, which records the user's source line), it points at the very line
where mypy reports the bug.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

import shapegrad as sg
from test_mypy_plugin import FIXTURES, expected

GOOD = sorted(p for p in FIXTURES.glob("good_*.py")) + sorted((FIXTURES / "corpus").glob("*.py"))
BAD = sorted(p for p in FIXTURES.glob("bad_*.py"))


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"sg_fixture_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", GOOD, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_correct_models_run_cleanly(path: Path) -> None:
    value = load(path).run()
    assert math.isfinite(value)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_buggy_models_fail_at_run_time_where_mypy_says(path: Path) -> None:
    with pytest.raises((sg.ShapeError, sg.ShapeTypeError)) as caught:
        load(path).run()
    error = caught.value
    static_lines = [line for line, _ in expected(path)]
    assert static_lines, f"{path.name} documents no static error"
    if isinstance(error, sg.ShapeError) and error.location and path.name in error.location:
        runtime_line = int(error.location.rsplit(":", 1)[1])
        # mypy reports a bug inside a helper at the call; at run time it surfaces in the
        # helper, on a line the fixture marks.
        marked = "the run-time error points here" in path.read_text().splitlines()[runtime_line - 1]
        assert runtime_line in static_lines or marked, (error, static_lines)
    else:
        # Caught by the annotation check (argument or return value): it names the function.
        message = str(error)
        assert any(word in message for word in ("return", "argument")), message
