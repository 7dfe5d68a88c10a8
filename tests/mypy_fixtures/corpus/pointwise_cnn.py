"""A MobileNet-like stage: 1x1 pointwise convs around a 3x3 conv, global pooling, a classifier."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def stage(
    x: Float[Tensor, "b 3 8 8"],
    expand: Float[Tensor, "12 3 1 1"],
    spatial: Float[Tensor, "12 12 3 3"],
    project: Float[Tensor, "6 12 1 1"],
    fc: Float[Tensor, "5 6"],
) -> Float[Tensor, "b 5"]:
    h = sg.relu(sg.conv2d(x, expand))  # [b, 12, 8, 8]
    h = sg.relu(sg.conv2d(h, spatial, stride=2, padding=1))  # [b, 12, 4, 4]
    h = sg.conv2d(h, project)  # [b, 6, 4, 4]
    return sg.avg_pool2d(h, 4).reshape(x.shape[0], 6) @ fc.T


def run() -> float:
    y = stage(sg.rand((2, 3, 8, 8)), sg.randn((12, 3, 1, 1)), sg.randn((12, 12, 3, 3)),
              sg.randn((6, 12, 1, 1)), sg.randn((5, 6)))  # fmt: skip
    return float(y.sum().item())
