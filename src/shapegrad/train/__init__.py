"""Training: optimizers, learning-rate schedules, losses, mixed precision and ScalarTrainer.

Example:
    >>> trainer = sg.ScalarTrainer(loss, params, optimizer=sg.optim.Adam(lr=1e-3))
    >>> history = trainer.fit(sg.data.Batches(x, y, batch_size=32), epochs=10)
"""

from shapegrad.train import losses, optim, schedules
from shapegrad.train.fit import History, StepInfo, StopTraining
from shapegrad.train.losses import accuracy, predict, softmax_cross_entropy
from shapegrad.train.optim import SGD, Adam, AdamW, Optimizer, clip_by_global_norm
from shapegrad.train.trainer import ScalarTrainer

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "History",
    "Optimizer",
    "ScalarTrainer",
    "StepInfo",
    "StopTraining",
    "accuracy",
    "clip_by_global_norm",
    "losses",
    "optim",
    "predict",
    "schedules",
    "softmax_cross_entropy",
]
