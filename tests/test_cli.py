"""The `shapegrad` command end to end, run as a subprocess like a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shapegrad import cli, data

SCRIPT = Path(sys.executable).with_name("shapegrad")


def shapegrad(*args: str, **env_overrides: str) -> tuple[str, float]:
    """Run the installed console script; returns (stdout + stderr, wall seconds)."""
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "shapegrad.cli"]
    env = {**os.environ, "NO_COLOR": "1", **env_overrides}
    env.pop("SHAPEGRAD_DEBUG", None)
    start = time.perf_counter()
    done = subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=300)
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output, seconds


def percent(pattern: str, output: str) -> float:
    match = re.search(pattern + r": ([0-9.]+)%", output)
    assert match, output
    return float(match.group(1))


def moons_accuracy_numpy(checkpoint: Path, seed: int = 0) -> float:
    """Training accuracy of saved moons parameters, recomputed with plain NumPy."""
    stored = np.load(checkpoint)
    w1, b1, w2, b2, w3, b3 = (
        stored[f"params/{n}"].astype(np.float64) for n in ("w1", "b1", "w2", "b2", "w3", "b3")
    )
    x, y = data.make_moons(n=1000, noise=0.1, seed=seed)
    h = np.maximum(x @ w1.T + b1, 0)
    h = np.maximum(h @ w2.T + b2, 0)
    scores = (h @ w3.T + b3)[:, 0]
    return float(((scores > 0) == (y == 1)).mean())


def test_console_script_is_installed() -> None:
    assert SCRIPT.exists(), f"{SCRIPT} missing: run `pip install -e .`"


def test_demo_moons_default_run_is_accurate_fast_and_plots() -> None:
    output, seconds = shapegrad("demo", "moons")
    assert percent("training accuracy", output) >= 98.0
    assert seconds < 15.0, f"`shapegrad demo moons` took {seconds:.1f} s"
    for title in ("loss (hinge)", "learning rate", "decision boundary"):
        assert title in output
    assert re.search(r"[\u2801-\u28ff]", output)  # Braille line charts
    board = output[output.index("decision boundary") :].splitlines()[2:24]
    assert sum(row.count("o") for row in board) > 50 and sum(row.count("x") for row in board) > 50
    assert "400/400" in output  # the progress bar reached the end


def test_demo_moons_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    flags = ["--schedule", "constant", "--backend", "numpy", "--no-progress"]
    full, part = tmp_path / "full.npz", tmp_path / "part.npz"
    out_full, _ = shapegrad("demo", "moons", "--epochs", "4", "--save", str(full), *flags)
    shapegrad("demo", "moons", "--epochs", "2", "--save", str(part), *flags)
    out_resumed, _ = shapegrad(
        "demo", "moons", "--epochs", "4", "--resume", str(part), "--save", str(part), *flags
    )
    assert "resumed from" in out_resumed and "at step 40" in out_resumed
    a, b = np.load(full), np.load(part)
    for name in ("w1", "b1", "w2", "b2", "w3", "b3"):
        np.testing.assert_allclose(a[f"params/{name}"], b[f"params/{name}"], rtol=1e-6, atol=1e-7)
    # the printed accuracy is the accuracy of the saved parameters
    assert percent("training accuracy", out_full) == pytest.approx(
        100 * moons_accuracy_numpy(full), abs=0.01
    )


def test_resume_from_a_bad_checkpoint_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint")
    for path, message in ((garbage, "garbage.npz"), (tmp_path / "missing.npz", "does not exist")):
        code = cli.main(
            ["demo", "moons", "--resume", str(path), "--mode", "eager", "--no-progress"]
        )
        assert code == 1
        err = capsys.readouterr().err
        assert err.startswith("shapegrad: ") and message in err and "Traceback" not in err


def test_demo_moons_dump_ir_and_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot-png needs matplotlib")
    dump, png = tmp_path / "ir", tmp_path / "moons.png"
    output, _ = shapegrad(
        "demo", "moons", "--epochs", "1", "--dump-ir", str(dump), "--plot-png", str(png),
        "--no-progress",
    )  # fmt: skip
    assert f"saved plots to {png}" in output
    assert png.read_bytes()[:4] == b"\x89PNG"
    names = {p.name for p in dump.rglob("*") if p.is_file()}
    assert "000_traced.txt" in names, names  # the IR as traced, before any pass
    if "falling back" not in output:  # with a C compiler, the generated source is dumped too
        assert any(name.endswith(".c") for name in names), names


def test_demo_moons_falls_back_to_numpy_without_a_c_compiler() -> None:
    output, _ = shapegrad(
        "demo", "moons", "--epochs", "2", "--no-progress", CC="shapegrad-no-such-compiler"
    )
    assert "falling back to the 'numpy' backend" in output
    assert "compiled, backend=numpy" in output
    assert percent("training accuracy", output) > 80.0


def test_demo_digits_reaches_96_percent_test_accuracy() -> None:
    pytest.importorskip("sklearn", reason="digits need scikit-learn")
    output, _ = shapegrad("demo", "digits", "--no-progress")
    accuracy = percent("test accuracy", output)
    assert accuracy >= 96.0
    # table rows: the true digit, then 10 counts ('.' for zero); the header has no row label
    tokens = (line.split() for line in output.splitlines())
    rows = [t[1:] for t in tokens if len(t) == 11 and all(c == "." or c.isdigit() for c in t)]
    matrix = np.array([[0 if c == "." else int(c) for c in row] for row in rows])
    assert matrix.shape == (10, 10) and matrix.sum() == 359  # 20% of each class held out
    assert 100 * np.trace(matrix) / matrix.sum() == pytest.approx(accuracy, abs=0.01)


def test_confusion_matrix_counts_pairs() -> None:
    labels = np.array([0, 0, 1, 2, 2, 2])
    predicted = np.array([0, 1, 1, 2, 0, 2])
    expected = np.zeros((3, 3), dtype=int)
    for t, p in zip(labels, predicted, strict=True):
        expected[t, p] += 1
    np.testing.assert_array_equal(cli.confusion_matrix(labels, predicted, 3), expected)


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "mnist"],
        ["demo", "moons", "--epochs", "0"],
        ["demo", "moons", "--lr", "-1"],
        ["demo", "moons", "--backend", "bogus"],
    ],
)
def test_bad_arguments_are_rejected_with_usage(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    assert "usage: shapegrad" in capsys.readouterr().err


def test_recipe_flags_override_defaults() -> None:
    args = cli.build_parser().parse_args(["demo", "moons", "--lr", "0.5", "--optimizer", "sgd"])
    recipe = cli.recipe_from(args, cli.MOONS)
    assert recipe.lr == 0.5 and recipe.optimizer == "sgd"
    assert recipe.epochs == cli.MOONS.epochs and recipe.batch_size == cli.MOONS.batch_size


# --- bad input: one clear line, nonzero exit, no traceback (issue 24, item 14) ----------------

QUICK = ["--mode", "eager", "--epochs", "1", "--no-progress"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "inf"], "argument --lr: must be a finite number > 0, got inf"),
        (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
        (["--lr", "fast"], "argument --lr: must be a number > 0, got 'fast'"),
        (["--seed", "-1"], "argument --seed: must be an int in [0, 2**32), got '-1'"),
        (["--seed", str(2**64)], "argument --seed: must be an int in [0, 2**32)"),
        (["--epochs", "two"], "argument --epochs: must be an int >= 1, got 'two'"),
    ],
)
def test_bad_values_are_refused_by_the_parser(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "moons", *flags, *QUICK])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_impossible_paths_and_sizes_fail_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        (["--dump-ir", str(a_file)], f"--dump-ir {a_file}: exists and is not a directory"),
        (["--dump-ir", str(a_file / "ir")], f"--dump-ir {a_file / 'ir'}: cannot create the directory"),
        (["--save", str(tmp_path)], f"--save {tmp_path}: is a directory; give a file name"),
        (["--save", str(a_file / "run.npz")], f"--save {a_file / 'run.npz'}: cannot create its folder"),
        (["--batch-size", "999999999"], "--batch-size 999999999 exceeds the 1000 training examples"),
    ]
    for flags, message in cases:
        assert cli.main(["demo", "moons", *flags, *QUICK]) == 2
        out, err = capsys.readouterr()
        assert err.strip() == f"shapegrad: {message}" or err.startswith(f"shapegrad: {message}")
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "training accuracy" not in out  # refused before training


def test_the_cli_subprocess_prints_one_line_for_bad_seed_and_dump_ir(tmp_path: Path) -> None:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "shapegrad.cli"]
    env = {**os.environ, "NO_COLOR": "1"}
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for flags in (["--seed", "-1"], ["--dump-ir", str(a_file)], ["--lr", "inf"]):
        done = subprocess.run(
            [*command, "demo", "moons", *flags, *QUICK], capture_output=True, text=True, env=env,
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        errors = [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " "))]
        assert len(errors) == 1, done.stderr


# --- --resume checks the recipe (issue 24, item 9) ---------------------------------------------


@pytest.fixture(scope="module")
def adamw_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("resume") / "adamw.npz"
    code = cli.main(["demo", "moons", "--optimizer", "adamw", "--save", str(path), *QUICK])
    assert code == 0
    return path


@pytest.mark.parametrize(
    "flags, difference",
    [
        (["--optimizer", "adam"], "--optimizer adamw (this run: adam)"),
        (["--optimizer", "adamw", "--batch-size", "25"], "--batch-size 50 (this run: 25)"),
        (["--optimizer", "adamw", "--seed", "3"], "--seed 0 (this run: 3)"),
        (["--optimizer", "adamw", "--lr", "0.5"], "--lr 0.02 (this run: 0.5)"),
    ],
)
def test_resume_refuses_another_recipe(
    adamw_checkpoint: Path, flags: list[str], difference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = adamw_checkpoint.read_bytes()
    code = cli.main(["demo", "moons", *flags, "--resume", str(adamw_checkpoint), *QUICK])
    assert code == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"shapegrad: {adamw_checkpoint} was written with another recipe")
    assert difference in err and "--resume-override" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "resumed from" not in out and "training accuracy" not in out
    assert adamw_checkpoint.read_bytes() == before


def test_resume_with_the_same_recipe_continues_and_override_is_explicit(
    adamw_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = ["demo", "moons", "--optimizer", "adamw", "--resume", str(adamw_checkpoint), *QUICK]
    assert cli.main(same) == 0
    out, err = capsys.readouterr()
    assert "resumed from" in out and "already has all 1 epochs" in out and err == ""
    # override: another optimizer resumes the parameters with a fresh optimizer state
    copy = tmp_path / "copy.npz"
    copy.write_bytes(adamw_checkpoint.read_bytes())
    flags = ["--optimizer", "adam", "--epochs", "2", "--resume-override", "--save", str(copy)]
    assert cli.main(["demo", "moons", *flags, "--resume", str(copy), "--mode", "eager", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "resuming despite: --optimizer adamw (this run: adam)" in err
    assert "Adam starts from a fresh state" in err and "at step 20" in out
    stored = np.load(copy)
    assert stored["optimizer/step"] == 20  # the 20 steps of epoch 2 with a fresh Adam
    assert int(json_metadata(copy)["step"]) == 40


def test_resume_refuses_a_checkpoint_without_a_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bare.npz"
    trainer = sg_trainer_for_moons()
    trainer.save_checkpoint(path)
    code = cli.main(["demo", "moons", "--resume", str(path), *QUICK])
    assert code == 1
    assert "it records no recipe" in capsys.readouterr().err


def json_metadata(path: Path) -> dict[str, Any]:
    import json

    return dict(json.loads(str(np.load(path)["__metadata__"])))


def sg_trainer_for_moons() -> Any:
    from shapegrad import models
    from shapegrad.train import ScalarTrainer, optim

    params = models.MoonsMLP.init(models.kaiming, seed=0, h=16)
    return ScalarTrainer(models.moons_loss, params, optimizer=optim.Adam(lr=0.02))
