"""Typed backend options: validated when ``sg.compile`` is called, keyed by their canonical
text; every environment variable the package reads is in the README's table."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import _cache
from shapegrad.backends import get_backend, options_type
from shapegrad.backends.ane.options import AneOptions
from shapegrad.backends.c import CompileError
from shapegrad.backends.c.options import COptions
from shapegrad.backends.cuda.options import CudaOptions
from shapegrad.compiler.target import C_TARGET

ROOT = Path(__file__).resolve().parents[1]
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _double(x: sg.Tensor) -> sg.Tensor:
    return x * 2.0


# --- unknown keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "key", "close"),
    [
        ("c", "flush_denormal", "flush_denormals"),
        ("c", "denormal", "denormals"),
        ("c", "cflag", "cflags"),
        ("cuda", "devices", "device"),
        ("ane", "precison", "precision"),
    ],
)
def test_a_misspelled_option_is_an_error_naming_the_valid_ones(
    backend: str, key: str, close: str
) -> None:
    with pytest.raises(TypeError) as info:
        sg.compile(_double, backend=backend, **{key: True})
    text = str(info.value)
    assert f"unknown option {key!r}" in text and f"did you mean {close!r}?" in text
    for name in options_type(backend).names():  # every valid name is listed
        assert name in text


def test_the_error_comes_at_the_call_before_any_trace() -> None:
    traced: list[int] = []

    def f(x: sg.Tensor) -> sg.Tensor:
        traced.append(1)
        return x

    with pytest.raises(TypeError, match="unknown option 'profil'"):
        sg.compile(f, backend="c", profil=True)
    with pytest.raises(TypeError, match="unknown option 'profil'"):
        sg.compile(backend="c", profil=True)  # the decorator form too
    assert traced == []


def test_the_numpy_backend_has_no_options() -> None:
    with pytest.raises(TypeError, match=r"unknown option 'profile'.*options are: none"):
        sg.compile(_double, profile=True)
    x = np.arange(3.0)
    np.testing.assert_array_equal(sg.compile(_double)(x).numpy(), x * 2.0)


# --- types and values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "options", "error", "words"),
    [
        ("c", {"profile": "yes"}, TypeError, ["'profile'", "must be a bool", "str 'yes'"]),
        ("c", {"contract_min": 1.5}, TypeError, ["'contract_min'", "an int or None"]),
        ("c", {"contract_min": True}, TypeError, ["'contract_min'", "bool True"]),
        ("c", {"contract_min": -1}, ValueError, ["'contract_min'", ">= 0", "-1"]),
        ("c", {"denormals": "flushed"}, ValueError, ["'denormals'", "'keep', 'flush'"]),
        ("c", {"target": "C_TARGET"}, TypeError, ["'target'", "a Target or None"]),
        ("c", {"cflags": ("-O1", 2)}, TypeError, ["'cflags'", "a tuple of str"]),
        ("c", {"cflags": ["-O1", " "]}, ValueError, ["'cflags'", "empty flags"]),
        ("c", {"unit_lines": -5}, ValueError, ["'unit_lines'", ">= 0"]),
        ("c", {"flush_denormals": 1}, TypeError, ["'flush_denormals'", "bool", "denormals="]),
        ("cuda", {"device": -1}, ValueError, ["'device'", ">= 0"]),
        ("cuda", {"device": "0"}, TypeError, ["'device'", "an int"]),
        ("cuda", {"arch": "90"}, ValueError, ["'arch'", "sm_90"]),
        ("ane", {"precision": "fp8"}, ValueError, ["'precision'", "'fp16', 'fp32'"]),
        ("ane", {"cache_dir": 3}, TypeError, ["'cache_dir'", "a str or None"]),
    ],
)
def test_a_wrong_type_or_value_is_a_clear_error(
    backend: str, options: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as info:
        sg.compile(_double, backend=backend, **options)
    text = str(info.value)
    assert f"sg.compile(backend={backend!r})" in text
    for word in words:
        assert word in text, (word, text)


def test_values_are_normalised() -> None:
    # the old spelling of the FP mode, lists as tuples, a flag string split like a shell
    assert COptions.from_kwargs({"flush_denormals": True}) == COptions(denormals="flush")
    assert COptions.from_kwargs({"flush_denormals": False}) == COptions(denormals="keep")
    assert COptions(cflags=["-O1", "-g"]).cflags == ("-O1", "-g")  # type: ignore[arg-type]
    assert COptions.from_kwargs({"cflags": "-O1  -DX='a b'"}).cflags == ("-O1", "-DX=a b")
    assert COptions(profile=np.bool_(True)).profile is True  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give 'denormals' only"):
        COptions.from_kwargs({"flush_denormals": True, "denormals": "flush"})
    assert CudaOptions.from_kwargs({"arch": "sm_90a"}).arch == "sm_90a"
    assert AneOptions.from_kwargs({}).precision == "fp16"


def test_the_shorthands_reach_the_target() -> None:
    opts = COptions(contract_min=7, fuse_epilogues=False)
    assert opts.resolved_target() == C_TARGET.replace(contract_min_macs=7, fuse_epilogues=False)
    assert COptions().resolved_target() == C_TARGET


def test_canonical_text_names_every_field_and_tells_values_apart() -> None:
    text = COptions(denormals="flush", cflags=("-O1",)).canonical()
    for name in COptions.names():
        if name != "flush_denormals":  # an old spelling, not a field
            assert f"{name}=" in text
    assert COptions(cflags=("-O1",)).canonical() == COptions(cflags=["-O1"]).canonical()  # type: ignore[arg-type]
    variants = [
        COptions(),
        COptions(denormals="flush"),
        COptions(profile=True),
        COptions(contract_min=0),
        COptions(target=C_TARGET.replace(fuse_epilogues=False)),
        COptions(cflags=("-O1",)),
    ]
    assert len({v.canonical() for v in variants}) == len(variants)


@needs_cc
def test_options_are_part_of_the_graph_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SHAPEGRAD_CACHE_DIR", raising=False)
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    plain = sg.compile(_double, backend="c").trace(x).lower()
    same = sg.compile(_double, backend="c", denormals="keep").trace(x).lower()
    flushed = sg.compile(_double, backend="c", denormals="flush").trace(x).lower()
    keys = [lowered._graph_key(get_backend("c")) for lowered in (plain, same, flushed)]
    assert keys[0] is not None and keys[0] == keys[1] != keys[2]


# --- options that change the build ---------------------------------------------------------


@needs_cc
def test_cflags_replace_the_environment_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SHAPEGRAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("SHAPEGRAD_CFLAGS", "-fno-such-flag-anywhere")  # cc would reject it
    x = np.linspace(-2, 2, 9, dtype=np.float32)

    def f(x: sg.Tensor) -> sg.Tensor:
        return sg.tanh(x) * 3.0 + 0.125

    want = np.tanh(x) * 3.0 + 0.125
    o1 = sg.compile(f, backend="c", cflags="-O1 -fopenmp")
    o2 = sg.compile(f, backend="c", cflags=("-O2", "-fopenmp"))
    np.testing.assert_allclose(o1(x).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(o2(x).numpy(), want, rtol=1e-6)
    paths = {fn.lower(x).executable.source_path for fn in (o1, o2)}  # type: ignore[attr-defined]
    assert len(paths) == 2  # the flags are part of the library's key
    with pytest.raises(CompileError, match="no-such-flag"):
        sg.compile(f, backend="c")(x)  # without the option, the environment's flags count


# --- environment variables -----------------------------------------------------------------


@needs_cc
def test_the_cache_dir_variable_moves_every_backends_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from shapegrad.backends import native
    from shapegrad.backends.ane.package import cache_root

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache.cache_home() == str(tmp_path / "mine")
    assert native.cache_dir() == str(tmp_path / "mine")
    assert cache_root() == tmp_path / "mine" / "ane"
    x = np.arange(5, dtype=np.float32)
    fn = sg.compile(lambda x: sg.exp(x) - 0.375, backend="c")
    np.testing.assert_allclose(fn(x).numpy(), np.exp(x) - 0.375, rtol=1e-6)
    assert list((tmp_path / "mine").glob("*.so")) and not (tmp_path / "xdg").exists()
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", "")  # empty: as if unset
    assert _cache.cache_home() == str(tmp_path / "xdg" / "shapegrad")


_ENVIRON_READERS = ("get", "getenv", "pop", "setdefault")


def _environment_variables(path: Path) -> set[str]:
    """Names of the environment variables ``path`` reads or sets: literal names given to
    ``os.environ``/``os.getenv``, and names reaching them through a module constant or a
    loop over a tuple of names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                constants.setdefault(target.id, []).extend(_strings(node.value, constants))
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            constants.setdefault(node.target.id, []).extend(_strings(node.iter, constants))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if node.args and (
                (owner.endswith("environ") and node.func.attr in _ENVIRON_READERS)
                or (owner == "os" and node.func.attr == "getenv")
            ):
                found.update(_strings(node.args[0], constants))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            found.update(_strings(node.slice, constants))
        elif isinstance(node, ast.Compare) and any(
            ast.unparse(c).endswith("environ") for c in node.comparators
        ):
            found.update(_strings(node.left, constants))
    return found


def _strings(node: ast.expr, constants: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    if isinstance(node, ast.Tuple | ast.List):
        return [s for item in node.elts for s in _strings(item, constants)]
    return []


def _readme_table() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Environment variables") :]
    section = section[: section.index("\n## ", 1)]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_every_environment_variable_is_in_the_readme_table() -> None:
    used: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for name in _environment_variables(path):
            used.setdefault(name, []).append(str(path.relative_to(ROOT)))
    # the scan itself finds the indirect ones (a constant, a loop over names)
    assert {"SHAPEGRAD_CACHE_DIR", "OMP_NUM_THREADS", "PMI_SIZE", "SHAPEGRAD_CUDA_ARCH"} <= set(
        used
    )
    table = _readme_table()
    missing = {name: where for name, where in used.items() if name not in table}
    assert missing == {}, f"add these to README.md's environment variable table: {missing}"
    assert not table - set(used), "the README lists variables nothing reads"
