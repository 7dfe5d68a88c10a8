"""A hand-written Adam loop over a tuple of parameters with sg.value_and_grad."""

import shapegrad as sg
from shapegrad import Float, Tensor

Params = tuple[Float[Tensor, "h d"], Float[Tensor, "1 h"]]


@sg.typechecked
def loss(p: Params, x: Float[Tensor, "b d"], y: Float[Tensor, "b 1"]) -> Float[Tensor, ""]:
    w1, w2 = p
    return sg.mse(sg.relu(x @ w1.T) @ w2.T, y)


def run() -> float:
    x, y = sg.rand((8, 3)), sg.rand((8, 1))
    params = (sg.randn((5, 3), seed=1) * 0.5, sg.randn((1, 5), seed=2) * 0.5)
    m = [sg.zeros_like(p) for p in params]
    v = [sg.zeros_like(p) for p in params]
    step = sg.value_and_grad(loss)
    value = 0.0
    for t in range(1, 3):
        val, grads = step(params, x, y)
        new = []
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            m_hat, v_hat = m[i] / (1 - 0.9**t), v[i] / (1 - 0.999**t)
            new.append(p - 0.01 * m_hat / (sg.sqrt(v_hat) + 1e-8))
        params = (new[0], new[1])
        value = float(val.item())
    return value
