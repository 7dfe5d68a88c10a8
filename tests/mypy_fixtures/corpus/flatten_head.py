"""A classifier head whose weight names its input width apart from the image's dims:
``f`` is ``c*h*w`` at run time (jaxtyping binds each name on its own), so the flattened
product and the reshaped one must come out clean."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def head(img: Float[Tensor, "b c h w"], w: Float[Tensor, "k f"]) -> Float[Tensor, "b k"]:
    return img.flatten(1) @ w.T


@sg.typechecked
def head_reshaped(img: Float[Tensor, "b c h w"], w: Float[Tensor, "f k"]) -> Float[Tensor, "b k"]:
    return img.reshape(img.shape[0], -1) @ w


def run() -> float:
    img = sg.randn((2, 3, 4, 4))
    a = head(img, sg.randn((10, 48)))
    b = head_reshaped(img, sg.randn((48, 10)))
    return float((a.sum() + b.sum()).item())


if __name__ == "__main__":
    run()
