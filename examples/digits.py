"""A 64-64-64-10 MLP on scikit-learn's 8x8 handwritten digits, trained with a compiled step.

Needs the `data` extra (scikit-learn): pip install -e '.[data]'
Run: python examples/digits.py [epochs]
"""

import sys

import shapegrad as sg
from shapegrad import Float, Int, Tensor, data


class MLP(sg.ParamList[Float[Tensor, "h 64"], Float[Tensor, "h"], Float[Tensor, "h h"],
                       Float[Tensor, "h"], Float[Tensor, "10 h"], Float[Tensor, "10"]]):  # fmt: skip
    names = ("w1", "b1", "w2", "b2", "w3", "b3")


def loss(params: MLP, x: Float[Tensor, "b 64"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(sg.nn.mlp(params, x), y)


epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
split = data.load_digits(test_fraction=0.2, seed=0)  # pixels scaled to [0, 1], per-class split
batches = data.Batches(split.x_train, split.y_train, batch_size=64, seed=0, last="pad")
trainer = sg.ScalarTrainer(
    loss,
    MLP.init(sg.nn.init.kaiming, seed=0, h=64),
    mode="compiled",
    backend="c",
    optimizer=sg.optim.Adam(lr=0.003),
    schedule=sg.schedules.cosine_with_warmup(0.003, epochs * len(batches), warmup_steps=20),
)
history = trainer.fit(batches, epochs=epochs)

logits = sg.nn.mlp(trainer.get_params(), sg.tensor(split.x_test)).numpy()
predicted = logits.argmax(axis=1)
print(f"final training loss: {history.epoch_loss[-1]:.4f}")
print(f"test accuracy: {(predicted == split.y_test).mean():.2%}")
for digit in range(10):
    mine = split.y_test == digit
    print(f"  digit {digit}: {(predicted[mine] == digit).mean():.0%} of {mine.sum()}")
