"""`shapegrad demo moons` in 30 lines: a 2-16-16-1 MLP, hinge loss, compiled C training step.

Run: python examples/moons.py [epochs]
"""

import sys

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor, data, plot


class MLP(sg.ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"], Float[Tensor, "h h"],
                       Float[Tensor, "h"], Float[Tensor, "1 h"], Float[Tensor, "1"]]):  # fmt: skip
    names = ("w1", "b1", "w2", "b2", "w3", "b3")


def scores(params: MLP, x: Float[Tensor, "b 2"]) -> Float[Tensor, " b"]:
    return sg.nn.mlp(params, x).reshape((x.shape[0],))


def loss(params: MLP, x: Float[Tensor, "b 2"], y: Float[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.hinge(scores(params, x), y)  # mean(relu(1 - y * score)), y in {-1, +1}


epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
x, labels = data.make_moons(1000, noise=0.1, seed=0)
batches = data.Batches(x, (2 * labels - 1).astype(np.float32), batch_size=50, last="pad")
trainer = sg.ScalarTrainer(
    loss, MLP.init(sg.nn.init.kaiming, seed=0, h=16), mode="compiled", backend="c",
    optimizer=sg.optim.Adam(lr=0.02),
    schedule=sg.schedules.cosine_with_warmup(0.02, epochs * len(batches), warmup_steps=20),
)  # fmt: skip
history = trainer.fit(batches, epochs=epochs)


def classify(points: np.ndarray) -> np.ndarray:
    return (scores(trainer.get_params(), sg.tensor(points)).numpy() > 0).astype(int)


print(f"training accuracy: {(classify(x) == labels).mean():.1%}")
print(plot.line_chart(history.loss, title="loss", y_min=0.0))
print(plot.decision_boundary(classify, x, labels, title="decision boundary"))
