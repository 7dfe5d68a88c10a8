"""Residual blocks with a projection shortcut when the channel count or resolution changes."""

import shapegrad as sg
from shapegrad import Float, Tensor


def bn_free_conv(x: Tensor, w: Tensor, stride: int = 1) -> Tensor:
    return sg.relu(sg.conv2d(x, w, stride=stride, padding=1))


@sg.typechecked
def basic_block(
    x: Float[Tensor, "b c h w"], w1: Float[Tensor, "c c 3 3"], w2: Float[Tensor, "c c 3 3"]
) -> Float[Tensor, "b c h w"]:
    h = sg.relu(sg.conv2d(x, w1, padding=1))
    h = sg.conv2d(h, w2, padding=1)
    return sg.relu(h + x)


@sg.typechecked
def down_block(
    x: Float[Tensor, "b 8 16 16"],
    w1: Float[Tensor, "16 8 3 3"],
    w2: Float[Tensor, "16 16 3 3"],
    proj: Float[Tensor, "16 8 1 1"],
) -> Float[Tensor, "b 16 8 8"]:
    h = bn_free_conv(x, w1, stride=2)
    h = sg.conv2d(h, w2, padding=1)
    shortcut = sg.conv2d(x, proj, stride=2)
    return sg.relu(h + shortcut)


@sg.typechecked
def resnet(
    x: Float[Tensor, "b 8 16 16"],
    blocks: list[tuple[Float[Tensor, "8 8 3 3"], Float[Tensor, "8 8 3 3"]]],
    down: tuple[Float[Tensor, "16 8 3 3"], Float[Tensor, "16 16 3 3"], Float[Tensor, "16 8 1 1"]],
    fc: Float[Tensor, "10 16"],
) -> Float[Tensor, "b 10"]:
    for w1, w2 in blocks:
        x = basic_block(x, w1, w2)
    h = down_block(x, *down)
    pooled = h.mean(axis=(2, 3))
    return pooled @ fc.T


def run() -> float:
    blocks = [
        (sg.randn((8, 8, 3, 3), seed=i) * 0.1, sg.randn((8, 8, 3, 3), seed=i + 9) * 0.1)
        for i in range(2)
    ]
    down = (sg.randn((16, 8, 3, 3), seed=3) * 0.1, sg.randn((16, 16, 3, 3), seed=4) * 0.1,
            sg.randn((16, 8, 1, 1), seed=5) * 0.1)  # fmt: skip
    out = resnet(sg.rand((2, 8, 16, 16)), blocks, down, sg.randn((10, 16)))
    return float(out.sum().item())
