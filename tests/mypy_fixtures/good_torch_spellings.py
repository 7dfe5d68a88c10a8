"""Correct: PyTorch's spellings of reductions (``dim=``, ``keepdim=``) and ``flatten(1)``
check like NumPy's (they were read as "no axis": a 0-d result and a false shape error).

Each ``# N: ...`` comment is the note expected on the next line.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def pooled(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b d"]:
    # N: Revealed shape is "float[b, d]"
    sg.reveal_shape(x.mean(dim=1))
    return x.mean(dim=1)


@sg.typechecked
def summed(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b 1 d"]:
    # N: Revealed shape is "float[b, 1, d]"
    sg.reveal_shape(sg.sum(x, dim=1, keepdim=True))
    return sg.sum(x, dim=1, keepdim=True)


@sg.typechecked
def probabilities(x: Float[Tensor, "b c"]) -> Float[Tensor, "b c"]:
    return sg.softmax(x, dim=-1)


@sg.typechecked
def flattened(x: Float[Tensor, "b c h w"]) -> Float[Tensor, "b f"]:
    return x.flatten(1)


def run() -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    img = sg.tensor(rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    total = pooled(x).sum() + summed(x).sum() + probabilities(pooled(x)).sum()
    return float((total + flattened(img).sum()).item())
