"""The ``shapegrad`` command: ``shapegrad demo moons`` and ``shapegrad demo digits``.

``demo moons`` trains the 2-16-16-1 MLP of :mod:`shapegrad.models` on the moons
dataset with a hinge loss (compiled, C backend by default), then draws the loss
curve, the learning-rate curve and the decision boundary in the terminal.
``demo digits`` trains an MLP on scikit-learn's 8x8 digits and prints the test
accuracy and the confusion matrix.

Example:
    $ shapegrad demo moons
    $ shapegrad demo digits --mode eager --epochs 5
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shapegrad import data, io, models, plot
from shapegrad.backends import BackendUnavailable, backend_status, get_backend, known_backends
from shapegrad.ops.eager import no_grad, tensor
from shapegrad.random import SEED_BOUND, check_seed
from shapegrad.tensor import Tensor
from shapegrad.train import optim, schedules
from shapegrad.train.fit import StepInfo
from shapegrad.train.recipe import resume
from shapegrad.train.trainer import ScalarTrainer

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine", "step")


@dataclass(frozen=True)
class Recipe:
    """The default hyper-parameters of one demo (each can be overridden by a flag)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    schedule: str
    warmup_steps: int = 0


# Tuned so that the default run is fast on a 2-core machine and clears the accuracy bars
# (moons >= 98% training accuracy, digits >= 96% test accuracy) with seed 0.
MOONS = Recipe(
    epochs=20, batch_size=50, lr=0.02, optimizer="adam", schedule="cosine", warmup_steps=20
)
DIGITS = Recipe(
    epochs=30, batch_size=64, lr=0.003, optimizer="adam", schedule="cosine", warmup_steps=20
)


class BadInput(ValueError):
    """A flag value that only the data can refute (printed as one line, exit status 2)."""


@dataclass
class Run:
    """What a finished training run leaves for reporting."""

    trainer: ScalarTrainer
    losses: list[float]
    lrs: list[float]
    seconds: float
    steps: int


# --- arguments -----------------------------------------------------------------------------


