"""Correct: ``sg.reveal_shape(x)`` makes mypy note the inferred shape (a no-op at run time).

Each ``# N: ...`` comment is the note expected on the next line.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


def repeat_relu(x: Tensor, times: int) -> Tensor:
    for _ in range(times):  # a loop: the plugin does not evaluate this helper
        x = sg.relu(x)
    return x


@sg.typechecked
def features(x: Float[Tensor, "b 784"], ws: list[Tensor]) -> Float[Tensor, "b f"]:
    for w in ws:  # a loop: the body is not evaluated; `f` is a fresh dim at each call
        x = sg.relu(x @ w)
    return x


@sg.typechecked
def head(x: Float[Tensor, "b 784"], w: Float[Tensor, "10 784"]) -> Float[Tensor, "b 10"]:
    # N: Revealed shape is "float[b, 784]"
    sg.reveal_shape(x)
    logits = x @ w.T
    # N: Revealed shape is "float[b, 10]"
    sg.reveal_shape(logits)
    flat = x.reshape(-1)
    # N: Revealed shape is "float[784 * b]"
    sg.reveal_shape(flat)
    # N: Revealed shape is "unknown"
    sg.reveal_shape(repeat_relu(x, 2))
    # N: Revealed shape is "(float[b, 10], float[b, 10])"
    sg.reveal_shape((logits, 2 * logits))
    # N: Revealed shape is "float[b, f]"
    feats = sg.reveal_shape(features(x, [w.T]))
    # N: Revealed shape is "float[b, f]"
    sg.reveal_shape(feats + feats)  # one fresh dim: equal to itself, never known to differ
    # N: Revealed shape is "float[b, 10]"
    return sg.reveal_shape(logits)


def run() -> float:
    return float(head(sg.rand((2, 784)), sg.randn((10, 784))).sum().item())
