"""A tiny GPT language model: token + position embeddings, tied output head, shifted targets."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor

VOCAB, N_CTX, D = 13, 16, 8


class GPT(
    ParamList[Float[Tensor, "v d"], Float[Tensor, "n d"], Float[Tensor, "d d"], Float[Tensor, " d"]]
):
    names = ("wte", "wpe", "w_mix", "ln_f")


@sg.typechecked
def logits_of(params: GPT, idx: Int[Tensor, "b t"]) -> Float[Tensor, "b t v"]:
    wte, wpe, w_mix, ln_f = params
    _, T = idx.shape
    h = sg.embedding(wte, idx) + wpe[:T]
    h = h + sg.tanh(h @ w_mix)
    h = sg.layer_norm(h, ln_f)
    return h @ wte.T


@sg.typechecked
def loss_fn(params: GPT, tokens: Int[Tensor, "b s"]) -> Float[Tensor, ""]:
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = logits_of(params, inputs)
    B, T, V = logits.shape
    return sg.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))


def batch(rng: np.random.Generator, b: int, s: int) -> Int[Tensor, "b s"]:
    return sg.tensor(rng.integers(0, VOCAB, size=(b, s)).astype(np.int32))


def run() -> float:
    rng = np.random.default_rng(0)
    params = GPT([sg.randn((VOCAB, D), seed=1) * 0.1, sg.randn((N_CTX, D), seed=2) * 0.1,
                  sg.randn((D, D), seed=3) * 0.1, sg.ones((D,))])  # fmt: skip
    value, grads = sg.value_and_grad(loss_fn)(params, batch(rng, 2, 9))
    wte_grad = grads[0]
    return float(value.item()) + float(wte_grad.sum().item())
