"""Training: the one training engine (:func:`train`), its two record-keeping shorthands, losses."""

from jaxbounds.training.engine import TrainResult, make_step, train
from jaxbounds.training.loops import train_gd, train_minibatch
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
    "TrainResult",
    "TrainingRecord",
    "accuracy",
    "classification_loss",
    "cross_entropy_loss",
    "leaf_names",
    "logistic_loss",
    "make_step",
    "squared_loss",
    "train",
    "train_gd",
    "train_minibatch",
    "weight_norms",
]
