"""A hand-written training loop: compile `value_and_grad` of the loss, update the parameters yourself.

Two concentric circles, a 2-32-2 MLP with cross-entropy, SGD with momentum written out.
Run: python examples/custom_loop.py [epochs]
"""

import sys

import shapegrad as sg
from shapegrad import Float, Int, Tensor, data


class MLP(sg.ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"],
                       Float[Tensor, "2 h"], Float[Tensor, "2"]]):  # fmt: skip
    names = ("w1", "b1", "w2", "b2")


def loss(params: MLP, x: Float[Tensor, "b 2"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(sg.nn.mlp(params, x, activation=sg.tanh), y)


# One compiled function returns the loss and the gradients, shaped like MLP (same names).
loss_and_grads = sg.compile(sg.value_and_grad(loss), backend="c")

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
x, y = data.make_circles(800, noise=0.05, seed=0)
params = MLP.init(sg.nn.init.xavier, seed=0, h=32)
velocity = params.map(sg.zeros_like)
lr, momentum = 0.1, 0.9
batches = data.Batches(x, y, batch_size=32, seed=0)  # reshuffled on every pass
for epoch in range(epochs):
    for xb, yb in batches:
        value, grads = loss_and_grads(params, sg.tensor(xb), sg.tensor(yb))
        velocity = velocity.map(lambda v, g: momentum * v + g, grads)
        params = params.map(lambda p, v: p - lr * v, velocity)
    if epoch % 10 == 0 or epoch == epochs - 1:
        print(f"epoch {epoch:3d}  loss {value.item():.4f}")

predicted = sg.nn.mlp(params, sg.tensor(x), activation=sg.tanh).numpy().argmax(axis=1)
print(f"training accuracy: {(predicted == y).mean():.1%}")
# print(loss_and_grads.graph(params, sg.tensor(xb), sg.tensor(yb))) shows the optimized IR;
# SHAPEGRAD_DEBUG=<dir> python examples/custom_loop.py dumps every stage and the C source.
