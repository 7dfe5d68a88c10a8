"""Bug: the second layer of an ``sg.nn.mlp`` was sized for 32 hidden units, the first gives 64."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor


class Classifier(
    ParamList[
        Float[Tensor, "64 20"], Float[Tensor, "64"], Float[Tensor, "3 32"], Float[Tensor, "3"]
    ]
):
    names = ("w1", "b1", "w2", "b2")


@sg.typechecked
def classify(params: Classifier, x: Float[Tensor, "b 20"]) -> Float[Tensor, "b 3"]:
    # E: mlp layer 2: input [b, 64] needs a weight [out, 64], got params[2] [3, 32] (64 != 32)
    return sg.nn.mlp(params, x)


def run() -> None:
    params = Classifier.init(sg.nn.init.kaiming, seed=0)
    classify(params, sg.rand((4, 20)))
