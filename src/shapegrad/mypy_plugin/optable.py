"""Where each op the rules describe is defined: ``"shapegrad.functional.relu" -> "relu"``.

Keyed by definition site (what mypy reports as a callee's fullname), not by
bare name, so another function called ``sum`` never gets an op rule. Written
out rather than computed by importing shapegrad: the plugin must start without
loading the runtime (NumPy, jaxtyping, the compiler). ``tests/test_mypy_plugin_rules.py``
checks this table against the runtime's ``__module__``/``__qualname__``.
"""

from __future__ import annotations

_BY_MODULE: dict[str, tuple[str, ...]] = {
    "shapegrad.functional": (
        "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "abs", "neg",
        "stop_gradient", "sum", "mean", "max", "min", "var", "logsumexp", "softmax",
        "log_softmax", "argmax", "maximum", "minimum", "pow", "where", "matmul", "reshape",
        "transpose", "concat", "stack", "cross_entropy", "mse", "hinge", "one_hot", "embedding",
        "squeeze", "expand_dims", "unsqueeze", "erf", "clip", "take", "gather",
    ),
    "shapegrad._composites": (
        "silu", "softplus", "elu", "leaky_relu", "argmin", "all", "any", "norm", "tril", "triu",
        "flip", "roll", "repeat", "tile", "cumsum",
    ),
    "shapegrad._resample": ("conv1d", "conv_transpose2d", "interpolate"),
    "shapegrad._sorting": ("sort", "argsort"),
    "shapegrad._norms": ("layer_norm",),
    "shapegrad._creation": (
        "dropout", "zeros_like", "ones_like", "zeros", "ones", "rand", "randn", "full", "eye",
        "arange",
    ),
    "shapegrad._einsum": ("einsum",),
    "shapegrad._conv": ("conv2d", "max_pool2d", "avg_pool2d"),
    "shapegrad.nn.layers": ("linear", "mlp"),
}  # fmt: skip

OP_FULLNAMES: dict[str, str] = {
    f"{module}.{name}": name for module, names in _BY_MODULE.items() for name in names
}
# `sg.detach` is functional.stop_gradient under another name; its fullname is stop_gradient's.
