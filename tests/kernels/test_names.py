"""The one vocabulary of counts (issue 30): renamed keywords, their deprecation, concrete ints."""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import _checks
from kernels import rademacher as rad
from kernels._names import method_count, renamed_kwargs
from tests.helpers import count_compiles

KEY = jax.random.key(3)
DIAG = jnp.array([1.0, 2.0, 3.0, 4.0])


def diag_mv(v):
    return DIAG * v


def quad_loss(p, b):
    return 0.5 * jnp.sum(b * p["w"] ** 2)


def linear_apply(w, x):
    return x @ w


def parity(bits):
    return jnp.prod(1.0 - 2.0 * bits.astype(jnp.float32))


PARAMS = {"w": jnp.ones(4)}
BATCH = jnp.array([1.0, 2.0, 3.0, 4.0])
GGN_BATCH = (jnp.eye(4), jnp.zeros(4))

# (kernel, old name, a call with the old name, the same call with the new name)
RENAMED = {
    "hutchinson_trace": (
        "num_probes",
        lambda **c: kernels.hutchinson_trace(diag_mv, 4, KEY, **c),
    ),
    "slq_nodes": (
        "num_probes",
        lambda **c: kernels.slq_nodes(diag_mv, 4, KEY, num_steps=2, **c).nodes,
    ),
    "spectral_density": (
        "num_probes",
        lambda **c: kernels.spectral_density(diag_mv, 4, KEY, num_steps=2, num_grid=8, **c).density,
    ),
    "hessian_trace": (
        "num_matvecs",
        lambda **c: kernels.hessian_trace(quad_loss, PARAMS, BATCH, KEY, **c),
    ),
    "ggn_trace": (
        "num_matvecs",
        lambda **c: kernels.ggn_trace(
            linear_apply, jnp.zeros(4), GGN_BATCH, KEY, loss="squared_error", **c
        ),
    ),
    "rademacher_linear": (
        "num_draws",
        lambda **c: rad.rademacher_linear(jnp.eye(4), KEY, norm=2, radius=1.0, **c),
    ),
    "rademacher_finite": (
        "num_draws",
        lambda **c: rad.rademacher_finite(lambda i, v: v[i], jnp.eye(4), KEY, num_members=4, **c),
    ),
    "rademacher_search": (
        "num_draws",
        lambda **c: rad.rademacher_search(
            linear_apply,
            jnp.ones(4),
            jnp.eye(4),
            KEY,
            project=lambda w: kernels.project_lp_ball(w, p=2, radius=1.0),
            num_steps=2,
            step_size=0.5,
            **c,
        ),
    ),
    "rademacher_readout_search": (
        "num_draws",
        lambda **c: rad.rademacher_readout_search(
            lambda v, x: x @ v,
            jnp.ones((4, 2)),
            jnp.eye(4),
            KEY,
            project=lambda v: v,
            readout_norm=2,
            readout_radius=1.0,
            num_steps=1,
            step_size=1.0,
            **c,
        ),
    ),
    "sign_vectors": ("num_draws", lambda **c: rad.sign_vectors(KEY, num_examples=5, **c)),
    "mcdiarmid_halfwidth": (
        "num_draws",
        lambda **c: rad.mcdiarmid_halfwidth(1.0, num_examples=50, delta=0.05, **c),
    ),
}


