"""A deep ensemble: one Module holds every member's weights with a leading ``members``
dim, ``sg.vmap`` runs the per-member function over it (the function takes the same
class, whose fields it sees one member at a time); mean and spread of the predictions."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module


class Ensemble(Module):
    w1: Float[Tensor, "members d h"]
    w2: Float[Tensor, "members h k"]
    b2: Float[Tensor, "members k"]


def member(p: Ensemble, x: Float[Tensor, "n d"]) -> Float[Tensor, "n k"]:
    return sg.relu(x @ p.w1) @ p.w2 + p.b2


@sg.typechecked
def predict(p: Ensemble, x: Float[Tensor, "n d"]) -> tuple[Float[Tensor, "n k"], Float[Tensor, "n k"]]:
    probs = sg.softmax(sg.vmap(member, in_axes=(0, None))(p, x), axis=-1)  # [members, n, k]
    mean = probs.mean(axis=0)
    spread = ((probs - mean) ** 2).mean(axis=0)
    return mean, spread


def run() -> float:
    p = Ensemble.init(seed=0, members=3, d=4, h=6, k=2)
    mean, spread = predict(p, sg.randn((5, 4), seed=1))
    return float(mean.sum().item() + spread.sum().item())
