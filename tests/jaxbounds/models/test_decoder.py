"""The Llama-style decoder: shapes, counts, a NumPy reference forward pass, RoPE, GQA, FSDP.

The reference (``reference_logits``) is the architecture written out in float64 NumPy with
explicit loops over heads (query head h reads key/value head h // (H/K)), the RoPE rotation as a
complex multiplication of the pairs (i, i + d_h/2), and no scan or remat: the model in float64
must agree with it to rounding. The placement runs in one subprocess with 8 forced CPU devices
(XLA_FLAGS is read when JAX starts, and this process's JAX has started).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.models import (
    Decoder,
    DecoderConfig,
    abstract_decoder,
    as_pure,
    decoder_batch_sharding,
    decoder_config,
    decoder_num_params,
    next_token_loss,
)
from jaxbounds.models.decoder import rope

ROOT = Path(__file__).resolve().parents[3]
TINY = decoder_config("tiny")


def f64_model(config: DecoderConfig, seed: int = 0):
    config = dataclasses.replace(config, param_dtype=jnp.float64)
    apply_fn, params = as_pure(Decoder(config, rngs=nnx.Rngs(seed)))
    # norms away from 1 so that their weights are tested too
    rng = np.random.default_rng(seed)
    params["final_norm"] = jnp.asarray(1 + 0.3 * rng.normal(size=params["final_norm"].shape))
    for k in ("attn_norm", "mlp_norm"):
        shape = params["layers"][k].shape
        params["layers"][k] = jnp.asarray(1 + 0.3 * rng.normal(size=shape))
    # larger weights than the initialisation: attention patterns far from uniform
    for k in ("wq", "wk", "wv", "wo"):
        params["layers"][k] = params["layers"][k] * 10.0
    return apply_fn, params


def tokens(batch: int, length: int, vocab: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, vocab, size=(batch, length)), jnp.int32)


# ---------------------------------------------------------------------------------------------
# NumPy reference


def np_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """x (T, d_h) for one head: pair (i, i + d_h/2) as the complex number x_i + j x_{i+d/2},
    turned by exp(j t theta^(-2i/d_h))."""
    t_len, d = x.shape
    half = d // 2
    freq = theta ** (-2.0 * np.arange(half) / d)
    z = x[:, :half] + 1j * x[:, half:]
    z = z * np.exp(1j * np.arange(t_len)[:, None] * freq[None, :])
    return np.concatenate([z.real, z.imag], axis=1)


def np_rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * w


def np_softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def reference_logits(config: DecoderConfig, params: dict, toks: np.ndarray) -> np.ndarray:
    c = config
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    out = []
    for seq in np.asarray(toks):
        x = p["embed"][seq]  # (T, d)
        t_len = len(seq)
        for layer in range(c.num_layers):
            w = {k: v[layer] for k, v in p["layers"].items()}
            n = np_rms(x, w["attn_norm"], c.norm_eps)
            q = (n @ w["wq"]).reshape(t_len, c.num_heads, c.head_dim)
            k = (n @ w["wk"]).reshape(t_len, c.num_kv_heads, c.head_dim)
            v = (n @ w["wv"]).reshape(t_len, c.num_kv_heads, c.head_dim)
            heads = []
            for h in range(c.num_heads):
                kv = h // (c.num_heads // c.num_kv_heads)
                qh = np_rope(q[:, h], c.rope_theta)
                kh = np_rope(k[:, kv], c.rope_theta)
                s = qh @ kh.T / math.sqrt(c.head_dim)
                s = np.where(np.tril(np.ones((t_len, t_len), bool)), s, -np.inf)
                heads.append(np_softmax(s) @ v[:, kv])
            x = x + np.concatenate(heads, axis=1) @ w["wo"]
            n = np_rms(x, w["mlp_norm"], c.norm_eps)
            gate = n @ w["w_gate"]
            x = x + (gate / (1 + np.exp(-gate)) * (n @ w["w_up"])) @ w["w_down"]
        x = np_rms(x, p["final_norm"], c.norm_eps)
        head = p["embed"].T if c.tie_embeddings else p["lm_head"]
        out.append(x @ head)
    return np.stack(out)


# ---------------------------------------------------------------------------------------------
# Counts and shapes


def test_parameter_count_tiny_by_hand():
    # V d + d + L (2 d + d (H d_h) + 2 d (K d_h) + (H d_h) d + 3 d F), V=64, d=32, L=2, H=4,
    # K=2, d_h=8, F=64: 2048 + 32 + 2 * (64 + 1024 + 512 + 1024 + 6144) = 20640
    assert decoder_num_params(TINY) == 20640
    _, params = as_pure(Decoder(TINY, rngs=nnx.Rngs(0)))
    assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)) == 20640
    untied = dataclasses.replace(TINY, tie_embeddings=False)
    assert decoder_num_params(untied) == 20640 + 64 * 32
    _, params = as_pure(Decoder(untied, rngs=nnx.Rngs(0)))
    assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)) == 20640 + 2048


@pytest.mark.parametrize(
    ("name", "count"), [("124m", 123_587_328), ("1b", 1_235_814_400), ("8b", 8_030_261_248)]
)
def test_parameter_count_large(name, count):
    # Llama 3.2 1B and Llama 3.1 8B's published counts; 124m by hand: 12 layers of
    # 2*768 + 4*768*768 + 3*768*2048 = 7,079,424, plus 50304*768 + 768 (tied embeddings, final
    # norm). The abstract model's leaves agree
    config = decoder_config(name)
    assert decoder_num_params(config) == count
    _, params = abstract_decoder(config)
    leaves = jax.tree_util.tree_leaves(params)
    assert sum(math.prod(leaf.shape) for leaf in leaves) == count
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    assert ("lm_head" in params) == (name == "8b")


def test_shapes_and_dtypes():
    apply_fn, params = as_pure(Decoder(TINY, rngs=nnx.Rngs(0)))
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert params["layers"]["wq"].shape == (2, 32, 32)
    assert params["layers"]["wk"].shape == (2, 32, 16)
    assert params["layers"]["w_down"].shape == (2, 64, 32)
    logits = apply_fn(params, tokens(3, 7, 64))
    assert logits.shape == (3, 7, 64)
    assert logits.dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# The forward pass against the reference


@pytest.mark.parametrize("tied", [True, False])
def test_forward_equals_numpy_reference(tied):
    config = dataclasses.replace(TINY, tie_embeddings=tied)
    apply_fn, params = f64_model(config)
    toks = tokens(2, 9, 64)
    got = np.asarray(jax.jit(apply_fn)(params, toks))
    want = reference_logits(config, params, toks)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-11)


def test_gqa_equals_mha_with_repeated_weights():
    # K = 2 key/value heads shared by H = 4 query heads == K = H with each kv head's weights
    # repeated for its group (heads 0,1 read kv 0; heads 2,3 read kv 1)
    apply_gqa, params = f64_model(TINY)
    mha = dataclasses.replace(TINY, num_kv_heads=4, param_dtype=jnp.float64)
    apply_mha, _ = as_pure(Decoder(mha, rngs=nnx.Rngs(0)))
    layers = dict(params["layers"])
    for k in ("wk", "wv"):
        w = layers[k].reshape(2, 32, 2, 8)  # (L, d, K, d_h)
        layers[k] = jnp.repeat(w, 2, axis=2).reshape(2, 32, 32)
    params_mha = {**params, "layers": layers}
    toks = tokens(2, 9, 64, seed=1)
    np.testing.assert_allclose(
        np.asarray(apply_mha(params_mha, toks)),
        np.asarray(apply_gqa(params, toks)),
        rtol=1e-12,
        atol=1e-12,
    )


def test_rope_equals_numpy_reference_and_keeps_relative_positions():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 11, 3, 8))  # (B, T, heads, d_h)
    got = np.asarray(rope(jnp.asarray(x), 10000.0))
    for b in range(2):
        for h in range(3):
            np.testing.assert_allclose(
                got[b, :, h], np_rope(x[b, :, h], 10000.0), rtol=1e-13, atol=1e-13
            )
    # <rope(q)_m, rope(k)_n> depends on m - n only: the same vector at every position
    q = np.broadcast_to(rng.normal(size=(1, 1, 1, 8)), (1, 11, 1, 8))
    k = np.broadcast_to(rng.normal(size=(1, 1, 1, 8)), (1, 11, 1, 8))
    rq = np.asarray(rope(jnp.asarray(q), 500000.0))[0, :, 0]
    rk = np.asarray(rope(jnp.asarray(k), 500000.0))[0, :, 0]
    dots = rq @ rk.T
    for shift in range(-3, 4):
        diag = np.diagonal(dots, offset=shift)
        np.testing.assert_allclose(diag, np.full_like(diag, diag[0]), rtol=1e-12, atol=1e-12)
    # position 0 is not rotated
    np.testing.assert_array_equal(rq[0], q[0, 0, 0])


def test_remat_and_compute_dtype_keep_the_values():
    apply_fn, params = f64_model(TINY)
    apply_plain, _ = as_pure(
        Decoder(dataclasses.replace(TINY, param_dtype=jnp.float64, remat=False), rngs=nnx.Rngs(0))
    )
    toks = tokens(2, 9, 64)
    loss, loss_plain = next_token_loss(apply_fn), next_token_loss(apply_plain)
    g = jax.jit(jax.grad(loss))(params, toks)
    g_plain = jax.jit(jax.grad(loss_plain))(params, toks)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_plain), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13)
    # dtype=float32 on float64 weights computes in float32: float32 logits, float32 rounding
    apply32, _ = as_pure(
        Decoder(dataclasses.replace(TINY, param_dtype=jnp.float64, dtype=jnp.float32),
                rngs=nnx.Rngs(0))
    )  # fmt: skip
    got = jax.jit(apply32)(params, toks)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(apply_fn(params, toks)), rtol=1e-4, atol=1e-4
    )


# ---------------------------------------------------------------------------------------------
# The loss


def test_loss_at_init_near_log_vocab_and_gradients_finite():
    apply_fn, params = as_pure(Decoder(TINY, rngs=nnx.Rngs(0)))
    loss = next_token_loss(apply_fn)
    toks = tokens(4, 17, 64, seed=2)
    value = jax.jit(loss)(params, toks)
    assert value.dtype == jnp.float32
    # logits of std ~ 0.02 sqrt(d) = 0.11 at init: the loss is log V + O(0.01)
    assert abs(float(value) - math.log(64)) < 0.05
    for p in (params, jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)):
        grads = jax.jit(jax.grad(loss))(p, toks)
        leaves = jax.tree_util.tree_leaves(grads)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
        assert all(g.dtype == a.dtype for g, a in zip(leaves, jax.tree_util.tree_leaves(p),
                                                      strict=True))  # fmt: skip
        assert all(float(jnp.max(jnp.abs(g))) > 0 for g in leaves)


def test_loss_equals_reference_cross_entropy():
    apply_fn, params = f64_model(TINY)
    toks = tokens(2, 10, 64, seed=4)
    logits = reference_logits(TINY, params, np.asarray(toks)[:, :-1])
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    want = -np.mean(np.take_along_axis(logp, np.asarray(toks)[:, 1:, None], axis=-1))
    np.testing.assert_allclose(float(next_token_loss(apply_fn)(params, toks)), want, rtol=1e-11)


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim"):
        dataclasses.replace(TINY, head_dim=7)
    with pytest.raises(ValueError, match="dim"):
        dataclasses.replace(TINY, dim=0)
    with pytest.raises(ValueError, match="name"):
        decoder_config("70b")
    with pytest.raises(TypeError, match="config"):
        Decoder({"dim": 4}, rngs=nnx.Rngs(0))


def test_batch_sharding_needs_a_data_or_fsdp_axis():
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("model",))
    with pytest.raises(ValueError, match="mesh"):
        decoder_batch_sharding(mesh)


# ---------------------------------------------------------------------------------------------
# FSDP placement on 8 forced CPU devices

PLACEMENT_SCRIPT = r"""
import json, math
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxbounds.models import (Decoder, abstract_decoder, as_pure, decoder_batch_sharding,
                              decoder_config, decoder_shardings, next_token_loss)
