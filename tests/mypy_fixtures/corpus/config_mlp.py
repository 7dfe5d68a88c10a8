"""An MLP whose layer widths come from a config; layers applied with ``sg.nn.linear``."""

import itertools
from dataclasses import dataclass, field

import shapegrad as sg
from shapegrad import Float, Tensor


@dataclass
class Config:
    d_in: int = 6
    hidden: list[int] = field(default_factory=lambda: [16, 16])
    d_out: int = 3


def init(cfg: Config, seed: int) -> list[tuple[Tensor, Tensor]]:
    widths = [cfg.d_in, *cfg.hidden, cfg.d_out]
    return [
        (sg.randn((o, i), seed=seed + k) * 0.2, sg.zeros((o,)))
        for k, (i, o) in enumerate(itertools.pairwise(widths))
    ]


def forward(layers: list[tuple[Tensor, Tensor]], x: Float[Tensor, "b 6"]) -> Tensor:
    h: Tensor = x
    for k, (w, b) in enumerate(layers):
        h = sg.nn.linear(h, w, b)
        if k < len(layers) - 1:
            h = sg.gelu(h)
    return h


@sg.typechecked
def probabilities(
    layers: list[tuple[Tensor, Tensor]], x: Float[Tensor, "b 6"]
) -> Float[Tensor, "b 3"]:
    return sg.softmax(forward(layers, x), axis=-1)


def run() -> float:
    return float(probabilities(init(Config(), 0), sg.rand((4, 6))).sum().item())
