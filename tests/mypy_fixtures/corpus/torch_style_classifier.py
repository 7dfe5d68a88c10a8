"""A PyTorch-style text classifier: ``.view``, ``.flatten(1)``, ``dim=``/``keepdim=``,
``.unsqueeze(1).expand(...)``, ``.swapaxes`` and ``.T`` (no NumPy spellings)."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def masked_mean(x: Float[Tensor, "b t d"], keep: Float[Tensor, "b t"]) -> Float[Tensor, "b d"]:
    weights = keep.unsqueeze(-1)  # [b, t, 1]
    total = (x * weights).sum(dim=1)
    count = weights.sum(dim=1).clamp(min=1.0)
    return total / count


@sg.typechecked
def add_context(x: Float[Tensor, "b t d"], ctx: Float[Tensor, "b d"]) -> Float[Tensor, "b t d"]:
    B, T, D = x.shape
    return x + ctx.unsqueeze(1).expand(B, T, D)


@sg.typechecked
def conv_over_time(x: Float[Tensor, "b t d"], k: Float[Tensor, "e d 3"]) -> Float[Tensor, "b e t"]:
    return sg.conv1d(x.swapaxes(1, 2), k, padding=1)


@sg.typechecked
def classify(
    x: Float[Tensor, "b t d"],
    keep: Float[Tensor, "b t"],
    k: Float[Tensor, "e d 3"],
    w: Float[Tensor, "c e"],
) -> Float[Tensor, "b c"]:
    h = sg.relu(conv_over_time(x, k))  # [b, e, t]
    pooled = h.max(axis=-1)  # [b, e]
    ctx = add_context(x, masked_mean(x, keep))
    gate = ctx.mean(dim=(1, 2), keepdim=True).view(-1, 1)  # [b, 1]
    return (pooled * sg.sigmoid(gate)) @ w.T


@sg.typechecked
def loss(logits: Float[Tensor, "b c"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    logp = logits - logits.logsumexp(dim=-1, keepdim=True)
    return sg.cross_entropy(logp.view(logp.shape[0], -1), y)


@sg.typechecked
def image_head(img: Float[Tensor, "b c h w"], w: Float[Tensor, "k c*h*w"]) -> Float[Tensor, "b k"]:
    return img.flatten(1) @ w.T


def run() -> float:
    x, keep = sg.randn((2, 5, 4), seed=0), (sg.rand((2, 5), seed=1) > 0.3).float()
    logits = classify(x, keep, sg.randn((6, 4, 3), seed=2), sg.randn((3, 6), seed=3))
    y = sg.tensor([0, 2], dtype="int32")
    head = image_head(sg.rand((2, 3, 4, 4)), sg.randn((5, 48), seed=4))
    return float(loss(logits, y).item()) + float(head.sum().item())
