"""Bug: a weight stored ``[in, out]`` is passed to ``sg.nn.linear``, which wants ``[out, in]``."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def head(
    h: Float[Tensor, "b 128"], w: Float[Tensor, "128 10"], bias: Float[Tensor, "10"]
) -> Float[Tensor, "b 10"]:
    # E: linear: input h [b, 128] needs a weight [out, 128], got w [128, 10] (128 != 10)
    return sg.nn.linear(h, w, bias)


def run() -> None:
    head(sg.rand((2, 128)), sg.randn((128, 10)), sg.zeros((10,)))
