"""A hand-written SGD loop: ``sg.value_and_grad`` over a ParamList, updates with ``map``."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor


class Softmax(ParamList[Float[Tensor, "k d"], Float[Tensor, "k"]]):
    names = ("w", "b")


@sg.typechecked
def nll(params: Softmax, x: Float[Tensor, "n d"], y: Int[Tensor, " n"]) -> Float[Tensor, ""]:
    w, b = params
    return sg.cross_entropy(x @ w.T + b, y)


def sgd(params: Softmax, grads: Softmax, lr: float) -> Softmax:
    return params.map(lambda p, g: p - lr * g, grads)


def run() -> float:
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.normal(size=(32, 5)).astype(np.float32))
    y = sg.tensor(rng.integers(0, 3, size=32).astype(np.int32))
    params = Softmax.init(sg.nn.init.normal(0.1), seed=0, k=3, d=5)
    step = sg.value_and_grad(nll)
    value = sg.zeros(())
    for _ in range(5):
        value, grads = step(params, x, y)
        params = sgd(params, grads, 0.1)
    return float(value.item())
