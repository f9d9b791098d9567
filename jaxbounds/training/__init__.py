"""Training: one package for the full-batch GD and minibatch optax loops, losses and records."""

from jaxbounds.training.loops import make_step, train_gd, train_minibatch
from jaxbounds.training.losses import (
    accuracy,
    classification_loss,
    cross_entropy_loss,
    logistic_loss,
    squared_loss,
)
from jaxbounds.training.progress import Progress
from jaxbounds.training.records import TrainingRecord, leaf_names, weight_norms

__all__ = [
    "Progress",
    "TrainingRecord",
    "accuracy",
    "classification_loss",
    "cross_entropy_loss",
    "leaf_names",
    "logistic_loss",
    "make_step",
    "squared_loss",
    "train_gd",
    "train_minibatch",
    "weight_norms",
]
