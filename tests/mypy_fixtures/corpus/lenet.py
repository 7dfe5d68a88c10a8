"""LeNet-5 on 28x28 digits: conv/pool twice, flatten with ``32 * 7 * 7``-style arithmetic, MLP head."""

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor


class LeNet(
    ParamList[
        Float[Tensor, "6 1 5 5"], Float[Tensor, "6"],
        Float[Tensor, "16 6 5 5"], Float[Tensor, "16"],
        Float[Tensor, "120 400"], Float[Tensor, "120"],
        Float[Tensor, "10 120"], Float[Tensor, "10"],
    ]
):  # fmt: skip
    names = ("c1", "c1b", "c2", "c2b", "f1", "f1b", "f2", "f2b")


@sg.typechecked
def forward(p: LeNet, x: Float[Tensor, "b 1 28 28"]) -> Float[Tensor, "b 10"]:
    c1, c1b, c2, c2b, f1, f1b, f2, f2b = p
    h = sg.relu(sg.conv2d(x, c1, c1b, padding=2))  # [b, 6, 28, 28]
    h = sg.max_pool2d(h, 2)  # [b, 6, 14, 14]
    h = sg.relu(sg.conv2d(h, c2, c2b))  # [b, 16, 10, 10]
    h = sg.max_pool2d(h, 2)  # [b, 16, 5, 5]
    h = h.reshape(x.shape[0], 16 * 5 * 5)
    h = sg.relu(h @ f1.T + f1b)
    return h @ f2.T + f2b


@sg.typechecked
def loss(p: LeNet, x: Float[Tensor, "b 1 28 28"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(forward(p, x), y)


def run() -> float:
    import numpy as np

    p = LeNet.init(sg.nn.init.kaiming, seed=0)
    y = sg.tensor(np.array([1, 7], np.int32))
    return float(loss(p, sg.rand((2, 1, 28, 28)), y).item())
