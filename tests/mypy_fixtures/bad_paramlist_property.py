"""Bug: the MLP half of a transformer block reads the up-projection where it needs the down one."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor


class Block(ParamList[Float[Tensor, "c"], Float[Tensor, "c h"], Float[Tensor, "h c"]]):
    names = ("gain", "w_up", "w_down")

    @property
    def gain(self) -> Float[Tensor, " c"]:
        return self[0]

    @property
    def w_up(self) -> Float[Tensor, "c h"]:
        return self[1]

    @property
    def w_down(self) -> Float[Tensor, "h c"]:
        return self[2]


@sg.typechecked
def mlp_block(p: Block, x: Float[Tensor, "b t c"]) -> Float[Tensor, "b t c"]:
    h = sg.gelu(x * p.gain @ p.w_up)
    # E: matmul: inner dimensions disagree: h is [b, t, h], p.w_up is [c, h] (h != c); if h and c are the same size, give them one name
    return x + h @ p.w_up


def run() -> None:
    p = Block([sg.ones((4,)), sg.randn((4, 16)), sg.randn((16, 4))])
    mlp_block(p, sg.rand((2, 3, 4)))