def leaves(out):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_old_name_warns_and_gives_the_same_result(name):
    old, call = RENAMED[name]
    new_value = call(num_samples=6)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated") as caught:
        old_value = call(**{old: 6})
    message = str(caught[0].message)
    assert message.startswith(f"{old} is deprecated")
    assert "use num_samples" in message
    assert f"({old} will be removed in 0.3)" in message
    assert caught[0].filename == __file__  # the warning points at the caller's line
    for a, b in zip(leaves(old_value), leaves(new_value), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_old_and_new_name_together_raise_naming_both(name):
    old, call = RENAMED[name]
    with pytest.raises(ValueError, match=f"{old} and num_samples|num_samples and {old}"):
        call(**{old: 6, "num_samples": 6})


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_signature_shows_the_new_name(name):
    fn = getattr(kernels, name, None) or getattr(rad, name)
    params = inspect.signature(fn).parameters
    assert "num_samples" in params
    old = RENAMED[name][0]
    if name in ("hessian_trace", "ggn_trace"):
        assert old in params  # Hutch++'s budget keeps its name
    else:
        assert old not in params


def test_old_name_inside_a_users_jit():
    def f(key):
        return kernels.hutchinson_trace(diag_mv, 4, key, num_probes=4).mean

    with pytest.warns(DeprecationWarning, match="num_probes is deprecated") as caught:
        value = jax.jit(f)(KEY)
    assert caught[0].filename == __file__
    expected = kernels.hutchinson_trace(diag_mv, 4, KEY, num_samples=4).mean
    np.testing.assert_array_equal(value, expected)


def test_both_spellings_share_one_compilation():
    x = jnp.arange(12.0).reshape(4, 3)
    y = x + 1
    with count_compiles() as compiled:
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_samples=5)
        first = len(compiled)
        with pytest.warns(DeprecationWarning, match="num_draws"):
            rad.rademacher_linear(y, KEY, norm=2, radius=1.0, num_draws=5)
    assert first >= 1
    assert len(compiled) == first


@pytest.mark.parametrize("kernel", ["hessian_trace", "ggn_trace"])
def test_method_picks_the_count(kernel):
    call = RENAMED[kernel][1]
    with pytest.raises(ValueError, match="num_samples and num_matvecs"):
        call(num_samples=8, num_matvecs=8)
    with pytest.raises(ValueError, match=r"^num_samples: required with method='hutchinson'"):
        call()
    with pytest.raises(ValueError, match=r"^num_matvecs: required with method='hutchpp'"):
        call(method="hutchpp")
    with pytest.raises(ValueError, match="method='hutchpp' takes a budget of products"):
        call(num_samples=8, method="hutchpp")
    with pytest.raises(ValueError, match=r"^method: expected 'hutchinson' or 'hutchpp'"):
        call(num_samples=8, method="exact")
    # a too-small deprecated count is refused under the name the caller used
    with (
        pytest.warns(DeprecationWarning, match="num_matvecs is deprecated"),
        pytest.raises(ValueError, match=r"^num_matvecs: "),
    ):
        call(num_matvecs=1)
    with pytest.raises(ValueError, match=r"^num_samples: expected an int >= 2, got 1\b"):
        call(num_samples=1)
    # tr diag(b) = 10; G = (2 / n) X'X = I / 2 for X = I_4 and the mean squared error: tr 2
    exact = 10.0 if kernel == "hessian_trace" else 2.0
    # Hutch++ with a budget of 3 n products is exact; Hutchinson is exact for a diagonal matrix
    np.testing.assert_allclose(call(num_matvecs=12, method="hutchpp").mean, exact, rtol=1e-5)
    np.testing.assert_allclose(call(num_samples=4).mean, exact, rtol=1e-6)


def test_renamed_kwargs_helper():
    @renamed_kwargs(num_draws="num_samples")
    def f(*, num_samples):
        return num_samples

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(num_samples=3) == 3  # the new name never warns
    with pytest.warns(DeprecationWarning, match="num_draws is deprecated"):
        assert f(num_draws=4) == 4
    assert f._renamed_kwargs == {"num_draws": "num_samples"}
    assert list(inspect.signature(f).parameters) == ["num_samples"]
    with pytest.raises(ValueError, match=r"^method: "):
        method_count("hutch", 4, None, stacklevel=1)


# ----------------------------------------------------------------- concrete integers (item 3)

INT_KINDS = {
    "np.int64": np.int64,
    "np.int32": np.int32,
    "jnp.int32": jnp.int32,
    "0-d array": lambda v: np.array(v, np.int64),
}

