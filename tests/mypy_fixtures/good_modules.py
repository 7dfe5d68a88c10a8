"""Correct: Module layers whose sub-modules rename their dims with ``field(dims=...)``."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module, field


class Dense(Module):
    w: Float[Tensor, "d_out d_in"]
    b: Float[Tensor, " d_out"]

    def __call__(self, x: Tensor) -> Tensor:
        return sg.nn.linear(x, self.w, self.b)


class Mixer(Module):
    up: Dense = field(dims={"d_in": "d", "d_out": "4*d"})
    down: Dense = field(dims={"d_in": "4*d", "d_out": "d"})
    gain: Float[Tensor, " d"]

    @sg.typechecked
    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        h = sg.gelu(self.up(sg.layer_norm(x, self.gain)))
        out: Float[Tensor, "b t d"] = self.down(h)
        return x + out


def run() -> float:
    mixer = Mixer.init(seed=0, d=8)
    return float(mixer(sg.rand((2, 3, 8))).sum().item())
