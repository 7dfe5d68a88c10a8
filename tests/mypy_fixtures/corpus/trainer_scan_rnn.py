"""ScalarTrainer on a recurrent regressor whose time loop is one sg.scan."""

import shapegrad as sg
from shapegrad import Float, Tensor


class RNN(sg.ParamList[Float[Tensor, "i h"], Float[Tensor, "h h"], Float[Tensor, "h 1"]]):
    names = ("w_in", "w_rec", "w_out")


@sg.typechecked
def loss(p: RNN, xs: Float[Tensor, "t b i"], y: Float[Tensor, "b 1"]) -> Float[Tensor, ""]:
    w_in, w_rec, w_out = p

    def step(h: Float[Tensor, "b h"], x: Float[Tensor, "b i"]) -> tuple[Float[Tensor, "b h"], None]:
        return sg.tanh(x @ w_in + h @ w_rec), None

    h, _ = sg.scan(step, sg.zeros((xs.shape[1], w_rec.shape[0])), xs)
    return sg.mse(h @ w_out, y)


def run() -> float:
    p = RNN.init(sg.nn.init.normal(0.3), seed=0, i=2, h=4)
    trainer = sg.ScalarTrainer(loss, p, mode="eager", optimizer=sg.optim.Adam(lr=1e-2))
    xs, y = sg.rand((3, 5, 2)), sg.rand((5, 1))
    values = [trainer.step(xs, y) for _ in range(2)]
    return values[-1]
