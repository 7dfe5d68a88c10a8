"""Programs with ``sg.scan`` / ``sg.checkpoint`` are keyed by content and use the warm cache.

A SCAN node's ``Body`` is immutable (what is derived from it lives in side tables), so
``compiler/graphkey.py`` encodes it by its sub-graph: a scanned transformer compiled in one
process is loaded from the manifest in the next, and any change to the body changes the key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler.graphkey import graph_key
from shapegrad.ir import Graph

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import sys
import numpy as np, shapegrad as sg
from shapegrad.backends import native
from shapegrad.backends.c import toolchain
from shapegrad.nn.transformer import BlockStack, block_init, transformer_stack

remat = sys.argv[1] == "recompute"
stack = BlockStack.init(block_init(0.3), seed=1, layers=3, d=8, f=16, dtype="float32")
x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32)

def loss(params, x):
    out = transformer_stack(params, x, heads=2, causal=True, loop=True, remat=remat)
    return (out ** 2).mean()

step = sg.value_and_grad(loss)
fast = sg.compile(step, backend="c")
lowered = fast.lower(stack, x)
value, grads = fast(stack, x)
want_value, want_grads = step(stack, sg.tensor(x))          # eager: NumPy + tape
assert np.allclose(value.numpy(), want_value.numpy(), rtol=1e-4, atol=1e-6), (value, want_value)
for g, w in zip(grads, want_grads, strict=True):
    assert np.allclose(g.numpy(), w.numpy(), rtol=1e-3, atol=1e-5), np.abs(g.numpy() - w.numpy()).max()
print("hit", lowered.from_cache, "compiles", native.compile_count, "value", repr(float(value.numpy())))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("policy", ["recompute", "residuals"])
def test_a_scanned_transformer_hits_the_warm_cache_in_a_new_process(
    tmp_path: Path, policy: str
) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT / "src"))
    env.pop("SHAPEGRAD_DEBUG", None)  # a debug run always takes the full path
    outs = [
        subprocess.run(
            [sys.executable, "-c", _CHILD, policy],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        for _ in range(2)
    ]
    for out in outs:
        assert out.returncode == 0, out.stderr[-3000:]
    first, second = (out.stdout.split() for out in outs)
    assert first[:2] == ["hit", "False"] and int(first[3]) >= 1, first
    # the second process: manifest hit, nothing compiled, the same value
    assert second[:4] == ["hit", "True", "compiles", "0"], second
    assert second[5] == first[5]


def _traced(fn: Callable[..., Any], *args: Any) -> Graph:
    traced: Graph = sg.compile(fn, backend="numpy").lower(*args).traced
    return traced


W = np.random.default_rng(1).normal(size=(3, 4, 4)).astype(np.float32) * 0.5
X = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)


def _stack(activation: Callable[[sg.Tensor], sg.Tensor], scale: float) -> Callable[..., Any]:
    def run(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        def layer(h: sg.Tensor, wl: sg.Tensor) -> tuple[sg.Tensor, None]:
            return activation(h @ wl) * scale, None

        h, _ = sg.scan(layer, x, w)
        return h.sum()

    return run


def test_a_scan_graph_has_a_key_that_follows_its_body() -> None:
    base = graph_key(_traced(_stack(sg.tanh, 1.5), W, X), "c")
    assert base is not None  # a SCAN graph is keyable (it was not before)
    # traced again: new Body objects (other serial numbers), the same content, the same key
    assert graph_key(_traced(_stack(sg.tanh, 1.5), W, X), "c") == base
    # the body's op, one of its constants, the loop's length: each changes the key
    assert graph_key(_traced(_stack(sg.sin, 1.5), W, X), "c") != base
    assert graph_key(_traced(_stack(sg.tanh, 2.5), W, X), "c") != base
    assert graph_key(_traced(_stack(sg.tanh, 1.5), W[:2], X), "c") != base


def test_gradient_and_checkpoint_graphs_are_keyed_by_their_bodies() -> None:
    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return _stack(sg.tanh, 1.5)(w, x)

    def loss_sin(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return _stack(sg.sin, 1.5)(w, x)

    grad = graph_key(_traced(sg.grad(loss), W, X), "c")
    assert grad is not None and grad == graph_key(_traced(sg.grad(loss), W, X), "c")
    assert grad != graph_key(_traced(sg.grad(loss_sin), W, X), "c")

    def blocks(w: sg.Tensor, x: sg.Tensor, act: Callable[[sg.Tensor], sg.Tensor]) -> sg.Tensor:
        region = sg.checkpoint(lambda h, m: act(h @ m))
        return region(x, w[0]).sum()

    ck = graph_key(_traced(sg.grad(lambda w, x: blocks(w, x, sg.tanh)), W, X), "c")
    assert ck is not None
    assert ck != graph_key(_traced(sg.grad(lambda w, x: blocks(w, x, sg.sin)), W, X), "c")
