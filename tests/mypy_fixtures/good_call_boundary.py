"""Correct (regression): a function's dim names and a Module's field names are different sources.

``x: Float[Tensor, "b i"]`` meets a field ``w: Float[Tensor, "d_out d_in"]`` in
``x @ m.w.T``: every call binds ``i`` and ``d_in`` to one size (``sg.typechecked``
accepts it), so inside the body they may be equal; only a proven contradiction is an error.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


class Dense(sg.nn.Module):
    w: Float[Tensor, "d_out d_in"]
    b: Float[Tensor, " d_out"]


class Conv(sg.nn.Module):
    w: Float[Tensor, "c_out c_in 3 3"]


@sg.typechecked
def project(x: Float[Tensor, "b i"], m: Dense) -> Tensor:
    return x @ m.w.T + m.b


@sg.typechecked
def conv_block(x: Float[Tensor, "n ci h w"], m: Conv) -> Tensor:
    return sg.relu(sg.conv2d(x, m.w, padding=1))


@sg.typechecked
def fixed_width(x: Float[Tensor, "b 6"], m: Dense) -> Tensor:
    return x @ m.w.T  # the module's d_in may be 6


def run() -> float:
    dense = Dense.init(0, d_in=6, d_out=3)
    conv = Conv.init(1, c_in=2, c_out=4)
    y = project(sg.rand((2, 6)), dense)
    z = conv_block(sg.rand((1, 2, 5, 5)), conv)
    v = fixed_width(sg.rand((2, 6)), dense)
    return float(y.sum().item() + z.sum().item() + v.sum().item())