def build_parser(explain_backends: bool = True) -> argparse.ArgumentParser:
    """The argument parser of the ``shapegrad`` command."""
    parser = argparse.ArgumentParser(
        prog="shapegrad", description="shapegrad: a shape-typed functional deep-learning framework"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small model and show the results")
    demo.add_argument("name", choices=("moons", "digits"), help="which demo to run")
    demo.add_argument(
        "--backend",
        default="c",
        choices=known_backends(),
        help=(
            "compiled-mode backend (default c; where it cannot run here, e.g. ane off macOS, "
            "falls back to c, or numpy without a C compiler)"
            + (f". Usable here: {_usable_here()}" if explain_backends else "")
        ),
    )
    demo.add_argument("--mode", choices=("compiled", "eager"), default="compiled")
    demo.add_argument("--epochs", type=_positive_int, help="passes over the training data")
    demo.add_argument("--batch-size", type=_positive_int, help="examples per step")
    demo.add_argument("--lr", type=_positive_float, help="peak learning rate")
    demo.add_argument("--optimizer", choices=OPTIMIZERS, help="update rule")
    demo.add_argument("--schedule", choices=SCHEDULES, help="learning-rate schedule")
    demo.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="seed of data, initialisation and shuffling, an int in [0, 2**32)",
    )
    demo.add_argument(
        "--save",
        metavar="FILE",
        help="write a checkpoint here after every epoch (atomically: an interrupted run keeps "
        "the last one)",
    )
    demo.add_argument(
        "--resume",
        metavar="FILE",
        help="start from this checkpoint, written by --save with the same recipe: optimizer, "
        "learning rate, schedule (a non-constant one spans --epochs, so changing --epochs "
        "changes it), batch size, seed, model and data; any difference is refused",
    )
    demo.add_argument(
        "--resume-override",
        action="store_true",
        help="resume even when the checkpoint's recipe differs from this run's (the "
        "differences are printed; another optimizer starts from fresh optimizer state)",
    )
    demo.add_argument(
        "--plot-png", metavar="FILE", help="also save the plots as a PNG (needs matplotlib)"
    )
    demo.add_argument(
        "--dump-ir", metavar="DIR", help="dump every IR stage and the generated code here"
    )
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.add_argument(
        "--data-parallel",
        action="store_true",
        help="under mpiexec: every process trains on its shard of each global batch "
        "(--batch-size), gradients averaged each step; rank 0 prints",
    )
    demo.add_argument(
        "--no-color", action="store_true", help="plain-text plots without ANSI colours"
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _seed(text: str) -> int:
    try:
        return check_seed(int(text), "seed")
    except ValueError:
        bound = SEED_BOUND.bit_length() - 1
        raise argparse.ArgumentTypeError(
            f"must be an int in [0, 2**{bound}), got {text!r}"
        ) from None


def recipe_from(args: argparse.Namespace, default: Recipe) -> Recipe:
    """``default`` with the hyper-parameters given on the command line substituted."""
    overrides = {
        key: getattr(args, key)
        for key in ("epochs", "batch_size", "lr", "optimizer", "schedule")
        if getattr(args, key) is not None
    }
    return replace(default, **overrides)


# --- training ------------------------------------------------------------------------------


def _usable_here() -> str:
    """The backends that compile here, and why the others do not (for ``--help``)."""
    status = backend_status()
    usable = ", ".join(n for n, problem in status.items() if not problem)
    missing = [n for n, problem in status.items() if problem]
    return usable + (f" (not: {', '.join(missing)})" if missing else "")


def resolve_backend(name: str, mode: str) -> str:
    """``name`` if it can run here, else ``"c"`` or ``"numpy"`` (with a message saying why)."""
    if mode == "eager":
        return name
    problem = _cannot_run(name)
    if problem is None:
        return name
    if name == "numpy":
        raise BackendUnavailable(problem)
    fallback = "c" if name != "c" and _cannot_run("c") is None else "numpy"
    print(f"shapegrad: {problem}", file=sys.stderr)
    print(f"shapegrad: falling back to the '{fallback}' backend", file=sys.stderr)
    return fallback


def _cannot_run(name: str) -> str | None:
    """Why backend ``name`` cannot compile *and execute* here (None: it can)."""
    try:
        get_backend(name)
    except BackendUnavailable as error:
        return str(error)
    if name == "ane":  # it builds programs everywhere but executes them only on macOS 13+
        from shapegrad.backends.ane.executable import can_execute

        ok, reason = can_execute()
        if not ok:
            return f"the ane backend cannot execute here: {reason}"
    return None


def make_optimizer(name: str, lr: float) -> optim.Optimizer:
    """The optimizer called ``name`` (one of :data:`OPTIMIZERS`) with learning rate ``lr``."""
    if name == "sgd":
        return optim.SGD(lr=lr)
    if name == "momentum":
        return optim.SGD(lr=lr, momentum=0.9)
    if name == "nesterov":
        return optim.SGD(lr=lr, momentum=0.9, nesterov=True)
    if name == "adam":
        return optim.Adam(lr=lr)
    if name == "adamw":
        return optim.AdamW(lr=lr, weight_decay=1e-4)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")


def make_schedule(recipe: Recipe, total_steps: int) -> schedules.Schedule:
    """The learning-rate schedule of ``recipe`` over ``total_steps`` updates."""
    warmup = min(recipe.warmup_steps, max(total_steps - 1, 0))
    if recipe.schedule == "constant":
        return schedules.constant(recipe.lr)
    if recipe.schedule == "linear":
        return schedules.linear_decay(recipe.lr, max(total_steps, 1))
    if recipe.schedule == "cosine":
        return schedules.cosine_with_warmup(recipe.lr, max(total_steps, 1), warmup)
    if recipe.schedule == "step":
        return schedules.step_decay(recipe.lr, max(total_steps // 3, 1), gamma=0.3)
    raise ValueError(f"unknown schedule {recipe.schedule!r}; choose one of {SCHEDULES}")


def train(
    args: argparse.Namespace,
    recipe: Recipe,
    loss: Callable[..., Tensor],
    params: Any,
    batches: data.Batches,
    about: dict[str, str] | None = None,
) -> Run:
    """Train ``loss`` from ``params`` over ``batches`` as ``args`` and ``recipe`` say.

    With ``--resume`` the run continues from the checkpoint up to ``recipe.epochs``
    epochs in all (same schedule, same shuffling), so an interrupted run resumed
    gives the same result as an uninterrupted one; a checkpoint of another recipe
    (:func:`run_recipe`; ``about`` names the demo, model and data) is refused unless
    ``--resume-override``. With ``--save`` a checkpoint is written after every epoch
    (atomically, with the recipe), so a crash loses at most one epoch.
    """
    if recipe.batch_size > batches.n:  # a padded batch that size would only repeat rows
        raise BadInput(
            f"--batch-size {recipe.batch_size} exceeds the {batches.n} training examples"
        )
    backend = resolve_backend(args.backend, args.mode)
    per_epoch = len(batches)
    this_run = run_recipe(recipe, per_epoch, args.seed, about or {})
    trainer = ScalarTrainer(
        loss,
        params,
        mode=args.mode,
        backend=backend,
        optimizer=make_optimizer(recipe.optimizer, recipe.lr),
        schedule=make_schedule(recipe, recipe.epochs * per_epoch),
        data_parallel=args.data_parallel,
    )
    done = (
        _resume(trainer, args.resume, per_epoch, this_run, args.resume_override)
        if args.resume
        else 0
    )
    batches.epoch = done  # continue the shuffling sequence where the saved run stopped
    notes = {"recipe": this_run, "steps_per_epoch": per_epoch}
    callbacks = [_saver(args.save, per_epoch, notes)] if args.save else []
    start = time.perf_counter()
    losses: list[float] = []
    lrs: list[float] = []
    if done < recipe.epochs:
        history = trainer.fit(
            batches,
            epochs=recipe.epochs - done,
            callbacks=callbacks,
            progress=not args.no_progress,
        )
        losses, lrs = list(history.loss), list(history.lr)
    else:
        print(f"the checkpoint already has all {recipe.epochs} epochs; evaluating it")
    return Run(trainer, losses, lrs, time.perf_counter() - start, len(losses))


def run_recipe(recipe: Recipe, per_epoch: int, seed: int, about: dict[str, str]) -> dict[str, Any]:
    """What determines a run's numbers, as recorded in its checkpoints and compared on
    ``--resume``: the demo, model and data (``about``), optimizer, learning rate, schedule
    (with the steps it spans unless constant), batch size and seed. ``--mode`` and
    ``--backend`` are not part of it (the same math on another interpreter)."""
    spans = None if recipe.schedule == "constant" else recipe.epochs * per_epoch
    return {
        **about,
        "optimizer": recipe.optimizer,
        "lr": recipe.lr,
        "schedule": recipe.schedule,
        "schedule_steps": spans,
        "warmup_steps": recipe.warmup_steps if recipe.schedule == "cosine" else None,
        "batch_size": recipe.batch_size,
        "seed": seed,
    }


_RECIPE_LABELS = {
    "batch_size": "--batch-size",
    "seed": "--seed",
    "optimizer": "--optimizer",
    "lr": "--lr",
    "schedule": "--schedule",
    "schedule_steps": "schedule length in steps (--epochs x batches per epoch)",
}


def _resume(
    trainer: ScalarTrainer, path: str, per_epoch: int, recipe: dict[str, Any], override: bool
) -> int:
    """Load ``path`` into ``trainer`` after checking its recipe; returns the completed epochs.

    Raises:
        RecipeMismatch: the checkpoint was written with another recipe and ``override`` is
            False (another optimizer, learning rate or batch size would make the resumed
            run differ from the saved one, and another batch size miscounts its epochs).
    """
    resumed = resume(
        trainer, path, recipe, override=override, labels=_RECIPE_LABELS,
        how_to_override="pass --resume-override to resume it anyway",
    )  # fmt: skip
    if resumed.differences:
        print(f"shapegrad: resuming despite: {'; '.join(resumed.differences)}", file=sys.stderr)
    if resumed.fresh_optimizer is not None:
        print(
            f"shapegrad: the checkpoint's optimizer is {resumed.fresh_optimizer}: "
            f"{type(trainer.optimizer).__name__} starts from a fresh state",
            file=sys.stderr,
        )
    print(f"resumed from {path} at step {resumed.step}")
    saved_per_epoch = resumed.notes.get("steps_per_epoch")  # as the saved run counted epochs
    if not (isinstance(saved_per_epoch, int) and saved_per_epoch > 0):
        saved_per_epoch = per_epoch
    return resumed.step // saved_per_epoch


def _saver(
    path: str, per_epoch: int, notes: dict[str, Any]
) -> Callable[[ScalarTrainer, StepInfo], None]:
    """A ``fit`` callback writing a checkpoint (with ``notes``: the recipe) to ``path`` at the
    end of every epoch."""

    def save(trainer: ScalarTrainer, info: StepInfo) -> None:
        if info.step % per_epoch == 0:
            trainer.save_checkpoint(path, notes)  # data parallel: rank 0 writes, others wait

    return save


def _shard(args: argparse.Namespace) -> Any:
    """The communicator batches are sharded over (``--data-parallel``), else None."""
    from shapegrad import distributed

    return distributed.world() if args.data_parallel else None


def _describe(name: str, recipe: Recipe, args: argparse.Namespace, trainer: ScalarTrainer) -> str:
    where = f"compiled, backend={trainer.backend}" if args.mode == "compiled" else "eager"
    return (
        f"{name}: {recipe.optimizer} lr={recipe.lr:g} ({recipe.schedule}), "
        f"batch {recipe.batch_size}, {recipe.epochs} epochs, {where}"
    )


# --- demo moons ----------------------------------------------------------------------------


def demo_moons(args: argparse.Namespace) -> int:
    """Train the moons MLP, report training accuracy and draw the three plots."""
    recipe = recipe_from(args, MOONS)
    x, y = data.make_moons(n=1000, noise=0.1, seed=args.seed)
    signs = (2 * y - 1).astype(np.float32)  # hinge loss wants labels in {-1, +1}
    params = models.MoonsMLP.init(models.kaiming, seed=args.seed, h=16)
    batches = data.Batches(
        x, signs, batch_size=recipe.batch_size, seed=args.seed, last="pad", shard=_shard(args)
    )
    print(f"moons: {len(x)} points, MLP 2-16-16-1, hinge loss")
    about = {"demo": "moons", "model": "MoonsMLP h=16", "data": "make_moons n=1000 noise=0.1"}
    run = train(args, recipe, models.moons_loss, params, batches, about)
    print(_describe("trained", recipe, args, run.trainer))
    trained = run.trainer.get_params()

    def classify(points: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
        with no_grad():
            scores = models.moons_scores(trained, tensor(points)).numpy()
        return (scores > 0).astype(np.int64)

    correct = int((classify(x) == y).sum())
    print(f"training accuracy: {100 * correct / len(y):.2f}% ({correct}/{len(y)})")
    print(f"training time: {run.seconds:.2f} s for {run.steps} steps")
    color = not args.no_color and plot.use_color()
    _print_curves(run, "loss (hinge)", with_lr=True)
    print()
    print(
        plot.decision_boundary(
            classify, x, y, width=64, height=22, title="decision boundary", color=color
        )
    )
    if args.plot_png:
        _png(args.plot_png, run, classify, x, y)
    return 0


# --- demo digits ---------------------------------------------------------------------------


def demo_digits(args: argparse.Namespace) -> int:
    """Train the digits MLP, report test accuracy and the confusion matrix."""
    recipe = recipe_from(args, DIGITS)
    split = data.load_digits(test_fraction=0.2, seed=args.seed)
    params = models.DigitsMLP.init(models.kaiming, seed=args.seed, h=64)
    batches = data.Batches(
        split.x_train,
        split.y_train,
        batch_size=recipe.batch_size,
        seed=args.seed,
        last="pad",
        shard=_shard(args),
    )
    print(
        f"digits: {len(split.x_train)} training / {len(split.x_test)} test images, MLP 64-64-64-10"
    )
    about = {"demo": "digits", "model": "DigitsMLP h=64", "data": "load_digits test=0.2"}
    run = train(args, recipe, models.digits_loss, params, batches, about)
    print(_describe("trained", recipe, args, run.trainer))
    trained = run.trainer.get_params()
    with no_grad():
        predicted = models.digits_logits(trained, tensor(split.x_test)).numpy().argmax(axis=1)
    correct = int((predicted == split.y_test).sum())
    print(
        f"test accuracy: {100 * correct / len(split.y_test):.2f}% ({correct}/{len(split.y_test)})"
    )
    print(f"training time: {run.seconds:.2f} s for {run.steps} steps")
    print()
    print(format_confusion(confusion_matrix(split.y_test, predicted, 10)))
    _print_curves(run, "loss (cross-entropy)", with_lr=False)
    if args.plot_png:
        _png(args.plot_png, run)
    return 0


def confusion_matrix(
    labels: npt.NDArray[np.integer], predicted: npt.NDArray[np.integer], classes: int
) -> npt.NDArray[np.int64]:
    """``m[i, j]`` = number of examples of class ``i`` predicted as ``j``.

    Example:
        >>> confusion_matrix(np.array([0, 1, 1]), np.array([0, 0, 1]), 2).tolist()
        [[1, 0], [1, 1]]
    """
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix


def format_confusion(matrix: npt.NDArray[np.int64]) -> str:
    """The confusion matrix as a table: rows are true classes, columns predictions."""
    width = max(3, len(str(int(matrix.max()))) + 1)
    classes = range(matrix.shape[0])
    lines = ["confusion matrix (rows: true digit, columns: predicted)"]
    lines.append("     " + "".join(f"{j:>{width}}" for j in classes))
    for i in classes:
        cells = "".join(f"{int(matrix[i, j]) or '.':>{width}}" for j in classes)
        lines.append(f"  {i:>2} {cells}")
    return "\n".join(lines)


def _print_curves(run: Run, loss_title: str, with_lr: bool) -> None:
    """The loss (and learning-rate) curves of ``run``; nothing when no step ran."""
    if not run.losses:
        return
    print()
    print(plot.line_chart(run.losses, title=loss_title, width=60, height=8, y_min=0.0))
    if with_lr:
        print()
        print(plot.line_chart(run.lrs, title="learning rate", width=60, height=6, y_min=0.0))


def _png(path: str, run: Run, *boundary: Any) -> None:
    try:
        plot.save_png(path, {"loss": run.losses, "learning rate": run.lrs}, *boundary)
    except ImportError as error:
        print(f"shapegrad: {error}; skipping {path}", file=sys.stderr)
        return
    print(f"saved plots to {path}")


# --- entry point ---------------------------------------------------------------------------


def _output_problem(flag: str, path: str | None) -> str | None:
    """Why the file ``path`` given to ``flag`` cannot be written (None: it can, or no path).

    Checked before training so that a typo does not cost a whole run: the path must not be
    a directory, and its folder must exist (or be creatable) and be writable.
    """
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path}: is a directory; give a file name"
    if target.exists() and not target.is_file():
        return f"{flag} {path}: not a regular file"
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"{flag} {path}: cannot create its folder {folder}: {error.strerror or error}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{flag} {path}: the folder {folder} is not writable"
    return None


def _make_dump_dir(path: str) -> str | None:
    """Create the ``--dump-ir`` folder; the reason it cannot be, or None."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"--dump-ir {path}: exists and is not a directory"
    except OSError as error:
        return f"--dump-ir {path}: cannot create the directory: {error.strerror or error}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--dump-ir {path}: the directory is not writable"
    return None


DEMOS: dict[str, Callable[[argparse.Namespace], int]] = {"moons": demo_moons, "digits": demo_digits}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shapegrad`` command with ``argv`` (default: the process arguments)."""
    words = sys.argv[1:] if argv is None else list(argv)
    # probing every backend costs ~1 s of imports: only --help shows the result
    args = build_parser(explain_backends="-h" in words or "--help" in words).parse_args(argv)
    if args.plot_png:  # say so now, not after a whole training run
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            print("shapegrad: --plot-png needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
    problem = _output_problem("--save", args.save) or _output_problem("--plot-png", args.plot_png)
    if problem is None and args.dump_ir:
        problem = _make_dump_dir(args.dump_ir)
    if problem is not None:  # say so now, not after a whole training run
        print(f"shapegrad: {problem}", file=sys.stderr)
        return 2
    if args.data_parallel and _shard(args).rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the process's life) rank 0 reports
    if args.dump_ir:
        # the compiler reads this when it compiles, which happens after this point
        os.environ["SHAPEGRAD_DEBUG"] = str(Path(args.dump_ir).resolve())
        print(f"dumping every IR stage and the generated code to {args.dump_ir}")
        if args.mode == "eager":
            print("(eager mode compiles nothing, so nothing will be dumped)")
    try:
        return DEMOS[args.name](args)
    except BadInput as error:
        print(f"shapegrad: {error}", file=sys.stderr)
        return 2
    except ImportError as error:  # an optional dependency, e.g. scikit-learn for digits
        print(f"shapegrad: {error}", file=sys.stderr)
        return 2
    except (io.CheckpointError, OSError) as error:  # --resume / --save: say what, no traceback
        print(f"shapegrad: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; checkpoints are atomic
        kept = f"; the checkpoint {args.save} holds the last finished epoch" if args.save else ""
        print(f"\nshapegrad: interrupted{kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