# kernel -> (call, its count keywords with valid values)
COUNTS = {
    "hutchinson_trace": (
        lambda **c: kernels.hutchinson_trace(diag_mv, 4, KEY, **c),
        {"num_samples": 5, "chunk_size": 2},
    ),
    "hutchpp_trace": (
        lambda **c: kernels.hutchpp_trace(diag_mv, 4, KEY, **c),
        {"num_matvecs": 7, "chunk_size": 3},
    ),
    "hessian_trace": (
        lambda **c: kernels.hessian_trace(quad_loss, PARAMS, BATCH, KEY, **c),
        {"num_samples": 16, "chunk_size": 4},
    ),
    "hessian_trace_hutchpp": (
        lambda **c: kernels.hessian_trace(quad_loss, PARAMS, BATCH, KEY, method="hutchpp", **c),
        {"num_matvecs": 16, "max_memory_bytes": 10**6},
    ),
    "ggn_trace": (
        lambda **c: kernels.ggn_trace(
            linear_apply, jnp.zeros(4), GGN_BATCH, KEY, loss="squared_error", **c
        ),
        {"num_samples": 6},
    ),
    "mc_fisher_trace": (
        lambda **c: kernels.mc_fisher_trace(
            linear_apply, jnp.zeros(4), GGN_BATCH, KEY, loss="squared_error", **c
        ),
        {"num_samples": 3, "chunk_size": 2, "example_chunk_size": 2},
    ),
    "lanczos": (lambda **c: kernels.lanczos(diag_mv, 4, KEY, **c), {"num_steps": 3}),
    "top_eigenvalues": (
        lambda **c: kernels.top_eigenvalues(diag_mv, 4, KEY, **c),
        {"k": 2, "num_steps": 4},
    ),
    "slq_nodes": (
        lambda **c: kernels.slq_nodes(diag_mv, 4, KEY, **c),
        {"num_samples": 3, "num_steps": 2, "chunk_size": 2},
    ),
    "spectral_density": (
        lambda **c: kernels.spectral_density(diag_mv, 4, KEY, **c),
        {"num_samples": 3, "num_steps": 2, "num_grid": 8},
    ),
    "rademacher_linear": (
        lambda **c: rad.rademacher_linear(jnp.eye(4), KEY, norm=2, radius=1.0, **c),
        {"num_samples": 16, "chunk_size": 4},
    ),
    "rademacher_finite": (
        lambda **c: rad.rademacher_finite(lambda i, v: v[i], jnp.eye(4), KEY, **c),
        {"num_samples": 6, "num_members": 4, "member_chunk_size": 2, "chunk_size": 4},
    ),
    "rademacher_search": (
        RENAMED["rademacher_search"][1],
        {"num_samples": 4, "num_restarts": 2, "chunk_size": 2},
    ),
    "rademacher_readout_search": (
        RENAMED["rademacher_readout_search"][1],
        {"num_samples": 4, "chunk_size": 2},
    ),
    "rademacher_exact": (
        lambda **c: rad.rademacher_exact(rad.linear_sup(jnp.eye(3), norm=1, radius=1.0), **c),
        {"num_examples": 3, "chunk_size": 4},
    ),
    "sign_vectors": (
        lambda **c: rad.sign_vectors(KEY, **c),
        {"num_samples": 3, "num_examples": 5},
    ),
    "mcdiarmid_halfwidth": (
        lambda **c: rad.mcdiarmid_halfwidth(1.0, delta=0.05, **c),
        {"num_samples": 4, "num_examples": 50},
    ),
    "average_sharpness": (
        lambda **c: kernels.average_sharpness(
            quad_loss, PARAMS, BATCH, KEY, perturbation=kernels.Perturbation("gaussian", 0.1), **c
        ),
        {"num_samples": 4, "chunk_size": 2},
    ),
    "sharpness_decomposition": (
        lambda **c: kernels.sharpness_decomposition(
            quad_loss, PARAMS, BATCH, KEY, perturbation=kernels.Perturbation("gaussian", 0.1), **c
        ),
        {"num_samples": 4, "num_probes": 3, "chunk_size": 2},
    ),
    "perturbed_hessian_traces": (
        lambda **c: kernels.perturbed_hessian_traces(
            quad_loss, PARAMS, BATCH, KEY, perturbation=kernels.Perturbation("gaussian", 0.1), **c
        ),
        {"num_samples": 3, "num_probes": 2, "chunk_size": 2},
    ),
    "worst_case_sharpness": (
        lambda **c: kernels.worst_case_sharpness(
            quad_loss, PARAMS, BATCH, KEY, perturbation=kernels.Perturbation("l2_ball", 0.1), **c
        ),
        {"num_steps": 3, "num_restarts": 2},
    ),
    "sigma_search": (
        lambda **c: (
            kernels.sigma_search(
                quad_loss,
                PARAMS,
                BATCH,
                KEY,
                perturbation=kernels.Perturbation("gaussian", 0.1),
                target_increase=0.01,
                **c,
            ).sigma
        ),
        {"num_samples": 4, "num_steps": 3, "chunk_size": 2},
    ),
    "mc_fisher": (
        lambda **c: kernels.mc_fisher(
            linear_apply, jnp.zeros(4), GGN_BATCH, KEY, loss="squared_error", **c
        )(jnp.ones(4)),
        {"num_samples": 3},
    ),
    "low_degree_test": (
        lambda num_bits=4, **c: (
            kernels.testers.low_degree_test(parity, num_bits, KEY, **c).accepted
        ),
        {"num_bits": 4, "degree": 3, "num_trials": 6, "chunk_size": 2},
    ),
    "sparsity_test": (
        lambda **c: kernels.testers.sparsity_test(parity, 4, KEY, **c).accepted,
        {"sparsity": 4, "num_restrict": 2, "num_trials": 6, "chunk_size": 2},
    ),
    "dudley_integral": (
        lambda **c: kernels.dudley_integral(lambda e: 1.0 / e**2, radius=1.0, **c).value,
        {"num_examples": 10, "num_grid": 64},
    ),
    "maurey_sparsify": (
        lambda **c: kernels.maurey_sparsify(jnp.array([0.5, -0.25, 0.25]), KEY, radius=1.0, **c),
        {"num_atoms": 5},
    ),
    "sign_chunk": (
        lambda **c: rad.sign_chunk(KEY, 1, **c),
        {"chunk_size": 3, "num_examples": 5},
    ),
    "map_chunked": (
        lambda **c: kernels.parallel.map_chunked(lambda x: x**2, jnp.arange(5.0), **c),
        {"chunk_size": 2},
    ),
    "sample_statistics": (
        lambda **c: (
            kernels.parallel.sample_statistics(lambda k: jax.random.normal(k), KEY, **c).mean
        ),
        {"num_samples": 9, "chunk_size": 4},
    ),
    "hutchpp_memory_bytes": (
        lambda **c: kernels.hutchpp_memory_bytes(size=10, dtype="float32", **c),
        {"num_matvecs": 9},
    ),
}


