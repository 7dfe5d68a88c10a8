"""Trace + optimize time and node counts of two training steps (fwd + bwd + SGD) under sg.compile.

(a) the moons step: MLP 2-16-16-1, tanh/relu, hinge loss, batch 10;
(b) MNIST-sized: MLP 784-512-512-10, relu, softmax cross-entropy, batch 128.

Run: ``.venv/bin/python benchmarks/trace_time.py [--repeat N]``. Each repeat
builds a fresh ``sg.compile`` so every measurement includes a full trace.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.compiler.passes import count_nodes
from shapegrad.tensor import Tensor
from shapegrad.typing import ParamList


def init_mlp(sizes: list[int], seed: int = 0) -> ParamList:  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)
    tensors = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        tensors += [sg.tensor(w, "float32"), sg.tensor(np.zeros(fan_out), "float32")]
    return ParamList(tensors)


def forward(params: Any, x: Tensor, act: Callable[[Tensor], Tensor]) -> Tensor:
    pairs = list(zip(params[0::2], params[1::2], strict=True))
    for w, b in pairs[:-1]:
        x = act(x @ w + b)
    w, b = pairs[-1]
    return x @ w + b


def moons_loss(params: Any, x: Tensor, y: Tensor) -> Tensor:
    return sg.hinge(forward(params, x, sg.tanh).reshape(-1), y)


def mnist_loss(params: Any, x: Tensor, y: Tensor) -> Tensor:
    return sg.cross_entropy(forward(params, x, sg.relu), y)


def sgd(loss: Callable[..., Tensor]) -> Callable[..., tuple[Tensor, Any]]:
    def step(params: Any, x: Tensor, y: Tensor, lr: Tensor) -> tuple[Tensor, Any]:
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return value, params.map(lambda p, g: p - lr * g, grads)

    step.__name__ = f"sgd_{loss.__name__}"
    return step


def measure(name: str, step: Callable[..., Any], args: tuple[Any, ...], repeat: int) -> None:
    traces, optimizes = [], []
    lowered = None
    for _ in range(repeat):
        lowered = sg.compile(step).lower(*args)
        traces.append(lowered.trace_seconds)
        optimizes.append(lowered.optimize_seconds)
    assert lowered is not None
    rounds = lowered.stats[-1].round if lowered.stats else 0
    print(f"{name}")
    print(
        f"  trace    {statistics.median(traces) * 1e3:8.1f} ms   "
        f"optimize {statistics.median(optimizes) * 1e3:8.1f} ms   (median of {repeat})"
    )
    print(
        f"  nodes: recorded {lowered.recorded_nodes}, live after trace "
        f"{count_nodes(lowered.traced)}, after pipeline {count_nodes(lowered.graph)} "
        f"({rounds} rounds)"
    )
    for stat in lowered.stats:
        print(f"    {stat}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--print-graph", action="store_true", help="print the optimized moons step")
    options = parser.parse_args()
    rng = np.random.default_rng(0)

    moons = (
        init_mlp([2, 16, 16, 1]),
        rng.standard_normal((10, 2)).astype(np.float32),
        np.sign(rng.standard_normal(10)).astype(np.float32),
        0.1,
    )
    measure("(a) moons 2-16-16-1, hinge, batch 10", sgd(moons_loss), moons, options.repeat)
    mnist = (
        init_mlp([784, 512, 512, 10]),
        rng.standard_normal((128, 784)).astype(np.float32),
        rng.integers(0, 10, 128).astype(np.int32),
        0.01,
    )
    measure("(b) 784-512-512-10, cross-entropy, batch 128", sgd(mnist_loss), mnist, options.repeat)
    if options.print_graph:
        print(sg.compile(sgd(moons_loss)).graph(*moons))


if __name__ == "__main__":
    main()
