"""An LSTM that remembers: at every step, output the digit it saw `delay` steps earlier.

Embedding -> LSTM (PyTorch's gate math and weight layout, run over time by `sg.scan`, so
the step is traced and compiled once) -> Linear head. Trained with ScalarTrainer
(compiled C); the trained model then runs eagerly and compiled, and both agree.
Swap `sg.nn.LSTM` for `sg.nn.GRU` (it returns `ys, h`) to try a GRU.
Run: python examples/lstm.py [steps]
"""

import sys

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import LSTM, Embedding, Linear, Module, field

digits, delay, length = 8, 3, 12


class Recaller(Module):
    embed: Embedding = field(dims={"v": "v", "d": "d"})
    rnn: LSTM
    head: Linear = field(dims={"d_in": "h", "d_out": "v"})

    def __call__(self, ids: Int[Tensor, "b t"]) -> Float[Tensor, "b t v"]:
        ys, _ = self.rnn(self.embed(ids))
        return self.head(ys)


def loss(model: Recaller, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b s"]) -> Float[Tensor, ""]:
    scores = model(ids)[:, delay:]  # from step `delay` on there is something to recall
    return sg.cross_entropy(scores.view(-1, digits), targets.view(-1))


def batch(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, digits, size=(size, length)).astype(np.int32)
    return ids, ids[:, : length - delay]  # step i's target: the digit of step i - delay


model = Recaller.init(seed=0, v=digits, d=16, h=64)
print(model.summary())
trainer = sg.ScalarTrainer(loss, model, optimizer=sg.optim.Adam(lr=1e-2))  # compiled C by default
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
rng = np.random.default_rng(0)
for step in range(steps):
    value = trainer.step(*batch(rng, 32))
    if step % 100 == 0 or step == steps - 1:
        print(f"step {step:4d}  loss {value:.4f}")

trained, (ids, targets) = trainer.get_params(), batch(np.random.default_rng(1), 256)
eager = trained(sg.tensor(ids)).numpy()
compiled = sg.compile(lambda m, i: m(i), backend="c")(trained, sg.tensor(ids)).numpy()
print(f"eager vs compiled C: max |difference| {np.abs(eager - compiled).max():.2e}")
assert np.allclose(eager, compiled, rtol=1e-4, atol=1e-4), "eager and compiled C disagree"
correct = eager.argmax(axis=-1)[:, delay:] == targets
print(f"delayed-copy accuracy: {correct.mean():.1%}")
