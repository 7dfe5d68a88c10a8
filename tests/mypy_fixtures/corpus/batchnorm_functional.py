"""A CNN with functional sg.batch_norm: batch statistics in training, running ones at eval."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def conv_bn(
    x: Float[Tensor, "b 3 8 8"],
    w: Float[Tensor, "c 3 3 3"],
    gamma: Float[Tensor, " c"],
    beta: Float[Tensor, " c"],
    mean: Float[Tensor, " c"],
    var: Float[Tensor, " c"],
    training: bool,
) -> tuple[Float[Tensor, "b c 8 8"], Float[Tensor, " c"], Float[Tensor, " c"]]:
    h = sg.conv2d(x, w, padding=1)
    y, new_mean, new_var = sg.batch_norm(h, gamma, beta, mean, var, training)
    return sg.relu(y), new_mean, new_var


def run() -> float:
    c = 4
    stats = (sg.zeros((c,)), sg.ones((c,)))
    w, gamma, beta = sg.randn((c, 3, 3, 3)), sg.ones((c,)), sg.zeros((c,))
    y, mean, var = conv_bn(sg.rand((2, 3, 8, 8)), w, gamma, beta, *stats, True)
    z, _, _ = conv_bn(sg.rand((2, 3, 8, 8)), w, gamma, beta, mean, var, False)
    return float(y.mean().item() + z.mean().item())
