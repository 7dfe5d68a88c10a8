"""Correct: the shapes the plugin infers for issue 25's ops (each ``# N:`` is the note on the
next line)."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def ops(
    x: Float[Tensor, "b 8"],
    img: Float[Tensor, "b 3 4 6"],
    seq: Float[Tensor, "b 3 16"],
    w: Float[Tensor, "5 3 3"],
    labels: Int[Tensor, "b 4 6"],
) -> Float[Tensor, "b 8"]:
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(sg.silu(sg.softplus(sg.elu(sg.leaky_relu(sg.erf(x))))))
    # N: Revealed shape is "int[8]"
    sg.reveal_shape(sg.argmin(x, axis=0))
    # N: Revealed shape is "bool[b, 1]"
    sg.reveal_shape(sg.any(x > 0.0, axis=1, keepdims=True))
    # N: Revealed shape is "float[b]"
    sg.reveal_shape(sg.norm(x, 2, axis=1))
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(sg.tril(sg.flip(sg.roll(x, 1, 0), 1), 1))
    # N: Revealed shape is "float[2, 3, 16]"
    sg.reveal_shape(sg.tile(sg.ones((3, 8)), (2, 1, 2)))
    # N: Revealed shape is "float[b, 24]"
    sg.reveal_shape(sg.repeat(x, 3, axis=1))
    # N: Revealed shape is "float[b, 3, 8, 12]"
    sg.reveal_shape(sg.interpolate(img, scale_factor=2, mode="bilinear"))
    # N: Revealed shape is "float[b, 3, 5, 5]"
    sg.reveal_shape(sg.interpolate(img, size=(5, 5)))
    # N: Revealed shape is "float[b, 5, 16]"
    sg.reveal_shape(sg.conv1d(seq, w, padding=1))
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(sg.cumsum(x, axis=1))
    # N: Revealed shape is "float[b, 2, 8, 12]"
    sg.reveal_shape(
        sg.conv_transpose2d(img, sg.ones((3, 2, 3, 3)), stride=2, padding=1, output_padding=1)
    )
    # N: Revealed shape is "float[]"
    sg.reveal_shape(sg.cross_entropy(img, labels, axis=1))
    return x


def run() -> float:
    labels = sg.tensor([[[0, 1, 2, 0, 1, 2]] * 4] * 2).astype(sg.int32)
    out = ops(
        sg.randn((2, 8)), sg.randn((2, 3, 4, 6)), sg.randn((2, 3, 16)), sg.randn((5, 3, 3)), labels
    )
    return float(out.sum().item())
