"""Neural networks: typed modules, initializers and layers.

* :class:`Module` / :func:`field` (``nn/_module.py``): models as classes of named,
  shape-annotated fields, pytrees that ``sg.grad``/``sg.compile``/trainers accept.
* :mod:`shapegrad.nn.init`: seeded initializers.
* layers: ``linear``/``mlp`` functions and the :class:`Linear` module
  (``nn/layers.py``); :class:`LayerNorm`, :class:`BatchNorm`, :class:`GroupNorm`
  (``nn/norms.py``). Attention and transformer blocks belong in ``nn/attention.py``,
  built on the same Module mechanism.
"""

from shapegrad.nn import init
from shapegrad.nn._module import Module, field
from shapegrad.nn.layers import Linear, linear, mlp
from shapegrad.nn.norms import BatchNorm, GroupNorm, LayerNorm

__all__ = ["BatchNorm", "GroupNorm", "LayerNorm", "Linear", "Module", "field", "init", "linear", "mlp"]
