"""Training the moons MLP with ScalarTrainer, mini-batches sliced out of NumPy arrays."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, ParamList, ScalarTrainer, Tensor
from shapegrad.data.synthetic import make_moons


class MLP(
    ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"], Float[Tensor, "1 h"], Float[Tensor, "1"]]
):
    names = ("w1", "b1", "w2", "b2")


@sg.typechecked
def scores(params: MLP, x: Float[Tensor, "b 2"]) -> Float[Tensor, " b"]:
    return sg.nn.mlp(params, x).reshape(-1)


@sg.typechecked
def loss(params: MLP, x: Float[Tensor, "b 2"], y: Float[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.hinge(scores(params, x), y)


def run() -> float:
    points, labels = make_moons(64, noise=0.1, seed=0)
    signs = (2.0 * labels - 1.0).astype(np.float32)
    params = MLP.init(sg.nn.init.kaiming, seed=0, h=8)
    trainer = ScalarTrainer(loss, params, mode="eager", optimizer=sg.optim.Adam(lr=0.05))
    last = 0.0
    for _epoch in range(2):
        for start in range(0, 64, 16):
            xb = sg.tensor(points[start : start + 16].astype(np.float32))
            yb = sg.tensor(signs[start : start + 16])
            last = trainer.step(xb, yb)
    return last
