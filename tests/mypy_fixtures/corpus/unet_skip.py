"""A two-level U-Net: skip connections concatenated along channels after upsampling."""

import shapegrad as sg
from shapegrad import Float, Tensor


def up(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    x = sg.stack([x, x], axis=-1).reshape(B, C, H, W * 2)
    return sg.stack([x, x], axis=3).reshape(B, C, H * 2, W * 2)


@sg.typechecked
def unet(
    x: Float[Tensor, "b 3 16 16"],
    enc1: Float[Tensor, "8 3 3 3"],
    enc2: Float[Tensor, "16 8 3 3"],
    dec1: Float[Tensor, "8 24 3 3"],
    out: Float[Tensor, "2 8 1 1"],
) -> Float[Tensor, "b 2 16 16"]:
    s1 = sg.relu(sg.conv2d(x, enc1, padding=1))  # [b, 8, 16, 16]
    d1 = sg.max_pool2d(s1, 2)  # [b, 8, 8, 8]
    bottom = sg.relu(sg.conv2d(d1, enc2, padding=1))  # [b, 16, 8, 8]
    u1 = up(bottom)
    merged = sg.concat([u1, s1], axis=1)  # [b, 24, 16, 16] at run time
    h = sg.relu(sg.conv2d(merged, dec1, padding=1))
    return sg.conv2d(h, out)


def run() -> float:
    y = unet(sg.rand((1, 3, 16, 16)), sg.randn((8, 3, 3, 3)), sg.randn((16, 8, 3, 3)), sg.randn((8, 24, 3, 3)),
             sg.randn((2, 8, 1, 1)))  # fmt: skip
    return float(y.mean().item())