assert len(jax.devices()) == 8
out = {}
config = decoder_config("tiny", param_dtype=jnp.float32)
apply_fn, params = as_pure(Decoder(config, rngs=nnx.Rngs(0)))
loss = next_token_loss(apply_fn)
toks = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(8, 9)), jnp.int32)
want = float(loss(params, toks))
for axes, shape in ((("fsdp",), (8,)), (("data", "fsdp"), (2, 4))):
    mesh = Mesh(np.asarray(jax.devices()).reshape(shape), axes)
    shardings = decoder_shardings(params, mesh)
    placed = jax.device_put(params, shardings)
    batch = jax.device_put(toks, decoder_batch_sharding(mesh))
    leaves = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(placed)[0]:
        name = jax.tree_util.keystr(path)
        leaves[name] = {
            "size": leaf.size,
            "shard_sizes": sorted({s.data.size for s in leaf.addressable_shards}),
            "spec": [str(a) for a in leaf.sharding.spec],
        }
    out["/".join(axes)] = {
        "leaves": leaves,
        "batch_shard_rows": sorted({s.data.shape[0] for s in batch.addressable_shards}),
        "loss": float(jax.jit(loss)(placed, batch)),
        "want": want,
    }
# the 1B and 8B decoders, abstractly: each large leaf's shard is 1/8 of it
mesh = Mesh(np.asarray(jax.devices()), ("fsdp",))
for name in ("1b", "8b"):
    _, abstract = abstract_decoder(decoder_config(name))
    shardings = decoder_shardings(abstract, mesh)
    rows = {}
    for (path, leaf), s in zip(jax.tree_util.tree_flatten_with_path(abstract)[0],
                               jax.tree_util.tree_leaves(shardings)):
        shard = math.prod(s.shard_shape(leaf.shape))
        rows[jax.tree_util.keystr(path)] = [math.prod(leaf.shape), shard]
    out[name] = rows
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def placement():
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", PLACEMENT_SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize(("mesh", "ways"), [("fsdp", 8), ("data/fsdp", 4)])
def test_fsdp_placement_splits_matrices_and_replicates_vectors(placement, mesh, ways):
    result = placement[mesh]
    leaves = result["leaves"]
    for name, leaf in leaves.items():
        if name in ("['final_norm']", "['layers']['attn_norm']", "['layers']['mlp_norm']"):
            assert leaf["shard_sizes"] == [leaf["size"]], name  # replicated
            assert all(a == "None" for a in leaf["spec"]), name
        else:
            assert leaf["shard_sizes"] == [leaf["size"] // ways], name
    # the largest axis, never the stacked layer axis: (V, d) on V, (L, d, F) on F
    assert leaves["['embed']"]["spec"] == ["fsdp", "None"]
    assert leaves["['layers']['w_gate']"]["spec"] == ["None", "None", "fsdp"]
    assert leaves["['layers']['w_down']"]["spec"] == ["None", "fsdp", "None"]
    assert leaves["['layers']['wq']"]["spec"] == ["None", "fsdp", "None"]  # tie: the first
    # FSDP splits the batch too: 8 rows over all 8 devices
    assert result["batch_shard_rows"] == [1]
    np.testing.assert_allclose(result["loss"], result["want"], rtol=1e-5)


@pytest.mark.parametrize("name", ["1b", "8b"])
def test_fsdp_placement_of_the_large_decoders(placement, name):
    rows = placement[name]
    for leaf, (size, shard) in rows.items():
        if "norm" in leaf:
            assert shard == size, leaf
        else:
            assert shard * 8 == size, leaf
