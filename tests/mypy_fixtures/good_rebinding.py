"""Correct: a conv autoencoder whose activations are rebound through plain-Tensor helpers.

After ``h = helper(h)`` the old shape of ``h`` must be forgotten, whether the helper
returns a plain ``Tensor``, an annotation with other dims, or the value merges
from two branches: unknown means no error.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


def act(x: Tensor) -> Tensor:
    return sg.relu(x)


def down(x: Tensor, w: Tensor) -> Tensor:
    return sg.max_pool2d(sg.relu(sg.conv2d(x, w, padding=1)), 2)


def up(x: Float[Tensor, "b c h w"]) -> Float[Tensor, "b c h2 w2"]:
    b, c, h, w = x.shape
    wide = sg.stack([x, x], axis=-1).reshape(b, c, h, 2 * w)
    return sg.stack([wide, wide], axis=3).reshape(b, c, 2 * h, 2 * w)


@sg.typechecked
def autoencoder(
    x: Float[Tensor, "b 1 16 16"],
    w1: Float[Tensor, "8 1 3 3"],
    w2: Float[Tensor, "4 8 3 3"],
    w3: Float[Tensor, "8 4 3 3"],
    w4: Float[Tensor, "1 8 3 3"],
    sharpen: bool,
) -> Float[Tensor, "b 1 16 16"]:
    h = sg.conv2d(x, w1, padding=1)  # [b, 8, 16, 16]
    h = act(h)  # a plain Tensor: the shape is unknown from here on
    h = down(h, w2)  # [b, 4, 8, 8] at run time
    h = up(h)  # annotated with other dims
    h = sg.relu(sg.conv2d(h, w3, padding=1))  # [b, 8, 16, 16] again
    if sharpen:
        h = h[:, :, :8, :8]  # the branches disagree on the shape ...
        h = up(h)
    out = sg.conv2d(h, w4, padding=1)  # ... so after the merge it is unknown
    return sg.sigmoid(out)


@sg.typechecked
def residual_stack(
    x: Float[Tensor, "b 16"], ws: list[Float[Tensor, "16 16"]]
) -> Float[Tensor, "b 16"]:
    h = x
    for w in ws:
        h = h + sg.relu(h @ w)
    skip = h if len(ws) else x
    return skip


def run() -> float:
    x = sg.rand((2, 1, 16, 16))
    y = autoencoder(
        x,
        sg.randn((8, 1, 3, 3), seed=1),
        sg.randn((4, 8, 3, 3), seed=2),
        sg.randn((8, 4, 3, 3), seed=3),
        sg.randn((1, 8, 3, 3), seed=4),
        True,
    )
    z = residual_stack(sg.rand((3, 16)), [sg.randn((16, 16), seed=5)])
    return float(y.sum().item() + z.sum().item())
