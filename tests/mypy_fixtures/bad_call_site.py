"""Bug: a caller passes [b, 512] features to a model annotated for [b, 784] inputs."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def model(x: Float[Tensor, "b 784"], w: Float[Tensor, "10 784"]) -> Float[Tensor, "b 10"]:
    return x @ w.T


@sg.typechecked
def pipeline(features: Float[Tensor, "n 512"], w: Float[Tensor, "10 784"]) -> Float[Tensor, "n 10"]:
    # E: model: argument features for parameter x has shape [n, 512], expected [b, 784] (dimension 1: 512 != 784)
    return model(features, w)


def run() -> None:
    pipeline(sg.rand((4, 512)), sg.randn((10, 784)))
