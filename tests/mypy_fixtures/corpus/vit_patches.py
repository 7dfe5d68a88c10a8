"""Vision-transformer patch embedding: NCHW images to a sequence of flattened patches."""

import shapegrad as sg
from shapegrad import Float, Tensor

PATCH = 4


@sg.typechecked
def patchify(images: Float[Tensor, "b c h w"]) -> Float[Tensor, "b n p"]:
    B, C, H, W = images.shape
    gh, gw = H // PATCH, W // PATCH
    x = images.reshape(B, C, gh, PATCH, gw, PATCH)
    x = x.permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, gh * gw, C * PATCH * PATCH)


@sg.typechecked
def embed(
    images: Float[Tensor, "b 3 16 16"],
    w: Float[Tensor, "48 d"],
    cls: Float[Tensor, "1 1 d"],
    pos: Float[Tensor, "17 d"],
) -> Float[Tensor, "b 17 d"]:
    tokens = patchify(images) @ w
    B = images.shape[0]
    cls_b = cls.broadcast_to((B, 1, cls.shape[-1]))
    return sg.concat([cls_b, tokens], axis=1) + pos


def run() -> float:
    out = embed(sg.rand((2, 3, 16, 16)), sg.randn((48, 8)), sg.zeros((1, 1, 8)), sg.randn((17, 8)))
    return float(out.sum().item())