@pytest.mark.parametrize("kind", sorted(INT_KINDS))
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_concrete_integer_counts_are_ints(name, kind):
    call, counts = COUNTS[name]
    expected = call(**counts)
    converted = {k: INT_KINDS[kind](v) for k, v in counts.items()}
    got = call(**converted)
    for a, b in zip(leaves(got), leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_bad_counts_name_the_argument(name):
    call, counts = COUNTS[name]
    count = next(iter(counts))
    for bad, shown in [
        (float(counts[count]), repr(float(counts[count]))),
        (np.float64(counts[count]), "float64 scalar"),
        (jnp.float32(counts[count]), "float32[] array"),
        (True, "True"),
        (np.array([counts[count]]), "int64[1] array"),
    ]:
        with pytest.raises(ValueError, match=f"^{count}: ") as info:
            call(**{**counts, count: bad})
        message = str(info.value)
        assert shown in message, message
        assert "Tracer" not in message


@pytest.mark.parametrize("name", ["hutchinson_trace", "rademacher_linear", "hessian_trace"])
def test_traced_count_is_refused_naming_it(name):
    call, counts = COUNTS[name]
    count = next(iter(counts))

    def f(n):
        return call(**{**counts, count: n})

    with pytest.raises(ValueError, match=f"^{count}: expected a concrete int") as info:
        jax.jit(f)(counts[count])
    assert "Tracer" not in str(info.value)


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        (jnp.zeros(2, jnp.float32), "float32[2] array"),
        (np.zeros(2, np.float64), "float64[2] array"),
        (0, "0"),
        (jax.random.split(KEY, 2), "shape (2,)"),
        (jnp.zeros(3, jnp.uint32), "uint32[3] array"),
    ],
)
def test_bad_key_message(bad, shown):
    calls = [
        lambda k: kernels.hessian_trace(quad_loss, PARAMS, BATCH, k, num_samples=2),
        lambda k: kernels.hutchinson_trace(diag_mv, 4, k, num_samples=2),
        lambda k: rad.rademacher_linear(jnp.eye(3), k, norm=2, radius=1.0, num_samples=2),
        lambda k: kernels.ggn_trace(
            linear_apply, jnp.zeros(4), GGN_BATCH, k, loss="squared_error", num_samples=2
        ),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"^key: expected (a|one) PRNG key") as info:
            call(bad)
        assert shown in str(info.value)
        assert "Tracer" not in str(info.value)


