"""Correct: PyTorch's cast methods keep the shape and give the element kind they name
(each ``# N:`` is the note on the next line)."""

from jaxtyping import UInt8

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def casts(x: Float[Tensor, "b 8"], img: UInt8[Tensor, "b 3 4 4"]) -> Int[Tensor, "b 8"]:
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(x.double())
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(x.half().bfloat16().float())
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(x.long())
    # N: Revealed shape is "int[b, 3, 4, 4]"
    sg.reveal_shape(img.int())
    # N: Revealed shape is "float[b, 3, 4, 4]"
    sg.reveal_shape(img.float() / 255.0)
    # N: Revealed shape is "bool[b, 8]"
    sg.reveal_shape(x.bool())
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(x.byte())
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(x.astype(sg.int64))
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(x.astype("uint8"))
    return x.long()


def run() -> int:
    img = sg.tensor(sg.ones((2, 3, 4, 4)).numpy().astype("uint8"))
    return int(casts(sg.randn((2, 8)), img).sum().item())
