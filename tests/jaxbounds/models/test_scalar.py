"""ScalarTransformer: the T&T formula, row projection, summed heads, the bound quantities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.models import ScalarTransformer, as_pure, set_params
from jaxbounds.models.scalar import project_rows, scalar_quantities

F64 = jnp.float64


def _model(**kw):
    kw.setdefault("param_dtype", F64)
    return ScalarTransformer(kw.pop("d", 6), rngs=nnx.Rngs(kw.pop("seed", 0)), **kw)


def _inputs(shape, seed=1, scale=2.0):
    return scale * jax.random.normal(jax.random.key(seed), shape, F64)


def _reference(params, x, act=jax.nn.relu, num_classes=None):
    """Direct numpy transcription of the T&T block definition (all rows, then [CLS])."""
    x = np.asarray(x, np.float64)

    def proj(m):
        return m / np.maximum(1.0, np.linalg.norm(m, axis=-1, keepdims=True))

    for i in sorted(params["layers"]):
        layer = {k: np.asarray(v) for k, v in params["layers"][i].items()}
        total = 0.0
        for h in range(layer["w_qk"].shape[0]):
            s = x @ layer["w_qk"][h] @ x.T
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            f = a @ x @ layer["w_v"][h]
            total = total + np.asarray(act(proj(f))) @ layer["w_c"][h]
        x = proj(total)
    return x[0] @ np.asarray(params["w"])


@pytest.mark.parametrize(("layers", "heads", "k", "classes"), [(1, 1, 6, None), (2, 3, 4, 4)])
def test_matches_reference_formula(layers, heads, k, classes):
    model = _model(num_layers=layers, num_heads=heads, hidden_dim=k, num_classes=classes)
    x = _inputs((3, 7, 6))
    apply_fn, params = as_pure(model)
    out = jax.jit(apply_fn)(params, x)
    ref = np.stack([_reference(params, xi) for xi in x])
    expected_shape = (3,) if classes is None else (3, classes)
    assert out.shape == expected_shape
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-12, atol=1e-12)
    # Unbatched input gives the first row.
    np.testing.assert_allclose(jax.jit(apply_fn)(params, x[0]), ref[0], rtol=1e-12, atol=1e-12)


def test_parameter_names_and_shapes():
    model = _model(d=5, num_layers=2, num_heads=3, hidden_dim=4, num_classes=7)
    _, params = as_pure(model)
    shapes = jax.tree_util.tree_map(jnp.shape, params)
    assert shapes == {
        "layers": {i: {"w_qk": (3, 5, 5), "w_v": (3, 5, 4), "w_c": (3, 4, 5)} for i in range(2)},
        "w": (5, 7),
    }
    mats = ScalarTransformer.named_matrices(params)
    assert len(mats) == 2 * 3 * 3 + 1
    np.testing.assert_array_equal(mats["layer1.head2.W_c"], params["layers"][1]["w_c"][2])
    assert model.activation_lipschitz == 1.0


def test_rows_projected_onto_unit_ball():
    model = _model(num_layers=2, num_heads=2)
    x = _inputs((4, 9, 6), scale=50.0)
    norms = jnp.linalg.norm(model.features(x), axis=-1)
    assert model.features(x).shape == (4, 9, 6)
    assert float(jnp.max(norms)) <= 1.0 + 1e-12
    # With W_c scaled up every pre-projection row leaves the ball: all rows land on the sphere.
    _, params = as_pure(model)
    for i in (0, 1):
        params["layers"][i]["w_c"] = 1e3 * params["layers"][i]["w_c"]
    set_params(model, params)
    norms = jnp.linalg.norm(model.features(x), axis=-1)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-12)
    # Scalar output bounded by |w|_2 since |Y_cls| <= 1.
    assert float(jnp.max(jnp.abs(model(x)))) <= float(jnp.linalg.norm(model.w[...])) + 1e-12


def test_project_rows_exact():
    m = jnp.array([[3.0, 4.0], [0.0, 0.0], [0.6, 0.0]], F64)
    np.testing.assert_allclose(project_rows(m), [[0.6, 0.8], [0.0, 0.0], [0.6, 0.0]])
    g = jax.grad(lambda m: jnp.sum(project_rows(m)))(m)
    assert bool(jnp.all(jnp.isfinite(g)))


def test_heads_are_summed():
    """A 2-head layer equals the projection of the sum of the two 1-head pre-projection terms."""
    model = _model(num_heads=2, activation="tanh")
    x = _inputs((7, 6))
    layer = model.layers[0]
    w_qk, w_v, w_c = layer.w_qk[...], layer.w_v[...], layer.w_c[...]

    def head_term(h):
        a = jax.nn.softmax(x @ w_qk[h] @ x.T, axis=-1)
        return jnp.tanh(project_rows(a @ x @ w_v[h])) @ w_c[h]

    expected = project_rows(head_term(0) + head_term(1))
    np.testing.assert_allclose(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert not np.allclose(project_rows(head_term(0)), expected)


def test_k_class_readout_is_linear_in_cls_features():
    model = _model(num_classes=3, num_heads=2)
    x = _inputs((4, 5, 6))
    logits = model(x)
    cls = model.features(x)[:, 0, :]
    assert logits.shape == (4, 3)
    np.testing.assert_allclose(logits, cls @ model.w[...], rtol=1e-12)


@pytest.mark.slow
def test_activations_and_dtypes():
    x = _inputs((2, 3, 4))
    m32 = ScalarTransformer(4, activation="tanh", rngs=nnx.Rngs(0))
    assert m32(x).dtype == jnp.float32
    custom = ScalarTransformer(
        4, activation=jnp.sin, activation_lipschitz=1.0, param_dtype=F64, rngs=nnx.Rngs(0)
    )
    assert custom(x).dtype == F64
    assert custom.activation_lipschitz == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_heads": 0}, "num_heads"),
        ({"hidden_dim": 0}, "hidden_dim"),
        ({"num_classes": 1}, "num_classes"),
        ({"activation": "gelu"}, "activation"),
        ({"activation": jnp.sin}, "activation_lipschitz"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScalarTransformer(4, rngs=nnx.Rngs(0), **kwargs)


def test_bad_input_shape():
    with pytest.raises(ValueError, match="inputs"):
        _model(d=4)(jnp.ones((3, 5), F64))


def test_quantities_measured_on_weights_and_data():
    model = _model(num_layers=2, num_heads=3, hidden_dim=4, d=5)
    x = _inputs((7, 6, 5))
    _, params = as_pure(model)
    q = scalar_quantities(params, x, activation_lipschitz=0.5, loss_lipschitz=2.0)
    assert (q.num_layers, q.num_heads, q.num_classes) == (2, 3, 1)
    assert (q.num_examples, q.seq_len, q.embed_dim, q.hidden_dim) == (7, 6, 5, 4)
    rows = np.asarray(x).reshape(-1, 5)
    assert float(q.input_l2) == pytest.approx(np.linalg.norm(rows, axis=1).max(), rel=1e-12)
    assert float(q.input_l1) == pytest.approx(np.abs(rows).sum(axis=1).max(), rel=1e-12)
    for i in range(2):
        for h in range(3):
            head = q.heads[i][h]
            for name in ("w_qk", "w_v", "w_c"):
                np.testing.assert_array_equal(getattr(head, name), params["layers"][i][name][h])
    np.testing.assert_array_equal(q.readout[:, 0], params["w"])
    assert (q.activation_lipschitz, q.loss_lipschitz) == (0.5, 2.0)
    k_class = scalar_quantities(
        as_pure(_model(num_classes=4))[1], _inputs((2, 3, 6)), activation_lipschitz=1.0
    )
    assert k_class.num_classes == 4
