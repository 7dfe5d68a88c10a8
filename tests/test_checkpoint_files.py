"""Checkpoints against paths that are not regular files and against damaged zip headers
(issue 24, items 12 and 14).

A save onto a device node must not replace it, a load from an endless device or a FIFO
must neither read without limit nor block, and every single-byte damage to the zip
headers (and the ``.npy`` headers inside) either raises :class:`CheckpointError` or loads
the checkpoint exactly as saved.
"""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.io import CheckpointError

ROOT = Path(__file__).resolve().parents[1]


def _params() -> list[sg.Tensor]:
    rng = np.random.default_rng(3)
    return [
        sg.tensor(rng.standard_normal((4, 3)).astype(np.float32)),
        sg.tensor(np.arange(3, dtype=np.float32)),
    ]


def _state(params: list[sg.Tensor]) -> dict[str, list[sg.Tensor]]:
    return {"m": [sg.tensor(p.numpy() * 0.5) for p in params]}


needs_mknod = pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="creating device nodes needs root"
)


def _device(path: Path, minor: int) -> Path:
    """A character device node like /dev/null (minor 3) or /dev/zero (minor 5)."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


@needs_mknod
def test_save_onto_a_character_device_refuses_and_keeps_the_node(tmp_path: Path) -> None:
    node = _device(tmp_path / "null", 3)
    with pytest.raises(CheckpointError, match="character device, not a regular file"):
        sg.save_checkpoint(node, _params())
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["null"]  # no temp file left either


# A load from /dev/zero read until the process was killed for memory: run it in a child
# with a deadline and a memory cap, so a regression fails instead of taking the suite down.
ZERO_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
import numpy as np
import shapegrad as sg
from shapegrad.io import CheckpointError
try:
    sg.load_checkpoint(sys.argv[1], [sg.tensor(np.zeros(3, np.float32))])
except CheckpointError as exc:
    print("refused:", exc)
"""


def _load_in_child(path: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", ZERO_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@needs_mknod
def test_load_from_an_endless_device_is_refused_without_reading(tmp_path: Path) -> None:
    out = _load_in_child(_device(tmp_path / "zero", 5))
    assert "refused:" in out and "character device, not a regular file" in out


def test_load_from_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    out = _load_in_child(fifo)
    assert "FIFO (named pipe), not a regular file" in out
    with pytest.raises(CheckpointError, match="FIFO"):
        sg.save_checkpoint(fifo, _params())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_directories_are_refused_on_save_and_load(tmp_path: Path) -> None:
    folder = tmp_path / "run.npz"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="is a directory, not a regular file"):
        sg.save_checkpoint(folder, _params())
    with pytest.raises(CheckpointError, match="is a directory, not a regular file"):
        sg.load_checkpoint(folder, _params())
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_symlink_to_a_regular_checkpoint_still_loads(tmp_path: Path) -> None:
    params = _params()
    real = sg.save_checkpoint(tmp_path / "real.npz", params, step=4)
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    ckpt = sg.load_checkpoint(link, params)
    assert ckpt.step == 4
    for got, want in zip(ckpt.params, params, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_metadata_that_is_not_json_is_a_checkpoint_error(tmp_path: Path) -> None:
    target = tmp_path / "c.npz"
    sg.save_checkpoint(target, _params(), step=1)
    before = target.read_bytes()
    with pytest.raises(CheckpointError, match="metadata must be JSON-serialisable"):
        sg.save_checkpoint(target, _params(), step=2, metadata={"when": object()})
    assert target.read_bytes() == before  # the previous checkpoint is untouched
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]


# --- damaged headers ------------------------------------------------------------------


def zip_header_offsets(data: bytes) -> list[int]:
    """Every byte offset of the zip structure: local headers, central directory entries
    and the end-of-central-directory record."""
    eocd = data.rfind(b"PK\x05\x06")
    count, _size, start = struct.unpack_from("<HII", data, eocd + 10)
    offsets = list(range(eocd, len(data)))
    for _ in range(count):
        name, extra, comment = struct.unpack_from("<HHH", data, start + 28)
        local = struct.unpack_from("<I", data, start + 42)[0]
        offsets += range(start, start + 46 + name + extra + comment)
        lname, lextra = struct.unpack_from("<HH", data, local + 26)
        offsets += range(local, local + 30 + lname + lextra)
        start += 46 + name + extra + comment
    return sorted(set(offsets))


def npy_header_offsets(data: bytes) -> list[int]:
    """Every byte of each member's ``.npy`` magic and header (stored members)."""
    offsets: list[int] = []
    position = 0
    while (local := data.find(b"PK\x03\x04", position)) >= 0:
        lname, lextra = struct.unpack_from("<HH", data, local + 26)
        begin = local + 30 + lname + lextra
        if data[begin : begin + 6] == b"\x93NUMPY":
            length = struct.unpack_from("<H", data, begin + 8)[0]
            offsets += range(begin, begin + 10 + length)
        position = begin
    return offsets


