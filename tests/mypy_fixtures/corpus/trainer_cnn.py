"""ScalarTrainer on a small CNN with Adam and a cosine schedule."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, ParamList, ScalarTrainer, Tensor


class SmallCNN(
    ParamList[
        Float[Tensor, "4 1 3 3"], Float[Tensor, "4"], Float[Tensor, "10 64"], Float[Tensor, "10"]
    ]
):
    names = ("conv", "conv_b", "fc", "fc_b")


@sg.typechecked
def loss(p: SmallCNN, x: Float[Tensor, "b 1 8 8"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    conv, conv_b, fc, fc_b = p
    h = sg.max_pool2d(sg.relu(sg.conv2d(x, conv, conv_b, padding=1)), 2)  # [b, 4, 4, 4]
    logits = h.reshape(x.shape[0], 4 * 4 * 4) @ fc.T + fc_b
    return sg.cross_entropy(logits, y)


def run() -> float:
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.random((16, 1, 8, 8)).astype(np.float32))
    y = sg.tensor(rng.integers(0, 10, 16).astype(np.int32))
    params = SmallCNN.init(sg.nn.init.kaiming, seed=0)
    trainer = ScalarTrainer(loss, params, mode="eager", optimizer=sg.optim.Adam(lr=1e-2))
    values = [trainer.step(x, y) for _ in range(3)]
    return values[-1]
