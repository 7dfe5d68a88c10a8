"""shapegrad: a shape-typed, functional deep-learning framework.

Write a model once against :class:`Tensor` and the functional ops; run it
eagerly (NumPy + tape) or compiled (``sg.compile``).
"""

from shapegrad.autodiff import grad, value_and_grad, vjp
from shapegrad.dtypes import DType, DTypeError, bool_, float16, float32, float64, int32
from shapegrad.functional import (
    abs,
    argmax,
    cos,
    exp,
    log,
    log_softmax,
    logsumexp,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    neg,
    pow,
    relu,
    reshape,
    sigmoid,
    sin,
    softmax,
    sqrt,
    stop_gradient,
    sum,
    tanh,
    transpose,
    var,
    where,
)
from shapegrad.jit import compile
from shapegrad.ops.eager import check_numerics, no_grad, tensor
from shapegrad.shapes import ShapeError
from shapegrad.tensor import Tensor, TraceError

detach = stop_gradient

__version__ = "0.1.0"

__all__ = [
    "DType",
    "DTypeError",
    "ShapeError",
    "Tensor",
    "TraceError",
    "__version__",
    "abs",
    "argmax",
    "bool_",
    "check_numerics",
    "compile",
    "cos",
    "detach",
    "exp",
    "float16",
    "float32",
    "float64",
    "grad",
    "int32",
    "log",
    "log_softmax",
    "logsumexp",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "neg",
    "no_grad",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "sin",
    "softmax",
    "sqrt",
    "stop_gradient",
    "sum",
    "tanh",
    "tensor",
    "transpose",
    "value_and_grad",
    "var",
    "vjp",
    "where",
]
