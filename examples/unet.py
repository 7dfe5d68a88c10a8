"""A small U-Net that denoises the 8x8 digits images.

Encoder block (two 3x3 convolutions, each followed by GroupNorm and SiLU) at 8x8, a 2x2
average-pool down to 4x4 and a wider middle block, a stride-2 `conv_transpose2d` back up
to 8x8, the encoder's output concatenated as a skip connection, a decoder block and a
1x1 convolution that predicts the noise. Trained on images with Gaussian noise added
(`sigma`) to recover the clean image, with ScalarTrainer's `fit` (compiled C, or
`--eager`; a progress bar). tests/torch_models.py holds the same model in PyTorch.
Run: python examples/unet.py [epochs] [--eager]
"""

import argparse
import sys
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Conv2d, GroupNorm, Module, field


class Conv3(Conv2d):  # a 3x3 convolution that keeps the image size
    padding: int | tuple[int, int] = 1


class GN(GroupNorm):
    groups: int = 4


class Block(Module):  # [N, c_in, H, W] -> [N, c, H, W]
    conv1: Conv3 = field(dims={"c_out": "c", "kh": 3, "kw": 3})
    norm1: GN
    conv2: Conv3 = field(dims={"c_in": "c", "c_out": "c", "kh": 3, "kw": 3})
    norm2: GN

    def __call__(self, x: Tensor) -> Tensor:
        x = sg.silu(self.norm1(self.conv1(x)))
        return sg.silu(self.norm2(self.conv2(x)))


class UNet(Module):
    enc: Block = field(dims={"c_in": 1})  # 8x8
    mid: Block = field(dims={"c_in": "c", "c": "2*c"})  # 4x4
    up_w: Float[Tensor, "2*c c 2 2"]  # conv_transpose2d: 4x4 -> 8x8
    up_b: Float[Tensor, " c"]
    dec: Block = field(dims={"c_in": "2*c"})  # skip and upsampled, concatenated
    out: Conv2d = field(dims={"c_in": "c", "c_out": 1, "kh": 1, "kw": 1})

    def __call__(self, noisy: Float[Tensor, "n 1 8 8"]) -> Float[Tensor, "n 1 8 8"]:
        skip = self.enc(noisy)
        h = self.mid(sg.avg_pool2d(skip, 2))
        h = sg.conv_transpose2d(h, self.up_w, self.up_b, stride=2)
        return noisy - self.out(self.dec(sg.cat([skip, h], dim=1)))


def loss(model: UNet, noisy: Tensor, clean: Tensor) -> Float[Tensor, ""]:
    return sg.mse(model(noisy), clean)


def train(
    model: UNet, batches: Any, epochs: int = 1, eager: bool = False, progress: bool = True
) -> tuple[UNet, list[float]]:
    trainer = sg.ScalarTrainer(
        loss, model, mode="eager" if eager else "compiled", optimizer=sg.optim.Adam(lr=3e-3)
    )
    losses = trainer.fit(batches, epochs=epochs, progress=progress).loss
    return trainer.get_params(), losses


def noisy_batches(images: np.ndarray, batch: int, sigma: float, rng: np.random.Generator) -> list:
    order = rng.permutation(len(images))[: len(images) // batch * batch].reshape(-1, batch)
    noise = rng.normal(0.0, sigma, size=(len(order), batch, 1, 8, 8)).astype(images.dtype)
    return [(images[i] + e, images[i]) for i, e in zip(order, noise, strict=True)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("epochs", nargs="?", type=int, default=10)
    parser.add_argument("--eager", action="store_true", help="train eagerly instead of compiled C")
    parser.add_argument("--sigma", type=float, default=0.3)
    args = parser.parse_args(sys.argv[1:])

    digits = sg.data.load_digits(images=True)
    model = UNet.init(seed=0, c=16)
    print(model.summary())
    rng = np.random.default_rng(0)
    batches = lambda epoch: noisy_batches(digits.x_train, 32, args.sigma, rng)  # noqa: E731  new noise every epoch
    trained, losses = train(model, batches, args.epochs, eager=args.eager)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'eager' if args.eager else 'compiled C'})")

    noisy, clean = noisy_batches(
        digits.x_test, len(digits.x_test), args.sigma, np.random.default_rng(1)
    )[0]
    eager = trained(sg.tensor(noisy)).numpy()
    compiled = sg.compile(lambda m, x: m(x), backend="c")(trained, sg.tensor(noisy)).numpy()
    print(f"eager vs compiled C: max |difference| {np.abs(eager - compiled).max():.2e}")
    assert np.allclose(eager, compiled, rtol=1e-3, atol=1e-4), "eager and compiled C disagree"
    before, after = np.mean((noisy - clean) ** 2), np.mean((compiled - clean) ** 2)
    print(f"mean squared error: noisy {before:.4f}, denoised {after:.4f}")
    print(f"noise removed: {100 * (1 - after / before):.1f}% (held-out images)")
