"""One GAN update: the discriminator sees real and generated batches concatenated."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def generator(z: Float[Tensor, "b 4"], w: Float[Tensor, "4 8"]) -> Float[Tensor, "b 8"]:
    return sg.tanh(z @ w)


@sg.typechecked
def discriminator(x: Float[Tensor, "n 8"], w: Float[Tensor, "8 1"]) -> Float[Tensor, " n"]:
    return sg.sigmoid(x @ w).reshape(-1)


@sg.typechecked
def d_loss(
    real: Float[Tensor, "b 8"],
    z: Float[Tensor, "b 4"],
    g: Float[Tensor, "4 8"],
    d: Float[Tensor, "8 1"],
) -> Float[Tensor, ""]:
    fake = sg.stop_gradient(generator(z, g))
    both = sg.concat([real, fake], axis=0)
    B = real.shape[0]
    targets = sg.concat([sg.ones((B,)), sg.zeros((B,))], axis=0)
    p = discriminator(both, d)
    return -(targets * sg.log(p + 1e-6) + (1.0 - targets) * sg.log(1.0 - p + 1e-6)).mean()


def run() -> float:
    value, grad_d = sg.value_and_grad(d_loss, argnums=3)(
        sg.rand((3, 8)), sg.randn((3, 4)), sg.randn((4, 8)), sg.randn((8, 1))
    )
    return float(value.item()) + float(grad_d.sum().item())
