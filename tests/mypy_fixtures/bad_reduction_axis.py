"""Bug: the per-example log-partition reduces over the batch axis instead of the classes."""

# ruff: noqa: F821  (one-name jaxtyping specs such as "b" look like forward references)

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def log_partition(logits: Float[Tensor, "b 10"]) -> Float[Tensor, "b"]:
    z = sg.logsumexp(logits, axis=0)
    # E: return value z has shape [10], but the annotation says [b] (dimension 0: 10 != b)
    return z


def run() -> None:
    log_partition(sg.randn((4, 10)))
