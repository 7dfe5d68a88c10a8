"""Checkpoints: resume equals an uninterrupted run; bad files and mismatches raise clear errors;
a crash mid-save leaves the previous checkpoint intact."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import io
from shapegrad.io import CheckpointError
from shapegrad.train import ScalarTrainer, optim, schedules
from test_optim import BACKENDS
from test_trainer import MLP, hinge_loss, mlp_params, moons

MODES = [{"mode": "eager"}, *({"mode": "compiled", "backend": b} for b in BACKENDS)]
IDS = ["eager", *(f"compiled-{b}" for b in BACKENDS)]


def _trainer(params: Any = None, **kw: Any) -> ScalarTrainer:
    kw.setdefault("optimizer", optim.Adam(0.01))
    kw.setdefault("schedule", schedules.cosine_with_warmup(0.02, 100, warmup_steps=10))
    return ScalarTrainer(hinge_loss, params if params is not None else mlp_params(), **kw)


def _batch(k: int, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = slice(k % 4 * 32, (k % 4 + 1) * 32)
    return x[rows], y[rows]


# float16 eager is the slowest combination (NumPy half-precision einsums) and runs the same
# step function as compiled float16, so it is left out to keep the suite fast.
RESUME_CASES = [(kw, None) for kw in MODES] + [(kw, "float16") for kw in MODES[1:]]


@pytest.mark.parametrize(
    ("kw", "dtype"),
    RESUME_CASES,
    ids=[f"{i}-{d}" for i, (_, d) in zip(IDS + IDS[1:], RESUME_CASES, strict=True)],
)
def test_resume_at_50_equals_uninterrupted_100(
    kw: dict[str, Any], dtype: str | None, tmp_path: Path
) -> None:
    x, y = moons(128)
    full = _trainer(dtype=dtype, **kw)
    straight = [full.step(*_batch(k, x, y)) for k in range(100)]

    first = _trainer(dtype=dtype, **kw)
    for k in range(50):
        first.step(*_batch(k, x, y))
    path = first.save_checkpoint(tmp_path / "run.npz")
    resumed = _trainer(
        mlp_params(seed=123), dtype=dtype, **kw
    )  # different init: must be overwritten
    ckpt = resumed.load_checkpoint(path)
    assert ckpt.step == 50 and resumed.global_step == 50
    assert ckpt.metadata["user"]["schedule_step"] == 50
    tail = [resumed.step(*_batch(k, x, y)) for k in range(50, 100)]
    np.testing.assert_array_equal(tail, straight[50:])
    for a, b in zip(resumed.get_params(), full.get_params(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert resumed.current_lr() == full.current_lr()


def test_file_uses_paramlist_names_and_round_trips(tmp_path: Path) -> None:
    params = mlp_params()
    opt = optim.SGD(0.1, momentum=0.9)
    state = opt.init(params)
    path = sg.save_checkpoint(tmp_path / "c.npz", params, state, step=7, metadata={"note": "hi"})
    with np.load(path) as npz:
        names = set(npz.files)
    assert {f"params/{n}" for n in MLP.names} <= names
    assert {f"optimizer/momentum/{n}" for n in MLP.names} <= names and "optimizer/step" in names
    ckpt = sg.load_checkpoint(path, params, state)
    assert isinstance(ckpt.params, MLP) and ckpt.params.names == MLP.names
    assert ckpt.step == 7 and ckpt.metadata["user"] == {"note": "hi"}
    for a, b in zip(ckpt.params, params, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not list(tmp_path.glob(".*tmp"))


def test_corrupted_checkpoint_raises_clear_error(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", mlp_params())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        sg.load_checkpoint(path, mlp_params())
    path.write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError, match="not a readable"):
        sg.load_checkpoint(path, mlp_params())
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"not a readable|not a shapegrad"):
        sg.load_checkpoint(tmp_path / "plain.npz", mlp_params())
    with pytest.raises(CheckpointError, match="does not exist"):
        sg.load_checkpoint(tmp_path / "missing.npz", mlp_params())


def test_mismatched_checkpoint_raises_clear_error(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", mlp_params())
    smaller = MLP.init(sg.nn.init.kaiming, h=8)
    with pytest.raises(CheckpointError, match=r"'params/w1' is float32\[16, 2\].*float32\[8, 2\]"):
        sg.load_checkpoint(path, smaller)
    with pytest.raises(CheckpointError, match="float64"):
        sg.load_checkpoint(path, MLP.init(sg.nn.init.kaiming, dtype="float64", h=16))
    renamed = MLP(list(mlp_params()), names=("a", "b", "c", "d", "e", "f"))
    with pytest.raises(CheckpointError, match=r"names do not match.*missing \['a'"):
        sg.load_checkpoint(path, renamed)


def test_trainer_refuses_a_checkpoint_from_another_optimizer(tmp_path: Path) -> None:
    x, y = moons(32)
    sgd = _trainer(optimizer=optim.SGD(0.1, momentum=0.9), schedule=None)
    sgd.step(x, y)
    path = sgd.save_checkpoint(tmp_path / "sgd.npz")
    with pytest.raises(CheckpointError, match="optimizer"):
        _trainer(optimizer=optim.Adam(0.1)).load_checkpoint(path)
    with pytest.raises(CheckpointError, match="extra"):
        _trainer(optimizer=optim.SGD(0.1, momentum=0.9), dtype="float16").load_checkpoint(path)


def test_crash_mid_save_leaves_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_params = mlp_params(seed=1)
    path = sg.save_checkpoint(tmp_path / "c.npz", old_params, step=1)
    original = path.read_bytes()

    def crash_halfway(handle: IO[bytes], arrays: Any) -> None:
        handle.write(b"PK\x03\x04 partial zip data")  # some bytes reach the disk...
        raise KeyboardInterrupt("simulated crash during write")  # ...then the process dies

    monkeypatch.setattr(io, "_write_npz", crash_halfway)
    with pytest.raises(KeyboardInterrupt):
        sg.save_checkpoint(path, mlp_params(seed=2), step=2)
    monkeypatch.undo()
    assert path.read_bytes() == original
    ckpt = sg.load_checkpoint(path, mlp_params())
    assert ckpt.step == 1
    for a, b in zip(ckpt.params, old_params, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]