def test_describe_never_shows_a_tracer():
    seen = []
    jax.jit(lambda x: seen.append(_checks.describe(x)) or x)(jnp.zeros((2, 3), jnp.float32))
    assert seen == ["float32[2, 3] array"]
    assert _checks.concrete_int(jnp.int32(7)) == 7
    assert _checks.concrete_int(np.array(7)) == 7
    assert _checks.concrete_int(True) is None
    assert _checks.concrete_int(np.array([7])) is None
    assert _checks.concrete_int(7.0) is None


# ----------------------------------------------------------------- chunk_size="auto" everywhere


GAUSS = kernels.Perturbation("gaussian", 0.1)
SHARP = (quad_loss, PARAMS, BATCH, KEY)
APPLY = (linear_apply, jnp.zeros(4), GGN_BATCH, KEY)

# kernel -> (call taking chunk_size=..., its default chunk_size on a CPU)
CHUNKED = {
    "hutchinson_trace": (
        lambda **c: kernels.hutchinson_trace(diag_mv, 4, KEY, num_samples=5, **c),
        None,
    ),
    "hutchpp_trace": (lambda **c: kernels.hutchpp_trace(diag_mv, 4, KEY, num_matvecs=7, **c), None),
    "hessian_trace": (lambda **c: kernels.hessian_trace(*SHARP, num_samples=5, **c), None),
    "ggn_trace": (
        lambda **c: kernels.ggn_trace(*APPLY, loss="squared_error", num_samples=5, **c),
        None,
    ),
    "slq_nodes": (
        lambda **c: kernels.slq_nodes(diag_mv, 4, KEY, num_samples=3, num_steps=2, **c),
        None,
    ),
    "spectral_density": (
        lambda **c: kernels.spectral_density(
            diag_mv, 4, KEY, num_samples=3, num_steps=2, num_grid=8, **c
        ),
        None,
    ),
    "mc_fisher_trace": (
        lambda **c: kernels.mc_fisher_trace(*APPLY, loss="squared_error", num_samples=3, **c),
        None,
    ),
    "average_sharpness": (
        lambda **c: kernels.average_sharpness(*SHARP, perturbation=GAUSS, num_samples=4, **c),
        None,
    ),
    "sharpness_decomposition": (
        lambda **c: kernels.sharpness_decomposition(
            *SHARP, perturbation=GAUSS, num_samples=4, num_probes=2, **c
        ),
        None,
    ),
    "perturbed_hessian_traces": (
        lambda **c: kernels.perturbed_hessian_traces(
            *SHARP, perturbation=GAUSS, num_samples=3, num_probes=2, **c
        ),
        None,
    ),
    "sigma_search": (
        lambda **c: kernels.sigma_search(
            *SHARP, perturbation=GAUSS, target_increase=0.01, num_samples=4, num_steps=3, **c
        ),
        None,
    ),
    "rademacher_linear": (
        lambda **c: rad.rademacher_linear(jnp.eye(4), KEY, norm=2, radius=1.0, num_samples=8, **c),
        256,
    ),
    "rademacher_finite": (
        lambda **c: rad.rademacher_finite(
            lambda i, v: v[i], jnp.eye(4), KEY, num_members=4, num_samples=8, **c
        ),
        256,
    ),
    "rademacher_search": (lambda **c: RENAMED["rademacher_search"][1](num_samples=4, **c), 8),
    "rademacher_readout_search": (
        lambda **c: RENAMED["rademacher_readout_search"][1](num_samples=4, **c),
        8,
    ),
    "rademacher_exact": (
        lambda **c: rad.rademacher_exact(rad.linear_sup(jnp.eye(3), norm=1, radius=1.0), **c),
        4096,
    ),
    "low_degree_test": (
        lambda **c: kernels.testers.low_degree_test(parity, 4, KEY, degree=3, num_trials=6, **c),
        None,
    ),
    "sparsity_test": (
        lambda **c: kernels.testers.sparsity_test(
            parity, 4, KEY, sparsity=4, num_restrict=2, num_trials=6, **c
        ),
        None,
    ),
    "degree_sweep": (
        lambda **c: kernels.testers.degree_sweep(
            parity, 4, KEY, max_degree=3, eps=0.5, delta=0.5, **c
        ),
        None,
    ),
    "sparsity_sweep": (
        lambda **c: kernels.testers.sparsity_sweep(
            parity, 4, KEY, sparsities=(2, 4), num_restrict=2, num_trials=4, **c
        ),
        None,
    ),
    "map_chunked": (
        lambda **c: kernels.parallel.map_chunked(lambda x: x**2, jnp.arange(5.0), **c),
        None,
    ),
    "map_samples": (
        lambda **c: kernels.parallel.map_samples(lambda x: x**2, jnp.arange(5.0), **c),
        None,
    ),
    "sample_statistics": (
        lambda **c: (
            kernels.parallel.sample_statistics(
                lambda k: jax.random.normal(k), KEY, num_samples=9, **c
            ).mean
        ),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CHUNKED))
