"""An MLP read through ParamList names (params.w1) and trained with a manual SGD loop."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


class MLP(
    sg.ParamList[
        Float[Tensor, "h 2"], Float[Tensor, " h"], Float[Tensor, "3 h"], Float[Tensor, " 3"]
    ]
):
    names = ("w1", "b1", "w2", "b2")


@sg.typechecked
def loss(params: MLP, x: Float[Tensor, "b 2"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    h = sg.tanh(x @ params.w1.T + params.b1)
    return sg.cross_entropy(h @ params.w2.T + params.b2, y)


def run() -> float:
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.random((8, 2)).astype(np.float32))
    y = sg.tensor(rng.integers(0, 3, 8).astype(np.int32))
    params = MLP.init(sg.nn.init.normal(0.5), seed=0, h=6)
    step = sg.value_and_grad(loss)
    value = 0.0
    for _ in range(2):
        v, grads = step(params, x, y)
        params = MLP([p - 0.1 * g for p, g in zip(params, grads, strict=True)])
        value = float(v.item())
    return value
