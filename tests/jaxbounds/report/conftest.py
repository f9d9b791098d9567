"""Tiny runs of the three models, built once per session for the report tests."""

import jax
import pytest

from jaxbounds.data.synthetic import synthetic_digits
from jaxbounds.report import runs
from jaxbounds.report.facts import ScalarConfig

#: A scalar run small enough for the tests: 392 parameters, 40 training sequences, 3 epochs.
TINY = ScalarConfig(
    embed_dim=8,
    seq_len=6,
    sparsity=3,
    num_train=40,
    num_test=30,
    num_epochs=3,
    batch_size=16,
    num_probes=40,
    hutchpp_matvecs=12,
    lanczos_steps=40,
    top_k=2,
)


@pytest.fixture(scope="session")
def scalar_run():
    return runs.scalar_run(jax.random.key(3), TINY, progress=False)


@pytest.fixture(scope="session")
def shallow_run():
    data = synthetic_digits(num=24, seed=1)
    return runs.shallow_run(data, jax.random.key(0), d_m=24, num_steps=4, progress=False)


@pytest.fixture(scope="session")
def construction_run():
    return runs.construction_run(seq_len=6, k=2, key=jax.random.key(0))
