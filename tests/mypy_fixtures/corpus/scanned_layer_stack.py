"""A deep residual MLP whose layers are one Module with a leading ``layers`` dim on every
field, run by ``sg.scan`` over the stack (one step per layer, JAX's scan-over-layers):
the step function takes the same class, whose fields it sees one layer at a time."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module, field


class Layers(Module):
    norm: Float[Tensor, "layers d"] = field(role="gain")
    w_in: Float[Tensor, "layers d h"]
    w_out: Float[Tensor, "layers h d"]
    b_out: Float[Tensor, "layers d"] = field(role="bias")


class Net(Module):
    stack: Layers
    head: Float[Tensor, "d k"]

    def layer(self, x: Float[Tensor, "n d"], p: Layers) -> Float[Tensor, "n d"]:
        h = x * p.norm / sg.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
        return x + sg.gelu(h @ p.w_in) @ p.w_out + p.b_out

    def __call__(self, x: Float[Tensor, "n d"]) -> Float[Tensor, "n k"]:
        step = lambda h, p: (self.layer(h, p), None)  # noqa: E731
        out, _ = sg.scan(step, x, self.stack)
        return out @ self.head


def residual(x: Float[Tensor, "n d"], p: Layers) -> tuple[Float[Tensor, "n d"], Float[Tensor, " n"]]:
    y = x + sg.tanh(x @ p.w_in) @ p.w_out
    return y, y.mean(axis=-1)


@sg.typechecked
def trace(x: Float[Tensor, "n d"], stack: Layers) -> Float[Tensor, "layers n"]:
    _, means = sg.scan(residual, x, stack)
    return means


def run() -> float:
    net = Net.init(seed=0, layers=3, d=4, h=8, k=2)
    x = sg.randn((5, 4), seed=1)
    return float(net(x).sum().item() + trace(x, net.stack).sum().item())
