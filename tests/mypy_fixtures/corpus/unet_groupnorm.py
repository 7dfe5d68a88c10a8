"""A small U-Net of conv + GroupNorm Modules with nearest upsampling and a concatenated skip."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import GroupNorm, Module, field


class GN2(GroupNorm):
    groups: int = 2


class UNet(Module):
    enc: Float[Tensor, "c 3 3 3"]
    norm_enc: GN2 = field(dims={"c": "c"})
    mid: Float[Tensor, "2*c c 3 3"]
    norm_mid: GN2 = field(dims={"c": "2*c"})
    dec: Float[Tensor, "c 3*c 3 3"]
    out: Float[Tensor, "1 c 1 1"]


def upsample(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    x = sg.stack([x, x], axis=-1).reshape(B, C, H, 2 * W)
    return sg.stack([x, x], axis=3).reshape(B, C, 2 * H, 2 * W)


@sg.typechecked
def forward(m: UNet, x: Float[Tensor, "b 3 8 8"]) -> Float[Tensor, "b 1 8 8"]:
    skip = sg.relu(m.norm_enc(sg.conv2d(x, m.enc, padding=1)))  # [b, c, 8, 8]
    down = sg.max_pool2d(skip, 2)  # [b, c, 4, 4]
    mid = sg.relu(m.norm_mid(sg.conv2d(down, m.mid, padding=1)))  # [b, 2c, 4, 4]
    merged = sg.concat([upsample(mid), skip], axis=1)  # [b, 3c, 8, 8]
    h = sg.relu(sg.conv2d(merged, m.dec, padding=1))
    return sg.conv2d(h, m.out)


def run() -> float:
    m = UNet.init(seed=0, c=4)
    return float(forward(m, sg.rand((2, 3, 8, 8))).mean().item())
