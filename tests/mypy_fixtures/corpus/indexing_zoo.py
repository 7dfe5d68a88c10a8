"""Indexing in every spelling: negative ints, steps, ellipsis, None, integer-tensor and
list indices, boolean masks reduced with ``where``, and slices computed from ``.shape``."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def crop_center(img: Float[Tensor, "n c h w"], size: int) -> Float[Tensor, "n c s s"]:
    H, W = img.shape[-2:]
    top, left = (H - size) // 2, (W - size) // 2
    return img[:, :, top : top + size, left : left + size]


@sg.typechecked
def every_other(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b u d"]:
    return x[:, ::2]


@sg.typechecked
def reverse_time(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
    return sg.flip(x, axis=1)


@sg.typechecked
def last_channel(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t"]:
    return x[..., -1]


@sg.typechecked
def gather_rows(table: Float[Tensor, "v d"], ids: Int[Tensor, "b k"]) -> Float[Tensor, "b k d"]:
    return table[ids]


@sg.typechecked
def pick_steps(x: Float[Tensor, "b t d"], steps: Int[Tensor, " k"]) -> Float[Tensor, "b k d"]:
    return x[:, steps]


@sg.typechecked
def first_and_last(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b 2 d"]:
    return sg.stack([x[:, 0], x[:, -1]], axis=1)


@sg.typechecked
def with_axes(x: Float[Tensor, "b d"]) -> Float[Tensor, "b 1 d 1"]:
    return x[:, None, :, None]


@sg.typechecked
def diag_scores(q: Float[Tensor, "n d"], k: Float[Tensor, "n d"]) -> Float[Tensor, " n"]:
    n = q.shape[0]
    full = q @ k.T
    idx = sg.arange(n, dtype="int32")
    return full[idx, idx]


@sg.typechecked
def clamp_negatives(x: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    return sg.where(x < 0, sg.zeros_like(x), x)


def run() -> float:
    img = sg.rand((2, 3, 8, 8))
    x = sg.randn((2, 6, 4), seed=0)
    ids = sg.tensor([[0, 2], [1, 1]], dtype="int32")
    out = crop_center(img, 4).sum() + every_other(x).sum() + reverse_time(x).sum()
    out = out + last_channel(x).sum() + gather_rows(sg.randn((5, 4), seed=1), ids).sum()
    out = out + pick_steps(x, sg.tensor([5, 0, 3], dtype="int32")).sum() + first_and_last(x).sum()
    out = out + with_axes(x[:, 0]).sum() + diag_scores(x[0], x[1]).sum() + clamp_negatives(x[0]).sum()
    return float(out.item())
