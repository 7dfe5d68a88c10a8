"""Neural networks: typed modules, initializers and layers.

* :class:`Module` / :func:`field` (``nn/_module.py``): models as classes of named,
  shape-annotated fields, pytrees that ``sg.grad``/``sg.compile``/trainers accept.
* :mod:`shapegrad.nn.init`: seeded initializers.
* layers: ``linear``/``mlp`` functions and the :class:`Linear` module
  (``nn/layers.py``); :class:`LayerNorm`, :class:`BatchNorm`, :class:`GroupNorm`
  (``nn/norms.py``). Attention and transformer blocks belong in ``nn/attention.py``,
  built on the same Module mechanism; :class:`MultiheadAttention` (``nn/mha.py``) is
  the module form of ``multi_head_attention``.
* PyTorch's everyday layers, each in its own file: :class:`Conv2d` (``nn/conv.py``),
  :class:`Embedding` (``nn/embedding.py``), :class:`Dropout` (``nn/dropout.py``),
  :class:`RMSNorm` (``nn/rms_norm.py``), :class:`LSTMCell`/:class:`GRUCell` and the
  scanned sequence layers :class:`LSTM`/:class:`GRU` (``nn/recurrent.py``).
"""

from shapegrad.nn import init
from shapegrad.nn._module import Module, field
from shapegrad.nn._state import StateUpdates, state_updates
from shapegrad.nn.attention import (
    AttentionParams,
    multi_head_attention,
    scaled_dot_product_attention,
)
from shapegrad.nn.conv import Conv2d
from shapegrad.nn.dropout import Dropout
from shapegrad.nn.embedding import Embedding
from shapegrad.nn.layers import Linear, linear, mlp
from shapegrad.nn.mha import MultiheadAttention
from shapegrad.nn.norms import BatchNorm, GroupNorm, LayerNorm
from shapegrad.nn.recurrent import GRU, LSTM, GRUCell, LSTMCell
from shapegrad.nn.rms_norm import RMSNorm, rms_norm
from shapegrad.nn.transformer import (
    BlockParams,
    BlockStack,
    embed,
    transformer_block,
    transformer_stack,
)

__all__ = [
    "GRU",
    "LSTM",
    "AttentionParams",
    "BatchNorm",
    "BlockParams",
    "BlockStack",
    "Conv2d",
    "Dropout",
    "Embedding",
    "GRUCell",
    "GroupNorm",
    "LSTMCell",
    "LayerNorm",
    "Linear",
    "Module",
    "MultiheadAttention",
    "RMSNorm",
    "StateUpdates",
    "embed",
    "field",
    "init",
    "linear",
    "mlp",
    "multi_head_attention",
    "rms_norm",
    "scaled_dot_product_attention",
    "state_updates",
    "transformer_block",
    "transformer_stack",
]