def test_chunk_size_auto_none_and_ints_everywhere(name):
    call, cpu_default = CHUNKED[name]
    auto = call(chunk_size="auto")
    one_at_a_time = call(chunk_size=None)
    by_two = call(chunk_size=2)
    if not kernels._backend.is_accelerator():  # "auto" is the CPU default, bit for bit
        for a, b in zip(leaves(auto), leaves(call(chunk_size=cpu_default)), strict=True):
            np.testing.assert_array_equal(a, b)
    # the chunk size never changes the result beyond float reassociation
    for a, b, c in zip(leaves(auto), leaves(one_at_a_time), leaves(by_two), strict=True):
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
    for bad in ("fast", "AUTO", 0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"^chunk_size: expected") as info:
            call(chunk_size=bad)
        assert "Tracer" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        (
            "delta",
            lambda: rad.rademacher_linear(
                jnp.eye(3), KEY, norm=2, radius=1.0, num_samples=4, delta=jnp.float32(0.05)
            ),
        ),
        (
            "linearize",
            lambda: kernels.top_eigenvalues(
                diag_mv, 4, KEY, k=1, num_steps=2, linearize=jnp.bool_(True)
            ),
        ),
        (
            "antithetic",
            lambda: kernels.average_sharpness(
                *SHARP, perturbation=GAUSS, num_samples=4, antithetic=jnp.bool_(True)
            ),
        ),
        (
            "eps",
            lambda: kernels.testers.sparsity_test(
                parity, 4, KEY, sparsity=4, num_restrict=2, num_trials=4, eps=jnp.float32(2.0)
            ),
        ),
        (
            "chunk_size",
            lambda: kernels.hutchinson_trace(
                diag_mv, 4, KEY, num_samples=4, chunk_size=jnp.float32(2.0)
            ),
        ),
    ],
)
def test_array_arguments_are_described_not_shown_as_tracers(name, call):
    with pytest.raises(ValueError, match=f"^{name}: ") as info:
        call()
    message = str(info.value)
    assert "Tracer" not in message
    assert "[] array" in message
