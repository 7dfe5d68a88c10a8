"""The command line and the progress bar as a user meets them (issue 17, items 14 and 15)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import cli, data, models

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src"), **extra}
    env.pop("SHAPEGRAD_DEBUG", None)
    return env


def _cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shapegrad.cli", *args],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=300,
    )


# --- item 14: the progress bar --------------------------------------------------------------


def _moons_fit(
    mode: str, backend: str, epochs: int, capsys: pytest.CaptureFixture[str]
) -> tuple[str, sg.train.fit.History]:
    x, y = data.make_moons(n=200, noise=0.1, seed=0)
    batches = data.Batches(x, (2 * y - 1).astype(np.float32), batch_size=20, seed=0)
    params = models.MoonsMLP.init(models.kaiming, seed=0, h=16)
    trainer = sg.ScalarTrainer(
        models.moons_loss, params, mode=mode, backend=backend, optimizer=sg.optim.Adam(0.01)
    )
    capsys.readouterr()
    history = trainer.fit(batches, epochs=epochs, progress=True)
    return capsys.readouterr().err, history


def _final_postfix(err: str) -> dict[str, str]:
    last = [seg for seg in re.split(r"[\r\n]", err) if "step" in seg][-1]
    return dict(re.findall(r"(\w+)=([0-9.e+-]+(?:,[0-9]{3})*(?:\.[0-9]+)?)", last))


@pytest.mark.parametrize(("mode", "backend"), [("compiled", "numpy"), ("eager", "numpy")])
def test_progress_bar_final_state_shows_the_last_epoch_loss_and_rate(
    mode: str, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err, history = _moons_fit(mode, backend, 6, capsys)
    final = _final_postfix(err)
    assert final["epoch"] == "6"
    assert float(final["loss"]) == pytest.approx(history.loss[-1], abs=6e-5)
    examples = 20 * len(history.loss)
    overall = examples / history.seconds  # includes the first (compiling) step: a lower bound
    assert float(final["ex_s"].replace(",", "")) >= 0.5 * overall


def test_first_compiled_step_shows_compiling_and_is_kept_out_of_the_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err, _ = _moons_fit("compiled", "numpy", 2, capsys)
    assert "compiling…" in err
    after = err[err.index("compiling…") :]
    assert re.search(r"\b1/20\b", after)  # the first step is counted once it is done
    eager_err, _ = _moons_fit("eager", "numpy", 1, capsys)
    assert "compiling…" not in eager_err


# --- item 15: Ctrl-C, ane fallback, help text, --plot-png ------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_with_one_line_and_an_intact_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "run.npz"
    flags = ["--mode", "eager", "--epochs", "100000", "--save", str(ckpt), "--no-progress"]
    child = subprocess.Popen(
        [sys.executable, "-m", "shapegrad.cli", "demo", "moons", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        # A shell without job control starts background jobs with SIGINT ignored, and the
        # child would inherit that (Python then installs no KeyboardInterrupt handler):
        # give it the disposition of a terminal's foreground process, as a user's Ctrl-C has.
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 120
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.exists()
    time.sleep(0.3)  # land somewhere in the middle of the next epochs (or their saves)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"shapegrad: interrupted; the checkpoint {ckpt} holds the last finished epoch"
    )
    params = models.MoonsMLP.init(models.kaiming, seed=0, h=16)
    trainer = sg.ScalarTrainer(models.moons_loss, params, optimizer=sg.optim.Adam(0.02))
    loaded = sg.load_checkpoint(ckpt, trainer.get_params(), trainer.optimizer_state())
    assert loaded.step > 0 and loaded.step % 20 == 0  # whole epochs of 20 steps
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]  # no temp file left


@pytest.mark.skipif(platform.system() == "Darwin", reason="macOS can execute the ane backend")
def test_backend_ane_off_macos_falls_back_as_help_promises() -> None:
    done = _cli("demo", "moons", "--backend", "ane", "--epochs", "1", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    fallback = "c" if shutil.which("cc") else "numpy"
    assert f"falling back to the '{fallback}' backend" in done.stderr
    assert "cannot execute here" in done.stderr
    assert f"compiled, backend={fallback}" in done.stdout


def test_save_help_agrees_with_the_readme() -> None:
    help_text = " ".join(
        cli.build_parser()
        ._subparsers._group_actions[0]
        .choices["demo"]  # type: ignore[union-attr]
        .format_help()
        .split()
    )
    readme = (ROOT / "README.md").read_text()
    (line,) = [row for row in readme.splitlines() if "--save run.npz" in row]
    assert "every epoch" in line and "after every epoch" in help_text
    assert "falls back" in help_text and "ane" in help_text


def test_plot_png_without_matplotlib_fails_before_training(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    start = time.perf_counter()
    done = _cli(
        "demo", "moons", "--plot-png", str(tmp_path / "p.png"), "--mode", "eager",
        PYTHONPATH=f"{fake}{os.pathsep}{ROOT / 'src'}",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--plot-png needs matplotlib" in done.stderr
    assert "training accuracy" not in done.stdout and "moons:" not in done.stdout
    assert time.perf_counter() - start < 30
