"""Bug: ``trainer.step`` gets the labels and the features in the wrong order."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, ParamList, ScalarTrainer, Tensor


class Model(ParamList[Float[Tensor, "16 2"], Float[Tensor, "16"], Float[Tensor, "1 16"]]):
    names = ("w1", "b1", "w2")


@sg.typechecked
def loss(params: Model, x: Float[Tensor, "b 2"], y: Float[Tensor, " b"]) -> Float[Tensor, ""]:
    w1, b1, w2 = params
    scores = (sg.relu(x @ w1.T + b1) @ w2.T).reshape(-1)
    return sg.hinge(scores, y)


def fit(params: Model, xs: Float[Tensor, "n 2"], ys: Float[Tensor, " n"]) -> float:
    trainer = ScalarTrainer(loss, params, mode="eager")
    total = 0.0
    for _ in range(2):
        # E: loss: argument ys for parameter x has shape [n], expected [b, 2] (rank 1 != 2)
        total += trainer.step(ys, xs)
    return total


def run() -> None:
    params = Model.init(sg.nn.init.kaiming, seed=0)
    fit(params, sg.tensor(np.zeros((8, 2), np.float32)), sg.tensor(np.ones(8, np.float32)))
