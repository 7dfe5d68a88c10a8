"""An MLP-Mixer layer: token mixing on the transposed patches, channel mixing on the features."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def mixer(
    x: Float[Tensor, "b n c"],
    tok1: Float[Tensor, "h n"],
    tok2: Float[Tensor, "n h"],
    ch1: Float[Tensor, "f c"],
    ch2: Float[Tensor, "c f"],
) -> Float[Tensor, "b n c"]:
    t = x.transpose(0, 2, 1)  # [b, c, n]
    t = sg.gelu(t @ tok1.T) @ tok2.T  # [b, c, n]
    x = x + t.transpose(0, 2, 1)
    return x + sg.gelu(x @ ch1.T) @ ch2.T


def run() -> float:
    y = mixer(sg.rand((2, 4, 3)), sg.randn((5, 4)), sg.randn((4, 5)), sg.randn((6, 3)),
              sg.randn((3, 6)))  # fmt: skip
    return float(y.sum().item())
