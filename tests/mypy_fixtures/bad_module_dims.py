"""Bug: the down-projection sub-module is applied to the block input instead of the hidden layer."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module, field


class Dense(Module):
    w: Float[Tensor, "d_out d_in"]
    b: Float[Tensor, " d_out"]

    def __call__(self, x: Tensor) -> Tensor:
        return sg.nn.linear(x, self.w, self.b)  # the run-time error points here


class Mixer(Module):
    up: Dense = field(dims={"d_in": "d", "d_out": "4*d"})
    down: Dense = field(dims={"d_in": "4*d", "d_out": "d"})

    @sg.typechecked
    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        h = sg.gelu(self.up(x))
        # E: self.down(...) fails inside: linear: input x [b, t, d] needs a weight [out, d], got self.w [d, 4 * d] (d != 4 * d)
        return x + self.down(x) * h.mean()


def run() -> None:
    mixer = Mixer.init(seed=0, d=8)
    mixer(sg.rand((2, 3, 8)))
