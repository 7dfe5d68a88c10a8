"""The OpenBLAS kernel set of the C backend (``backends/c/blascore.py``).

The rule is checked on given CPU flags and environments (no CPU needed); the end-to-end
tests load OpenBLAS in a fresh process each (it picks its kernels once per process) and
check the products against NumPy.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from shapegrad.backends.c import blascore
from shapegrad.backends.c.blascore import SKYLAKEX_FLAGS, choose_core, core_for_load, cpu_flags

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | SKYLAKEX_FLAGS | {"avx512_bf16", "avx512_vnni"}
X86 = platform.machine() in ("x86_64", "AMD64")


def test_default_defers_to_the_users_openblas_coretype() -> None:
    for flags in (AVX2, AVX512):
        assert choose_core("", flags, "x86_64", {"OPENBLAS_CORETYPE": "Haswell"}) is None
        assert choose_core("  ", flags, "x86_64", {"OPENBLAS_CORETYPE": "Zen"}) is None


def test_default_picks_by_flags_when_the_user_chose_nothing() -> None:
    assert choose_core("", AVX512, "x86_64", {}) == "SkylakeX"
    assert choose_core("", AVX512, "x86_64", {"OPENBLAS_CORETYPE": " "}) == "SkylakeX"
    assert choose_core("", AVX2, "x86_64", {}) is None  # OpenBLAS's own detection
    assert choose_core("", AVX512, "aarch64", {}) is None
    assert choose_core("", frozenset(), "x86_64", {}) is None


def test_auto_picks_avx512_kernels_by_flags() -> None:
    assert choose_core("auto", AVX512, "x86_64", {}) == "SkylakeX"
    # the user's process-wide OPENBLAS_CORETYPE does not hold shapegrad back under auto
    assert choose_core("AUTO", AVX512, "x86_64", {"OPENBLAS_CORETYPE": "Haswell"}) == "SkylakeX"


def test_auto_without_every_avx512_flag_is_openblas_detection() -> None:
    # avx512f alone (Knights Landing: no BW/VL/DQ) cannot run the SkylakeX kernels
    for flags in (AVX2, AVX2 | {"avx512f", "avx512cd"}):
        assert choose_core("auto", flags, "x86_64", {}) is None
        # a set OPENBLAS_CORETYPE is taken away for the load: "" = OpenBLAS detects
        assert choose_core("auto", flags, "x86_64", {"OPENBLAS_CORETYPE": "Haswell"}) == ""
    assert choose_core("auto", frozenset(), "x86_64", {}) is None  # flags unreadable
    assert choose_core("auto", AVX512, "aarch64", {}) is None


def test_named_request_is_taken_as_it_is() -> None:
    assert choose_core("Haswell", AVX512, "x86_64", {}) == "Haswell"
    assert choose_core(" Zen ", AVX2, "x86_64", {"OPENBLAS_CORETYPE": "SkylakeX"}) == "Zen"


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 avx512f\n\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "avx512f"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.mark.parametrize("before", [None, "Haswell"])
def test_core_for_load_restores_the_environment(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    monkeypatch.setattr(blascore, "cpu_flags", lambda: AVX512)
    monkeypatch.setattr(blascore.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("SHAPEGRAD_BLAS_CORETYPE", "auto")
    if before is None:
        monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_CORETYPE", before)
    with core_for_load() as core:
        assert core == "SkylakeX"
        assert os.environ["OPENBLAS_CORETYPE"] == "SkylakeX"
    assert os.environ.get("OPENBLAS_CORETYPE") == before


_PROBE = """
import json, os, warnings, numpy as np, shapegrad as sg
from shapegrad.backends.c import toolchain
warnings.simplefilter("error", RuntimeWarning)
rng = np.random.default_rng(0)
a = rng.random((128, 300), dtype=np.float32)
b = rng.random((300, 200), dtype=np.float32)
got = np.asarray(sg.compile(lambda x, y: x @ y, backend="c")(a, b))
print(json.dumps({"core": toolchain.blas_core(), "env": os.environ.get("OPENBLAS_CORETYPE"),
                  "err": float(np.abs(got - a.astype(np.float64) @ b).max())}))
"""


def _probe(request: str | None, openblas: str | None) -> dict[str, object]:
    env = dict(os.environ)
    for name, value in (("SHAPEGRAD_BLAS_CORETYPE", request), ("OPENBLAS_CORETYPE", openblas)):
        env.pop(name, None)
        if value is not None:
            env[name] = value
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


needs_x86 = pytest.mark.skipif(not X86, reason="OpenBLAS's x86 kernel sets (Haswell, SkylakeX)")


@needs_x86
def test_named_core_is_loaded_for_shapegrad_only() -> None:
    """``SHAPEGRAD_BLAS_CORETYPE=Haswell`` runs the AVX2 kernels whatever the process-wide
    variable says, and leaves that variable as it was."""
    result = _probe("Haswell", "SkylakeX")
    assert result["core"] == "Haswell"
    assert result["env"] == "SkylakeX"
    assert isinstance(result["err"], float) and result["err"] < 1e-3


@needs_x86
def test_auto_core_follows_this_cpu() -> None:
    result = _probe("auto", "Haswell")
    if cpu_flags() >= SKYLAKEX_FLAGS:
        assert result["core"] == "SkylakeX"
    else:  # OpenBLAS's own detection; never an AVX-512 set on a CPU without AVX-512
        assert result["core"] not in ("SkylakeX", "Cooperlake", "SapphireRapids")
    assert result["env"] == "Haswell"
    assert isinstance(result["err"], float) and result["err"] < 1e-3


@needs_x86
def test_user_openblas_coretype_wins_by_default() -> None:
    assert _probe(None, "Haswell")["core"] == "Haswell"


@needs_x86
def test_default_core_without_user_choice() -> None:
    result = _probe(None, None)
    if cpu_flags() >= SKYLAKEX_FLAGS:
        assert result["core"] == "SkylakeX"
    assert result["env"] is None  # nothing leaks into the environment


@needs_x86
def test_a_core_openblas_does_not_know_is_reported() -> None:
    env = dict(os.environ, SHAPEGRAD_BLAS_CORETYPE="NoSuchCore")
    code = "from shapegrad.backends.c import toolchain; toolchain.blas_paths()"
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not the NoSuchCore kernels" in out.stderr
