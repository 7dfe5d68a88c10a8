"""A residual CNN of BatchNorm Modules trained by ScalarTrainer; the loss returns the new running stats."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import BatchNorm, Linear, Module, field


class ResBlock(Module):
    conv1: Float[Tensor, "c c 3 3"]
    bn1: BatchNorm = field(dims={"c": "c"})
    conv2: Float[Tensor, "c c 3 3"]
    bn2: BatchNorm = field(dims={"c": "c"})

    def __call__(
        self, x: Float[Tensor, "b c h w"], training: bool
    ) -> tuple[Float[Tensor, "b c h w"], "ResBlock"]:
        h, bn1 = self.bn1(sg.conv2d(x, self.conv1, padding=1), training)
        h, bn2 = self.bn2(sg.conv2d(sg.relu(h), self.conv2, padding=1), training)
        return sg.relu(x + h), self.replace(bn1=bn1, bn2=bn2)


class Net(Module):
    stem: Float[Tensor, "c 1 3 3"]
    block: ResBlock = field(dims={"c": "c"})
    head: Linear = field(dims={"d_in": "c", "d_out": "k"})


@sg.typechecked
def loss(
    net: Net, x: Float[Tensor, "b 1 8 8"], y: Int[Tensor, " b"]
) -> tuple[Float[Tensor, ""], Net]:
    h = sg.relu(sg.conv2d(x, net.stem, padding=1))
    h, block = net.block(h, True)
    pooled = h.mean(axis=(2, 3))
    logits = net.head(pooled)
    return sg.cross_entropy(logits, y), net.replace(block=block)


def run() -> float:
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.random((4, 1, 8, 8)).astype(np.float32))
    y = sg.tensor(rng.integers(0, 3, 4).astype(np.int32))
    net = Net.init(seed=0, c=4, k=3)
    trainer = sg.ScalarTrainer(loss, net, mode="eager", optimizer=sg.optim.SGD(lr=0.1))
    return trainer.step(x, y)
