"""The error of each ``compute_dtype`` on bfloat16 decoders, against float64 at the rounded values.

The precision policy (``kernels/_precision.py``, docs/large-models.md "Precision policy"): the
kernels evaluate the loss of bfloat16 weights with float32 parameters by default
(``compute_dtype=None``) or in bfloat16 (``compute_dtype="params"``). For two decoders with
bfloat16 weights this prints one JSON record per (model, compute_dtype):

- ``hvp_rel_error``: $\\|Hv - H_{64}v\\| / \\|H_{64}v\\|$ for one Gaussian $v$, $H_{64}$ the float64
  Hessian at the bfloat16 weights cast to float64;
- ``top_rel_error``: the top eigenvalue of ``top_eigenvalues`` (30 Lanczos steps) against the
  same run in float64;
- ``trace_rel_error``: ``hutchinson_trace`` with 64 probes against the same probes in float64
  (the same key: the difference is rounding only, no Monte Carlo error);
- ``seconds``: the compiled Hutchinson call's wall time (its second call; a CPU has no bfloat16
  arithmetic units, so bfloat16 is not faster here).

and for average sharpness (64 antithetic pairs, Gaussian sigma) the relative error against
float64 of the float32 default and of a loss that casts the weights to bfloat16 itself (what
``compute_dtype="params"`` would do; the kernels refuse it for loss differences).

Models: ``test`` is the decoder of ``tests/kernels/test_half_precision.py`` (188 parameters,
weights of standard deviation 0.4); ``tiny`` is ``decoder_config("tiny")`` at its initialisation
(20,640 parameters, standard deviation 0.02).

Run: ``python bench/half_precision.py [--out bench/results/half_precision.json]``.
"""

from __future__ import annotations

import argparse
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import kernels  # noqa: E402
from jaxbounds.models import as_pure  # noqa: E402
from jaxbounds.models.decoder import Decoder, decoder_config, next_token_loss  # noqa: E402


def models():
    """``(name, loss, bfloat16 params, tokens)`` of the two decoders."""
    small = decoder_config(
        "tiny",
        vocab_size=8,
        dim=4,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=2,
        hidden_dim=8,
    )
    apply_fn, params = as_pure(Decoder(small, rngs=nnx.Rngs(0)))
    params = jax.tree_util.tree_map(
        lambda a: (20 * a.astype(jnp.float32)).astype(jnp.bfloat16) if a.ndim > 1 else a, params
    )
    tokens = jax.random.randint(jax.random.key(1), (4, 7), 0, 8, dtype=jnp.int32)
    yield "test", next_token_loss(apply_fn), params, tokens
    tiny = decoder_config("tiny")
    apply_fn, params = as_pure(Decoder(tiny, rngs=nnx.Rngs(0)))
    tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, tiny.vocab_size, dtype=jnp.int32)
    yield "tiny", next_token_loss(apply_fn), params, tokens


def as64(tree):
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), tree)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def curvature_records(name, loss, params, tokens):
    key = jax.random.key(9)
    p64 = as64(params)
    v = jax.tree_util.tree_map(lambda a: jax.random.normal(key, a.shape, jnp.float32), params)
    want_hv = np.asarray(ravel_pytree(kernels.hvp(loss, p64, tokens)(as64(v)))[0])
    want_top = float(
        kernels.top_eigenvalues(kernels.hvp(loss, p64, tokens), p64, key, num_steps=30)[0]
    )
    want_trace = float(kernels.hessian_trace(loss, p64, tokens, key, num_samples=64).mean)
    for compute_dtype in (None, "params"):
        op = kernels.hvp(loss, params, tokens, compute_dtype=compute_dtype)
        hv = ravel_pytree(op(v))[0]
        top = float(kernels.top_eigenvalues(op, params, key, num_steps=30)[0])
        trace = kernels.hessian_trace(
            loss, params, tokens, key, num_samples=64, compute_dtype=compute_dtype
        )
        start = time.perf_counter()
        jax.block_until_ready(
            kernels.hessian_trace(
                loss, params, tokens, key, num_samples=64, compute_dtype=compute_dtype
            )
        )
        seconds = time.perf_counter() - start
        yield {
            "model": name,
            "num_params": int(ravel_pytree(p64)[0].size),
            "compute_dtype": compute_dtype or "float32 (default)",
            "hvp_rel_error": rel(hv, want_hv),
            "top_rel_error": abs(top - want_top) / abs(want_top),
            "trace_rel_error": abs(float(trace.mean) - want_trace) / abs(want_trace),
            "trace_rel_stderr": float(trace.stderr) / abs(want_trace),
            "seconds": seconds,
        }


def sharpness_records(name, loss, params, tokens):
    """Antithetic increases at the same float32 perturbations, in three precisions."""
    flat32, unravel32 = ravel_pytree(
        jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    )
    flat64, unravel64 = ravel_pytree(as64(params))

    def increase(unravel, flat, u, cast):
        def value(x):
            return loss(jax.tree_util.tree_map(cast, unravel(x)), tokens)

        return 0.5 * (value(flat + u) + value(flat - u)) - value(flat)

    ways = {
        "float64": jax.jit(
            lambda u: increase(unravel64, flat64, u.astype(jnp.float64), lambda a: a)
        ),
        "float32 (default)": jax.jit(lambda u: increase(unravel32, flat32, u, lambda a: a)),
        # what compute_dtype="params" would evaluate: θ ± u rounded to bfloat16
        "bfloat16": jax.jit(
            lambda u: increase(unravel32, flat32, u, lambda a: a.astype(jnp.bfloat16))
        ),
    }
    for sigma in (1e-2, 1e-3):
        draws = [
            sigma * jax.random.normal(jax.random.fold_in(jax.random.key(4), i), flat32.shape)
            for i in range(64)
        ]
        values = {k: np.array([float(f(u)) for u in draws]) for k, f in ways.items()}
        want = values["float64"]
        for label in ("float32 (default)", "bfloat16"):
            got = values[label]
            yield {
                "model": name,
                "kernel": "average_sharpness (64 antithetic pairs, the same draws)",
                "sigma": sigma,
                "compute_dtype": label,
                "float64_mean": float(want.mean()),
                "float64_rel_stderr": float(
                    want.std(ddof=1) / np.sqrt(want.size) / abs(want.mean())
                ),
                "rel_error": float(abs(got.mean() - want.mean()) / abs(want.mean())),
                "median_pair_rel_error": float(np.median(np.abs(got - want) / np.abs(want))),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the records to this JSON file")
    args = parser.parse_args()
    records = []
    for name, loss, params, tokens in models():
        for record in (
            *curvature_records(name, loss, params, tokens),
            *sharpness_records(name, loss, params, tokens),
        ):
            print(json.dumps(record), flush=True)
            records.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backend": jax.default_backend(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
