"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
RUNNABLE = [b for b in BLOCKS if "# error:" not in b]  # the mypy-output illustration is not a program


def test_readme_has_runnable_examples() -> None:
    assert len(RUNNABLE) >= 2


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(RUNNABLE[index], f"README.md[python block {index}]", "exec"), namespace)
