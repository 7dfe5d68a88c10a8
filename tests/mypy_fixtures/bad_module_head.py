"""Bug: the head is declared on the hidden width d but the model feeds it the 4*d MLP activations."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Linear, Module, field


class Model(Module):
    up: Linear = field(dims={"d_in": "d", "d_out": "4*d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "k"})

    def __call__(self, x: Float[Tensor, "b d"]) -> Float[Tensor, "b k"]:
        h = sg.relu(self.up(x))
        # E: Linear: input h [b, 4 * d] needs a weight [out, 4 * d], got self.head.w [k, d] (4 * d != d)
        return self.head(h)


def run() -> None:
    model = Model.init(seed=0, d=3, k=2)
    model(sg.rand((2, 3)))
