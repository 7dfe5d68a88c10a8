"""Bug: a U-Net skip connection is concatenated along the batch axis instead of channels.

``up`` is a helper annotated with a plain ``Tensor``; its result shape comes from its body.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


def up(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    x = sg.stack([x, x], axis=-1).reshape(B, C, H, W * 2)
    return sg.stack([x, x], axis=3).reshape(B, C, H * 2, W * 2)


@sg.typechecked
def decoder_stage(
    bottom: Float[Tensor, "b 16 8 8"], skip: Float[Tensor, "b 8 16 16"]
) -> Float[Tensor, "b 24 16 16"]:
    # E: concat: inputs disagree at dimension 1: up(...) [b, 16, 16, 16], skip [b, 8, 16, 16]
    return sg.concat([up(bottom), skip], axis=0)


def run() -> None:
    decoder_stage(sg.rand((2, 16, 8, 8)), sg.rand((2, 8, 16, 16)))
