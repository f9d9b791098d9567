"""Each loss and the accuracy against its closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.training import (
    accuracy,
    classification_loss,
    cross_entropy_loss,
    logistic_loss,
    squared_loss,
)


def test_logistic_loss_closed_form_and_gradient():
    f = jnp.array([0.7, -1.4, 0.35, 30.0])
    y = jnp.array([1, 0, 0, 0])
    s = np.array([1.0, -1.0, -1.0, -1.0])
    expected = np.mean(np.logaddexp(0, -s * np.asarray(f)))
    np.testing.assert_allclose(logistic_loss(f, y), expected, rtol=1e-14)
    # d/df_i = -s_i sigmoid(-s_i f_i) / n: bounded by 1/n (1-Lipschitz in f)
    grad = jax.grad(logistic_loss)(f, y)
    np.testing.assert_allclose(grad, -s / (1 + np.exp(s * np.asarray(f))) / 4, rtol=1e-12)
    assert logistic_loss(f.astype(jnp.float32), y).dtype == jnp.float32


def test_cross_entropy_loss_closed_form():
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0]])
    labels = jnp.array([0, 0])
    expected = np.mean([np.log1p(np.exp(-2.0)), np.log1p(np.exp(1.0))])
    np.testing.assert_allclose(cross_entropy_loss(logits, labels), expected, rtol=1e-12)
    # two classes: the cross-entropy of logits (0, f) is the logistic loss of f
    f = jnp.array([0.3, -2.0])
    two = jnp.stack([jnp.zeros(2), f], axis=1)
    np.testing.assert_allclose(
        cross_entropy_loss(two, jnp.array([1, 0])), logistic_loss(f, jnp.array([1, 0]))
    )


def test_squared_loss_closed_form():
    preds, targets = jnp.array([0.7, -1.4, 0.35]), jnp.array([1.0, 0.0, 2.0])
    expected = np.mean((np.asarray(preds) - np.asarray(targets)) ** 2)
    np.testing.assert_allclose(squared_loss(preds, targets), expected, rtol=1e-14)
    assert float(squared_loss(preds, jnp.array([1, 0, 2]))) == pytest.approx(expected)


def test_classification_loss_and_accuracy_pick_by_shape():
    scores, labels = jnp.array([1.0, -1.0, 2.0]), jnp.array([1, 1, 1])
    assert classification_loss(scores, labels) == logistic_loss(scores, labels)
    np.testing.assert_allclose(accuracy(scores, labels), 2 / 3)
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0]])
    assert classification_loss(logits, jnp.array([0, 0])) == cross_entropy_loss(
        logits, jnp.array([0, 0])
    )
    np.testing.assert_allclose(accuracy(logits, jnp.array([0, 0])), 0.5)
