"""An LSTM that remembers: at every step, output the digit it saw `delay` steps earlier.

Embedding -> LSTM (PyTorch's gate math and weight layout, run over time by `sg.scan`, so
the step is traced and compiled once) -> Linear head. Trained with ScalarTrainer's `fit`
(compiled C, or `--eager`; a progress bar); the trained model then runs eagerly and
compiled, and both agree. tests/torch_models.py holds the same model in PyTorch.
Swap `sg.nn.LSTM` for `sg.nn.GRU` (it returns `ys, h`) to try a GRU.
Run: python examples/lstm.py [steps] [--eager]
"""

import argparse
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


def loss(
    model: Recaller, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b s"]
) -> Float[Tensor, ""]:
    scores = model(ids)[:, delay:]  # from step `delay` on there is something to recall
    return sg.cross_entropy(scores.view(-1, digits), targets.view(-1))


def train(
    model: Recaller, batches: list, eager: bool = False, progress: bool = True
) -> tuple[Recaller, list[float]]:
    trainer = sg.ScalarTrainer(
        loss, model, mode="eager" if eager else "compiled", optimizer=sg.optim.Adam(lr=1e-2)
    )
    losses = trainer.fit(batches, progress=progress).loss
    return trainer.get_params(), losses


def batch(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, digits, size=(size, length)).astype(np.int32)
    return ids, ids[:, : length - delay]  # step i's target: the digit of step i - delay


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=400)
    parser.add_argument("--eager", action="store_true", help="train eagerly instead of compiled C")
    args = parser.parse_args(sys.argv[1:])

    model = Recaller.init(seed=0, v=digits, d=16, h=64)
    print(model.summary())
    rng = np.random.default_rng(0)
    trained, losses = train(model, [batch(rng, 32) for _ in range(args.steps)], eager=args.eager)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'eager' if args.eager else 'compiled C'})")

    ids, targets = batch(np.random.default_rng(1), 256)
    eager = trained(sg.tensor(ids)).numpy()
    compiled = sg.compile(lambda m, i: m(i), backend="c")(trained, sg.tensor(ids)).numpy()
    print(f"eager vs compiled C: max |difference| {np.abs(eager - compiled).max():.2e}")
    assert np.allclose(eager, compiled, rtol=1e-4, atol=1e-4), "eager and compiled C disagree"
    correct = eager.argmax(axis=-1)[:, delay:] == targets
    print(f"delayed-copy accuracy: {correct.mean():.1%}")
