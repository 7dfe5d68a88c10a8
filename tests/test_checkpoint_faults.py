"""Checkpoints under attack and under SIGKILL (issue 17, items 3 and 13).

Crafted files (oversized members, malformed metadata, lying .npy headers) must raise
CheckpointError before anything large is inflated; a save killed at a random point must
leave a loadable checkpoint (the old or the new one) and no temp file after the next
save or load.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.io import CheckpointError, remove_stale_temps

ROOT = Path(__file__).resolve().parents[1]


def _params() -> list[sg.Tensor]:
    rng = np.random.default_rng(0)
    return [
        sg.tensor(rng.standard_normal((16, 2)).astype(np.float32)),
        sg.tensor(np.zeros(16, np.float32)),
    ]


def _rewrite(path: Path, edit: dict[str, bytes | None]) -> None:
    """Replace (or with None, drop) members of the checkpoint zip at ``path``."""
    with zipfile.ZipFile(path) as src:
        members = {m.filename: src.read(m) for m in src.infolist()}
    for name, data in edit.items():
        if data is None:
            members.pop(name, None)
        else:
            members[name] = data
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for name, data in members.items():
            dst.writestr(name, data)


def _npy(array: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _with_metadata(tmp_path: Path, change: dict[str, Any]) -> Path:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params(), step=3)
    with zipfile.ZipFile(path) as src:
        info = json.loads(str(np.load(io.BytesIO(src.read("__metadata__.npy")))))
    info.update(change)
    _rewrite(path, {"__metadata__.npy": _npy(np.array(json.dumps(info)))})
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": "abc"}, "step 'abc' is not an int"),
        ({"step": -1}, "step -1"),
        ({"version": "1"}, "version '1' is not an int"),
        ({"params": [{"shape": [16, 2], "dtype": "float32"}] * 2}, "'params' must be a list"),
        (
            {"params": [{"name": str(k), "shape": [10**30], "dtype": "float32"} for k in (0, 1)]},
            r"'params/0' is float32\[1000000000000000000000000000000\] in the checkpoint",
        ),
        ({"params": "w"}, "must be a list"),
    ],
)
def test_malformed_metadata_raises_checkpoint_error(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _with_metadata(tmp_path, change)
    with pytest.raises(CheckpointError, match=message):
        sg.load_checkpoint(path, _params())


def test_metadata_that_is_not_an_object_raises_checkpoint_error(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    _rewrite(path, {"__metadata__.npy": _npy(np.array("[1, 2]"))})
    with pytest.raises(CheckpointError, match="not a shapegrad checkpoint"):
        sg.load_checkpoint(path, _params())
    _rewrite(path, {"__metadata__.npy": _npy(np.zeros(3))})
    with pytest.raises(CheckpointError, match="malformed metadata"):
        sg.load_checkpoint(path, _params())


def test_oversized_member_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    size = 64 << 20  # 64 MiB of zeros: ~64 KiB compressed
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("params/bomb.npy", _npy(np.zeros(size, np.uint8)))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="unexpected"):
            sg.load_checkpoint(path, _params())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated while refusing a 64 MiB member"


def test_expected_member_with_a_huge_declared_size_is_refused(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    _rewrite(path, {"params/0.npy": _npy(np.zeros(32 << 20, np.float32))})
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"declares .* bytes"):
            sg.load_checkpoint(path, _params())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_npy_header_declaring_a_huge_shape_is_refused(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    good = _npy(np.zeros((16, 2), np.float32))
    lying = good.replace(b"(16, 2)", b"(10**13,)".replace(b"10**13", b"9999999999999"), 1)
    _rewrite(path, {"params/0.npy": lying})
    with pytest.raises(CheckpointError, match=r"'params/0' is float32\[9999999999999\]"):
        sg.load_checkpoint(path, _params())


@pytest.mark.parametrize("name", ["evil.npy", "../outside.npy", "params/", "params/0"])
def test_unexpected_member_names_are_refused(tmp_path: Path, name: str) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    _rewrite(path, {name: b"x"})
    with pytest.raises(CheckpointError, match="unexpected member"):
        sg.load_checkpoint(path, _params())


def test_object_arrays_are_refused(tmp_path: Path) -> None:
    path = sg.save_checkpoint(tmp_path / "c.npz", _params())
    buffer = io.BytesIO()
    np.save(buffer, np.array([None, 1], dtype=object), allow_pickle=True)
    _rewrite(path, {"params/0.npy": buffer.getvalue()})
    with pytest.raises(CheckpointError, match="Python objects"):
        sg.load_checkpoint(path, _params())


def test_round_trip_still_bit_identical(tmp_path: Path) -> None:
    params = _params()
    path = sg.save_checkpoint(tmp_path / "c.npz", params, step=9, metadata={"note": "é"})
    ckpt = sg.load_checkpoint(path, params)
    assert ckpt.step == 9 and ckpt.metadata["user"] == {"note": "é"}
    for got, want in zip(ckpt.params, params, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


# A child that saves forever: each save i stores params all equal to i and step i.
SAVER = """
import sys
import numpy as np
import shapegrad as sg
path = sys.argv[1]
i = 0
while True:
    params = [sg.tensor(np.full((512, 1024), i, np.float32)), sg.tensor(np.full(7, i, np.float32))]
    sg.save_checkpoint(path, params, step=i)
    if i == 0:
        print("ready", flush=True)
    i += 1
"""


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def _kill_during_saves(path: Path, kills: int, rng: random.Random) -> int:
    """SIGKILL ``kills`` saving children at random points; returns temp files left behind."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    left = 0
    for _ in range(kills):
        child = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        left = max(left, len(_temps(path.parent)))
        like = [sg.tensor(np.zeros((512, 1024), np.float32)), sg.tensor(np.zeros(7, np.float32))]
        ckpt = sg.load_checkpoint(path, like)  # the old or the new checkpoint, whole
        for leaf in ckpt.params:
            assert np.all(leaf.numpy() == ckpt.step)
        assert _temps(path.parent) == []  # the load removed the dead saver's temp file
    return left


def test_sigkill_during_saves_leaves_a_loadable_checkpoint_and_no_temps(tmp_path: Path) -> None:
    rng = random.Random(17)
    _kill_during_saves(tmp_path / "run.npz", kills=6, rng=rng)


@pytest.mark.slow
def test_many_sigkills_during_saves(tmp_path: Path) -> None:
    rng = random.Random(1717)
    left = _kill_during_saves(tmp_path / "run.npz", kills=60, rng=rng)
    assert left >= 1  # some kill did land mid-write (else the test proves nothing)


def test_temps_of_live_savers_are_kept_and_old_ones_removed(tmp_path: Path) -> None:
    target = tmp_path / "c.npz"
    live = tmp_path / f".c.npz.{os.getppid()}.abcd.tmp"  # our parent is alive
    dead_pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dead = tmp_path / f".c.npz.{dead_pid}.efgh.tmp"
    legacy_old = tmp_path / ".c.npz.k2j3h4g5.tmp"
    legacy_new = tmp_path / ".c.npz.q9w8e7r6.tmp"
    for p in (live, dead, legacy_old, legacy_new):
        p.write_bytes(b"partial")
    os.utime(legacy_old, (1, 1))
    assert remove_stale_temps(target) == 2
    assert live.exists() and legacy_new.exists()
    assert not dead.exists() and not legacy_old.exists()
