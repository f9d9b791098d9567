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
from jaxbounds.training.progress import ProgressBar
from jaxbounds.training.records import TrainingRecord, leaf_names, weight_norms

__all__ = [
    "ProgressBar",
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


def __getattr__(name: str) -> type:
    """``Progress``: the deprecated name of :class:`ProgressBar` (removed in 0.3)."""
    if name == "Progress":
        from kernels._names import warn_renamed

        warn_renamed("jaxbounds.training.Progress", "ProgressBar", stacklevel=2)
        return ProgressBar
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
