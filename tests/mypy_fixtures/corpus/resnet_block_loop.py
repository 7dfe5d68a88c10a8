"""A ResNet-style stack: a list of residual blocks applied in a for loop (h = block(h))."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module, field


class Block(Module):
    w1: Float[Tensor, "c c 3 3"]
    w2: Float[Tensor, "c c 3 3"]

    def __call__(self, x: Float[Tensor, "b c h w"]) -> Float[Tensor, "b c h w"]:
        h = sg.relu(sg.conv2d(x, self.w1, padding=1))
        return sg.relu(x + sg.conv2d(h, self.w2, padding=1))


class ResNet(Module):
    stem: Float[Tensor, "c 3 3 3"]
    blocks: list[Block] = field(length="layers")
    fc: Float[Tensor, "k c"]


@sg.typechecked
def forward(m: ResNet, x: Float[Tensor, "b 3 8 8"]) -> Float[Tensor, "b k"]:
    h = sg.relu(sg.conv2d(x, m.stem, padding=1))
    for block in m.blocks:
        h = block(h)
    return h.mean(axis=(2, 3)) @ m.fc.T


def run() -> float:
    m = ResNet.init(seed=0, c=4, k=3, layers=2)
    return float(forward(m, sg.rand((2, 3, 8, 8))).sum().item())
