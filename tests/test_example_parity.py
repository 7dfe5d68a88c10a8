"""examples/llama.py, examples/unet.py and examples/lstm.py against PyTorch versions of
the same models (tests/torch_models.py): from the same initial weights (ours, copied into
PyTorch's modules), a few training steps give the same losses in float64, eagerly and
compiled C; and our model + training code is no more than 1.2x PyTorch's in lines."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

torch = pytest.importorskip("torch", reason="the parity tests compare against PyTorch")
sys.path.insert(0, str(Path(__file__).parent))
import torch_models  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 5


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the examples run their training only under __main__
    return module


def load(model: Any, weights: dict[str, np.ndarray]) -> None:
    expected = set(model.state_dict())
    assert set(weights) == expected, sorted(set(weights) ^ expected)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})


def llama_weights(ours: Any, layers: int) -> dict[str, np.ndarray]:
    named = {k: v.numpy() for k, v in ours.named().items()}
    weights = {
        "embed.weight": named["embed.weight"],
        "norm.weight": named["norm.weight"],
        "head.weight": named["head"],
    }
    for name in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"):
        for i in range(layers):  # our blocks are stacked along a leading layers axis
            weights[f"blocks.{i}.{name}.weight"] = named[f"blocks.{name}"][i]
    return weights


def unet_weights(ours: Any) -> dict[str, np.ndarray]:
    renamed = {"up_w": "up.weight", "up_b": "up.bias"}
    return {renamed.get(k, k): v.numpy() for k, v in ours.named().items()}


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_llama_trains_like_pytorch(eager: bool) -> None:
    llama, sizes = example("llama"), {"v": 11, "d": 16, "f": 32, "layers": 2}
    ours = llama.Llama.init(seed=3, dtype=sg.float64, **sizes)
    # queries and keys 25x the example's init: attention far from uniform, so the rotary
    # embedding and the causal mask change the losses well beyond the tolerance
    ours = ours.replace(blocks=ours.blocks.replace(wqkv=ours.blocks.wqkv * 25.0))
    reference = torch_models.Llama(**sizes).double()
    load(reference, llama_weights(ours, sizes["layers"]))
    rng = np.random.default_rng(0)
    data = rng.integers(0, sizes["v"], size=400).astype(np.int32)
    batches = llama.windows(data, STEPS, 4, 8, rng)
    _, losses = llama.train(ours, batches, eager=eager, progress=False)
    expected = torch_models.train_llama(reference, batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-10)
    assert expected[-1] < expected[0]  # it did train


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_unet_trains_like_pytorch(eager: bool) -> None:
    unet = example("unet")
    ours = unet.UNet.init(seed=3, dtype=sg.float64, c=8)
    reference = torch_models.UNet(c=8).double()
    load(reference, unet_weights(ours))
    rng = np.random.default_rng(0)
    images = rng.uniform(0.0, 1.0, size=(STEPS * 6, 1, 8, 8))
    batches = unet.noisy_batches(images, 6, 0.3, rng)
    _, losses = unet.train(ours, batches, eager=eager, progress=False)
    expected = torch_models.train_unet(reference, batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-10)
    assert expected[-1] < expected[0]


def recaller_weights(ours: Any) -> dict[str, np.ndarray]:
    renamed = {"head.w": "head.weight", "head.b": "head.bias"}
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):  # PyTorch's layer-0 names
        renamed[f"rnn.cell.{name}"] = f"rnn.{name}_l0"
    return {renamed.get(k, k): v.numpy() for k, v in ours.named().items()}


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_lstm_trains_like_pytorch(eager: bool) -> None:
    lstm, sizes = example("lstm"), {"v": 8, "d": 8, "h": 16}
    ours = lstm.Recaller.init(seed=3, dtype=sg.float64, **sizes)
    # the biases start at zero: give them values, so their gate layout counts from step 0
    bias = np.random.default_rng(1).normal(0.0, 0.5, size=(2, 4 * sizes["h"]))
    cell = ours.rnn.cell.replace(bias_ih=sg.tensor(bias[0]), bias_hh=sg.tensor(bias[1]))
    ours = ours.replace(rnn=ours.rnn.replace(cell=cell))
    reference = torch_models.Recaller(**sizes).double()
    load(reference, recaller_weights(ours))
    rng = np.random.default_rng(0)
    batches = [lstm.batch(rng, 4) for _ in range(STEPS)]
    _, losses = lstm.train(ours, batches, eager=eager, progress=False)
    expected = torch_models.train_recaller(reference, batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-10)
    assert expected[-1] < expected[0]


def code_lines(path: Path, names: list[str]) -> int:
    """Non-blank, non-comment, non-docstring lines of the named top-level definitions."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: dict[str, ast.stmt] = {}
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for name in [getattr(node, "name", None), *(getattr(t, "id", None) for t in targets)]:
            if name in names:
                found[name] = node
    assert sorted(found) == sorted(names), f"{path.name}: missing {set(names) - set(found)}"
    docstrings: set[int] = set()
    for node in ast.walk(ast.Module(body=list(found.values()), type_ignores=[])):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    count = 0
    for node in found.values():
        for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            text = lines[number - 1].strip()
            if text and not text.startswith("#") and number not in docstrings:
                count += 1
    return count


# model + loss + training code of each; the data pipelines, sampling and checks are not counted
LINES = {
    "llama": (
        ["normal", "Blocks", "rotate", "Llama", "loss", "train"],
        ["rotate", "LlamaBlock", "Llama", "llama_loss", "train_llama"],
    ),
    "unet": (
        ["Conv3", "GN", "Block", "UNet", "loss", "train"],
        ["UNetBlock", "UNet", "train_unet"],
    ),
    "lstm": (["Recaller", "loss", "train"], ["Recaller", "recaller_loss", "train_recaller"]),
}


@pytest.mark.parametrize("name", sorted(LINES))
def test_example_is_no_longer_than_pytorch(name: str) -> None:
    ours, theirs = LINES[name]
    mine = code_lines(EXAMPLES / f"{name}.py", ours)
    pytorch = code_lines(Path(torch_models.__file__), theirs)
    assert mine <= 1.2 * pytorch, f"{name}: {mine} lines against PyTorch's {pytorch}"
