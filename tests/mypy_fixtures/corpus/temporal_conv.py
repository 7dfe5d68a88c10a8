"""A 1-D temporal convolution written with conv2d: unsqueeze a height of 1, squeeze it back."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def temporal(
    x: Float[Tensor, "b c t"], w: Float[Tensor, "o c 3"], head: Float[Tensor, "k o"]
) -> Float[Tensor, "b k"]:
    h = sg.conv2d(x.unsqueeze(2), sg.expand_dims(w, 2), padding=(0, 1))  # [b, o, 1, t]
    h = sg.relu(h.squeeze(2))  # [b, o, t]
    return h.max(axis=-1) @ head.T


def run() -> float:
    y = temporal(sg.rand((2, 3, 7)), sg.randn((5, 3, 3)), sg.randn((4, 5)))
    return float(y.sum().item())
