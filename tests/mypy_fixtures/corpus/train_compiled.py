"""A compiled training step (NumPy backend) and a compiled evaluation with accuracy."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor


class Net(
    ParamList[Float[Tensor, "16 4"], Float[Tensor, "16"], Float[Tensor, "3 16"], Float[Tensor, "3"]]
):
    names = ("w1", "b1", "w2", "b2")


def logits(params: Net, x: Float[Tensor, "b 4"]) -> Float[Tensor, "b 3"]:
    w1, b1, w2, b2 = params
    return sg.relu(x @ w1.T + b1) @ w2.T + b2


def loss(params: Net, x: Float[Tensor, "b 4"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(logits(params, x), y)


train_step = sg.compile(sg.value_and_grad(loss), backend="numpy")
predict = sg.compile(logits, backend="numpy")


def accuracy(params: Net, x: Float[Tensor, "b 4"], y: Int[Tensor, " b"]) -> float:
    guess = sg.argmax(predict(params, x), axis=1)
    return float((guess.numpy() == y.numpy()).mean())


def run() -> float:
    rng = np.random.default_rng(1)
    x = sg.tensor(rng.normal(size=(24, 4)).astype(np.float32))
    y = sg.tensor((rng.random(24) * 3).astype(np.int32))
    params = Net.init(sg.nn.init.kaiming, seed=0)
    for _ in range(3):
        value, grads = train_step(params, x, y)
        params = params.map(lambda p, g: p - 0.1 * g, grads)
    return accuracy(params, x, y) + float(value.item())