def _sweep(
    tmp_path: Path, mutations: Iterable[tuple[int, int]], data: bytes, params: list[sg.Tensor]
) -> Counter[str]:
    """Load every mutated file: each must raise CheckpointError or load exactly as saved."""
    state = _state(params)
    outcomes: Counter[str] = Counter()
    path = tmp_path / "damaged.npz"
    for offset, value in mutations:
        if data[offset] == value:
            continue
        damaged = bytearray(data)
        damaged[offset] = value
        path.write_bytes(bytes(damaged))
        try:
            ckpt = sg.load_checkpoint(path, params, state)
        except CheckpointError:
            outcomes["CheckpointError"] += 1
            continue
        except Exception as exc:  # the point is to name anything else
            pytest.fail(f"byte {offset} = {value:#04x}: {type(exc).__name__}: {exc}")
        assert ckpt.step == 7, (offset, value)
        loaded = [*ckpt.params, *ckpt.optimizer_state["m"]]
        for got, want in zip(loaded, [*params, *state["m"]], strict=True):
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"byte {offset}")
        outcomes["loaded"] += 1
    return outcomes


def _saved(tmp_path: Path) -> tuple[bytes, list[sg.Tensor]]:
    params = _params()
    path = sg.save_checkpoint(tmp_path / "c.npz", params, _state(params), step=7)
    return path.read_bytes(), params


def _values(byte: int) -> list[int]:
    return [0x00, 0xFF, byte ^ 0x01, byte ^ 0x80, (byte + 1) & 0xFF, 0x7F, 0x20]


# Structural characters of a .npy header (a Python dict literal) and a few others.
_NPY_VALUES = b"\x00\n \"'(),:{}[]BLU\xff"


def test_known_header_damage_is_a_checkpoint_error(tmp_path: Path) -> None:
    data, params = _saved(tmp_path)
    local = data.find(b"PK\x03\x04")
    central = data.find(b"PK\x01\x02")
    first_npy = npy_header_offsets(data)[0]
    cases = [
        (local + 8, 99),  # compression method 99 (NotImplementedError before)
        (central + 10, 99),
        (local + 6, 0x01),  # "encrypted" flag (RuntimeError before)
        (central + 8, 0x01),
        (central + 8, 0x20),  # "compressed patched data" flag
        (central + 6, 0xFF),  # needs zip version 25.5
        (first_npy + 10, 0x00),  # '{' of the .npy header -> tokenize.TokenError
        (first_npy + 21, 0x2C),  # SyntaxError in the header literal
    ]
    outcomes = _sweep(tmp_path, cases, data, params)
    assert outcomes["CheckpointError"] >= 6, outcomes


def test_header_byte_sweep_sample(tmp_path: Path) -> None:
    data, params = _saved(tmp_path)
    offsets = zip_header_offsets(data)[::9] + npy_header_offsets(data)[::23]
    mutations = [(o, v) for o in offsets for v in (0x00, 0xFF, data[o] ^ 0x01)]
    outcomes = _sweep(tmp_path, mutations, data, params)
    assert outcomes["CheckpointError"] > 0 and outcomes["loaded"] > 0, outcomes


@pytest.mark.slow
def test_header_byte_sweep_every_byte(tmp_path: Path) -> None:
    data, params = _saved(tmp_path)
    mutations = [(o, v) for o in zip_header_offsets(data) for v in _values(data[o])]
    mutations += [(o, v) for o in npy_header_offsets(data) for v in _NPY_VALUES]
    outcomes = _sweep(tmp_path, mutations, data, params)
    print(f"header sweep: {sum(outcomes.values())} damaged files: {dict(outcomes)}")
    assert outcomes["CheckpointError"] > 1000, outcomes


def test_a_huge_declared_zip_directory_is_refused_before_it_is_read(tmp_path: Path) -> None:
    import tracemalloc

    # A sparse 200 MiB file whose end record declares a 200 MiB table of contents: the zip
    # reader would read all of it into memory at once.
    path = tmp_path / "sparse.npz"
    size = 200 << 20
    with open(path, "wb") as handle:
        handle.truncate(size)
        handle.seek(size)
        handle.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, size, 0, 0))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="zip directory declares"):
            sg.load_checkpoint(path, _params())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated while refusing"


def test_a_huge_zip64_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "zip64.npz"
    huge = 1 << 40
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, huge, 0)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    path.write_bytes(record + locator + end)
    with pytest.raises(CheckpointError, match=f"zip directory declares {huge} bytes"):
        sg.load_checkpoint(path, _params())


def test_stale_temps_are_removed_in_a_linked_folder_but_links_are_not_followed(
    tmp_path: Path,
) -> None:
    from shapegrad.io import remove_stale_temps

    real = tmp_path / "runs-on-big-disk"
    real.mkdir()
    runs = tmp_path / "runs"
    runs.symlink_to(real, target_is_directory=True)  # a user's own folder link: fine
    dead = real / ".c.npz.999999999.abcd.tmp"  # no such pid
    dead.write_bytes(b"partial")
    precious = tmp_path / "precious"
    precious.write_text("keep")
    linked = real / ".c.npz.999999998.efgh.tmp"
    linked.symlink_to(precious)
    assert remove_stale_temps(runs / "c.npz") == 2
    assert not dead.exists() and not linked.is_symlink()
    assert precious.read_text() == "keep"
