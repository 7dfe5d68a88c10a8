"""Bug: ``sg.vmap`` over two arguments whose batch sizes differ (8 examples, 6 labels)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def squared_error(pred: Float[Tensor, " k"], target: Float[Tensor, " k"]) -> Float[Tensor, ""]:
    return ((pred - target) ** 2).sum()


def per_example_errors(preds: Float[Tensor, "8 4"], targets: Float[Tensor, "6 4"]) -> Tensor:
    # E: squared_error: dimension 'vmap_batch' is 8 in preds but 6 in targets
    return sg.vmap(squared_error)(preds, targets)


def run() -> None:
    per_example_errors(sg.randn((8, 4)), sg.randn((6, 4)))
