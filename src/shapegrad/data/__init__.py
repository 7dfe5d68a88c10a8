"""Datasets and batching: toy 2-d problems, scikit-learn's digits, and a mini-batch iterator.

Example:
    >>> from shapegrad import data
    >>> x, y = data.make_moons(100, seed=0)
    >>> len(data.Batches(x, y, batch_size=32))
    3
"""

from shapegrad.data.batching import Batches, LastBatch
from shapegrad.data.digits import Split, load_digits, stratified_split
from shapegrad.data.synthetic import make_circles, make_moons, make_spirals

__all__ = [
    "Batches",
    "LastBatch",
    "Split",
    "load_digits",
    "make_circles",
    "make_moons",
    "make_spirals",
    "stratified_split",
]
