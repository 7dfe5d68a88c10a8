"""Bug: the einsum spec reads the [out, in] weight as [in, out]."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def project(x: Float[Tensor, "b 784"], w: Float[Tensor, "10 784"]) -> Float[Tensor, "b 10"]:
    # E: einsum: dimension 'i' disagrees in 'bi,io->bo': x [b, 784] vs w [10, 784] (784 != 10)
    return sg.einsum("bi,io->bo", x, w)


def run() -> None:
    project(sg.rand((4, 784)), sg.randn((10, 784)))
