"""Static shape checking: shapegrad's mypy plugin over the fixture models in tests/mypy_fixtures.

Every fixture, the realistic correct corpus (tests/mypy_fixtures/corpus) and the
dogfooded project code are checked in one mypy run with the plugin (and one without it).
Correct models (``good_*.py``, ``silenced.py``) must produce no error at all;
buggy ones (``bad_*.py``) and the inference probe (``probe_inference.py``, whose
annotations are deliberately wrong so each message shows an inferred shape) carry their exact expected message in a ``# E: ...`` comment line
just above the line where mypy must report it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from mypy import api as mypy_api

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "mypy_fixtures"
CONFIG = FIXTURES / "mypy.ini"
CORPUS = FIXTURES / "corpus"
# The project dogfoods the plugin: its examples and annotated model code are checked
# in the same mypy run and must come out clean.
DOGFOOD = [
    ROOT / "examples",
    ROOT / "src" / "shapegrad" / "nn",
    ROOT / "src" / "shapegrad" / "models.py",
]
_REPORT = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): (?P<kind>error|note): (?P<msg>.*)$")
_EXPECT = re.compile(r"^\s*#\s*E:\s*(?P<msg>.+?)\s*$")
_EXPECT_NOTE = re.compile(r"^\s*#\s*N:\s*(?P<msg>.+?)\s*$")

Findings = dict[str, list[tuple[int, str]]]


def _fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*.py"))


def expected(path: Path) -> list[tuple[int, str]]:
    """``(line, message)`` from the ``# E: message`` comments (each about the next line)."""
    out = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.match(text)
        if match:
            out.append((number + 1, f"{match['msg']}  [shapegrad-shape]"))
    return out


def expected_notes(path: Path) -> list[tuple[int, str]]:
    """``(line, note)`` from the ``# N: note`` comments (``sg.reveal_shape`` output)."""
    out = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT_NOTE.match(text)
        if match:
            out.append((number + 1, match["msg"]))
    return out


def run_mypy(config: Path, cache: Path) -> tuple[Findings, str]:
    """One mypy run over the fixtures and the dogfooded code; errors grouped by file.

    Fixture files are keyed by name, other files by path.
    """
    targets = [str(FIXTURES), *(str(p) for p in DOGFOOD if p.exists())]  # FIXTURES holds CORPUS
    os.environ["SHAPEGRAD_PLUGIN_DEBUG"] = "1"  # a bug in a rule must crash the test, not hide
    try:
        stdout, stderr, _ = mypy_api.run(
            ["--config-file", str(config), "--cache-dir", str(cache), "--no-pretty", *targets]
        )
    finally:
        del os.environ["SHAPEGRAD_PLUGIN_DEBUG"]
    findings: Findings = {p.name: [] for p in _fixture_files()}
    for line in stdout.splitlines():
        match = _REPORT.match(line)
        if match and match["kind"] == "error":
            path = Path(match["file"])
            key = path.name if path.parent.name == FIXTURES.name else str(path)
            if path.parent.name == CORPUS.name:
                key = f"corpus/{path.name}"
            findings.setdefault(key, []).append((int(match["line"]), match["msg"]))
    return findings, stdout + stderr


@pytest.fixture(scope="module")
def with_plugin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Findings, str]:
    return run_mypy(CONFIG, tmp_path_factory.mktemp("mypy-cache-plugin"))


@pytest.fixture(scope="module")
def without_plugin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Findings, str]:
    plain = tmp_path_factory.mktemp("mypy-plain") / "mypy.ini"
    plain.write_text(CONFIG.read_text().replace("plugins = shapegrad_mypy", ""))
    return run_mypy(plain, tmp_path_factory.mktemp("mypy-cache-plain"))


@pytest.mark.parametrize("path", _fixture_files(), ids=lambda p: p.stem)
def test_fixture_reports_exactly_the_expected_errors(
    path: Path, with_plugin: tuple[Findings, str]
) -> None:
    findings, output = with_plugin
    assert findings[path.name] == expected(path), output


REVEALING = [p for p in _fixture_files() if expected_notes(p)]


@pytest.mark.parametrize("path", REVEALING, ids=lambda p: p.stem)
def test_reveal_shape_notes_the_inferred_shapes(
    path: Path, with_plugin: tuple[Findings, str]
) -> None:
    _, output = with_plugin
    notes = [
        (int(m["line"]), m["msg"])
        for line in output.splitlines()
        if (m := _REPORT.match(line)) and m["kind"] == "note" and m["file"].endswith(path.name)
    ]
    assert notes == expected_notes(path), output


def test_reveal_fixtures_exist() -> None:
    assert len(REVEALING) >= 2 and sum(len(expected_notes(p)) for p in REVEALING) >= 20


def test_realistic_corpus_has_no_false_positives(with_plugin: tuple[Findings, str]) -> None:
    """60+ correct model files (GPT, LLaMA, U-Net, VAE, LSTM/GRU, ResNet, ViT, training loops)."""
    findings, output = with_plugin
    corpus = sorted(CORPUS.glob("*.py"))
    assert len(corpus) >= 60
    reported = {name: errs for name, errs in findings.items() if name.startswith("corpus/")}
    assert reported == {}, output


def test_examples_and_model_code_check_clean_with_the_plugin(
    with_plugin: tuple[Findings, str],
) -> None:
    findings, output = with_plugin
    fixture_names = {p.name for p in _fixture_files()}
    outside = {
        name: errs
        for name, errs in findings.items()
        if name not in fixture_names and not name.startswith("corpus/")
    }
    assert outside == {}, output
    assert "error: INTERNAL ERROR" not in output
    checked = re.search(r"checked (\d+) source files", output)
    assert checked is not None and int(checked[1]) > len(fixture_names) + 30, output


def test_every_buggy_fixture_expects_an_error_and_correct_ones_none() -> None:
    for path in _fixture_files():
        if path.stem.startswith(("bad_", "probe_")):
            assert expected(path), f"{path.name} documents no expected error"
        else:
            assert not expected(path), f"{path.name} is a correct model but expects errors"


@pytest.mark.slow  # a second cold mypy run (~30 s); CI runs it, local `pytest -m "not slow"` skips
def test_without_the_plugin_the_same_code_is_plain_tensor_code(
    without_plugin: tuple[Findings, str],
) -> None:
    findings, output = without_plugin
    # The ``# type: ignore[shapegrad-shape]`` in silenced.py is unused without the plugin.
    # ScalarTrainer's ``LossFn`` admits the documented ``(loss, new_params)`` return, so
    # plain mypy accepts the corpus's BatchNorm trainer as the plugin does.
    reported = {name: errs for name, errs in findings.items() if errs and name != "silenced.py"}
    assert reported == {}, output
    assert [msg for _, msg in findings["silenced.py"]] == [
        'Unused "type: ignore" comment  [unused-ignore]'
    ]
