"""A small convolutional network on the 8x8 digits: conv3x3 -> pool -> conv3x3 -> pool -> linear.

Layouts follow PyTorch (NCHW images, OIHW kernels). Needs scikit-learn (the `data` extra).
Run: python examples/cnn_digits.py [epochs]
"""

import sys

import shapegrad as sg
from shapegrad import Float, Int, Tensor, data


class CNN(sg.ParamList[Float[Tensor, "c 1 3 3"], Float[Tensor, "c"],
                       Float[Tensor, "d c 3 3"], Float[Tensor, "d"],
                       Float[Tensor, "10 4*d"], Float[Tensor, "10"]]):  # fmt: skip
    names = ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc_w", "fc_b")


def logits(params: CNN, x: Float[Tensor, "b 1 8 8"]) -> Float[Tensor, "b 10"]:
    w1, b1, w2, b2, fc_w, fc_b = params
    h = sg.max_pool2d(sg.relu(sg.conv2d(x, w1, b1, padding=1)), 2)  # [b, c, 4, 4]
    h = sg.max_pool2d(sg.relu(sg.conv2d(h, w2, b2, padding=1)), 2)  # [b, d, 2, 2]
    return sg.nn.linear(h.reshape((x.shape[0], -1)), fc_w, fc_b)


def loss(params: CNN, x: Float[Tensor, "b 1 8 8"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(logits(params, x), y)


epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
split = data.load_digits(test_fraction=0.2, seed=0, images=True)  # x: [n, 1, 8, 8]
batches = data.Batches(split.x_train, split.y_train, batch_size=32, seed=0, last="pad")
trainer = sg.ScalarTrainer(
    loss,
    CNN.init(sg.nn.init.kaiming, seed=0, c=8, d=16),
    mode="compiled",
    backend="c",
    optimizer=sg.optim.Adam(lr=0.01),
    schedule=sg.schedules.cosine_with_warmup(0.01, epochs * len(batches), warmup_steps=10),
)
trainer.fit(batches, epochs=epochs)

predicted = logits(trainer.get_params(), sg.tensor(split.x_test)).numpy().argmax(axis=1)
print(f"test accuracy: {(predicted == split.y_test).mean():.2%}")
