"""A convolutional autoencoder: strided convs down, nearest-neighbour upsampling back up."""

import shapegrad as sg
from shapegrad import Float, Tensor


def upsample2(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    wide = sg.stack([x, x], axis=-1).reshape(B, C, H, 2 * W)
    return sg.stack([wide, wide], axis=3).reshape(B, C, 2 * H, 2 * W)


@sg.typechecked
def encode(
    x: Float[Tensor, "b 1 16 16"], w1: Float[Tensor, "4 1 3 3"], w2: Float[Tensor, "8 4 3 3"]
) -> Float[Tensor, "b 8 4 4"]:
    h = sg.relu(sg.conv2d(x, w1, stride=2, padding=1))
    return sg.relu(sg.conv2d(h, w2, stride=2, padding=1))


@sg.typechecked
def decode(
    z: Float[Tensor, "b 8 4 4"], w3: Float[Tensor, "4 8 3 3"], w4: Float[Tensor, "1 4 3 3"]
) -> Float[Tensor, "b 1 16 16"]:
    h = upsample2(z)
    h = sg.relu(sg.conv2d(h, w3, padding=1))
    h = upsample2(h)
    return sg.sigmoid(sg.conv2d(h, w4, padding=1))


@sg.typechecked
def reconstruction_loss(
    x: Float[Tensor, "b 1 16 16"], ws: tuple[Tensor, Tensor, Tensor, Tensor]
) -> Float[Tensor, ""]:
    w1, w2, w3, w4 = ws
    recon = decode(encode(x, w1, w2), w3, w4)
    return sg.mse(recon, x)


def run() -> float:
    ws = (sg.randn((4, 1, 3, 3), seed=1), sg.randn((8, 4, 3, 3), seed=2), sg.randn((4, 8, 3, 3), seed=3),
          sg.randn((1, 4, 3, 3), seed=4))  # fmt: skip
    return float(reconstruction_loss(sg.rand((2, 1, 16, 16)), ws).item())
