"""A VGG-style feature stack built from a list of channel widths, then global average pooling."""

import itertools

import shapegrad as sg
from shapegrad import Float, Tensor

WIDTHS = [3, 8, 16, 32]


def make_weights(seed: int) -> list[Tensor]:
    return [
        sg.randn((c_out, c_in, 3, 3), seed=seed + i) * 0.1
        for i, (c_in, c_out) in enumerate(itertools.pairwise(WIDTHS))
    ]


@sg.typechecked
def features(images: Float[Tensor, "b 3 32 32"], weights: list[Tensor]) -> Float[Tensor, "b 32"]:
    h: Tensor = images
    for w in weights:
        h = sg.relu(sg.conv2d(h, w, padding=1))
        h = sg.max_pool2d(h, kernel_size=2, stride=2)
    return h.mean(axis=(2, 3))


@sg.typechecked
def classify(
    images: Float[Tensor, "b 3 32 32"], weights: list[Tensor], head: Float[Tensor, "32 10"]
) -> Float[Tensor, "b 10"]:
    return sg.log_softmax(features(images, weights) @ head, axis=-1)


def run() -> float:
    out = classify(sg.rand((2, 3, 32, 32)), make_weights(0), sg.randn((32, 10)))
    return float(out.sum().item())
