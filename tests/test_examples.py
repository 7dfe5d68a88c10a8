"""Every script in examples/ runs as written (with a short epoch count given on the command line)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# script -> (epochs argument, printed metric, lowest acceptable value after those epochs)
CASES = {
    "moons.py": ("3", "training accuracy", 90.0),
    "digits.py": ("3", "test accuracy", 85.0),
    "cnn_digits.py": ("1", "test accuracy", 30.0),
    "custom_loop.py": ("10", "training accuracy", 95.0),
    "char_transformer.py": ("150", "next-character accuracy", 80.0),
    "charlm.py": ("10", "next-character accuracy", 10.0),
    "lstm.py": ("150", "delayed-copy accuracy", 90.0),
    "llama.py": ("60", "next-character accuracy", 25.0),
    "unet.py": ("2", "noise removed", 40.0),
}
NEEDS_SKLEARN = {"digits.py", "cnn_digits.py", "unet.py"}


def test_every_example_has_a_case() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs(script: str) -> None:
    if script in NEEDS_SKLEARN:
        pytest.importorskip("sklearn", reason="the digits examples need scikit-learn")
    epochs, metric, lowest = CASES[script]
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("SHAPEGRAD_DEBUG", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), epochs],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    match = re.search(metric + r": ([0-9.]+)%", output)
    assert match, output
    assert float(match.group(1)) >= lowest, output
