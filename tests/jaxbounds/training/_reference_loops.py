"""The training loops that :func:`jaxbounds.training.train` replaced, kept as test references.

Copied from the package before the engine (git history: ``jaxbounds/training/loops.py``,
``jaxbounds/experiments/tt_sequence_length.py``, ``jaxbounds/experiments/_fourier_training.py``,
``jaxbounds/experiments/shallow_gd.py``), reduced to what the comparisons need and made generic
in the model (the loss and evaluation functions are arguments). Each keeps the old design:

- :func:`old_train_gd`: full-batch GD in compiled ``lax.scan`` chunks, a record point before
  every step and one after the last;
- :func:`old_train_minibatch`: an epoch loop on the host calling a jitted minibatch step, the
  epoch permutations from ``jax.random.split(key, num_epochs)``;
- :func:`old_tt_train`: ``tt_sequence_length._train_one`` (a vmapped scan over blocks of epochs
  of minibatches, the best validation state kept), vmapped over seeds;
- :func:`old_train_interpolator`: ``_fourier_training.train_interpolator``'s loop (full-batch
  Adam in chunks until the loss is below a threshold);
- :func:`old_stacked_gd`: ``shallow_gd.train_seeds``'s trick (GD on the sum of the seeds'
  losses over stacked parameters).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxbounds.training.engine import make_step


def old_train_gd(loss_fn, params, batch, *, learning_rate, num_steps, metrics_fn=None,
                 chunk_steps=5):  # fmt: skip
    """Old ``train_gd``: (params_T, losses (T + 1,), metrics {name: (T + 1,)})."""
    step = make_step(loss_fn, optax.sgd(learning_rate))
    state = optax.sgd(learning_rate).init(params)

    @functools.cache
    def chunk(length):
        @jax.jit
        def run(p, s):
            def body(carry, _):
                p, s = carry
                metrics = {} if metrics_fn is None else metrics_fn(p, batch)
                new_p, s, loss = step(p, s, batch)
                return (new_p, s), {"loss": loss, **metrics}

            return jax.lax.scan(body, (p, s), None, length=length)

        return run

    points, done = [], 0
    while done < num_steps:
        length = min(chunk_steps, num_steps - done)
        (params, state), recs = chunk(length)(params, state)
        points.append(jax.device_get(recs))
        done += length
    final = {"loss": loss_fn(params, batch)}
    final |= {} if metrics_fn is None else metrics_fn(params, batch)
    points.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[None], final))
    stacked = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *points)
    return params, stacked.pop("loss"), stacked


def old_train_minibatch(loss_fn, params, data, key, *, num_epochs, batch_size, optimizer):
    """Old ``train_minibatch``: (params, full-data loss after every epoch, point 0 = init)."""
    n = int(jax.tree_util.tree_leaves(data)[0].shape[0])
    bs = min(batch_size, n)
    nb = -(-n // bs)
    perms = np.asarray(jax.vmap(lambda k: jax.random.permutation(k, n))(
        jax.random.split(key, num_epochs)))  # fmt: skip
    batches = np.concatenate([perms, perms[:, : nb * bs - n]], axis=1).reshape(num_epochs, nb, bs)
    step = make_step(loss_fn, optimizer)
    minibatch = jax.jit(
        lambda p, s, idx: step(p, s, jax.tree_util.tree_map(lambda a: a[idx], data))[:2]
    )
    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(params)
    losses = [float(loss_fn(params, data))]
    for indices in batches:
        for idx in indices:
            params, state = minibatch(params, state, idx)
        losses.append(float(loss_fn(params, data)))
    return params, np.asarray(losses)


def _epoch_indices(key, epoch, n, batch_size):
    bs = min(batch_size, n)
    num_batches = -(-n // bs)
    perm = jax.random.permutation(jax.random.fold_in(key, epoch), n)
    return jnp.concatenate([perm, perm[: num_batches * bs - n]]).reshape(num_batches, bs)


def _old_tt_train_one(params0, data, key, *, loss_fn, evaluate, learning_rate, batch_size,
                      num_epochs, eval_every):  # fmt: skip
    opt = optax.adam(learning_rate)
    step = make_step(loss_fn, opt)
    n = data["train_x"].shape[0]

    def one_epoch(carry, epoch):
        def minibatch(c, idx):
            p, s, _ = step(c[0], c[1], (data["train_x"][idx], data["train_y"][idx]))
            return (p, s), None

        idx = _epoch_indices(key, epoch, n, batch_size)
        return jax.lax.scan(minibatch, carry, idx)[0], None

    def block(carry, b):
        p, s, best = carry
        (p, s), _ = jax.lax.scan(one_epoch, (p, s), b * eval_every + jnp.arange(eval_every))
        m = evaluate(p, data)
        better = m["val_loss"] < best["metrics"]["val_loss"]
        new = {"params": p, "metrics": m, "epoch": (b + 1) * eval_every}
        new["epoch"] = new["epoch"].astype(best["epoch"].dtype)
        best = jax.tree_util.tree_map(lambda x, y: jnp.where(better, x, y), new, best)
        return (p, s, best), m

    with jax.numpy_dtype_promotion("standard"):
        state = opt.init(params0)
    dtype = data["train_x"].dtype
    metrics = {k: jnp.asarray(jnp.inf if k == "val_loss" else jnp.nan, dtype) for k in
               ("train_loss", "val_loss")}  # fmt: skip
    best = {"params": params0, "metrics": metrics, "epoch": jnp.asarray(0)}
    blocks = jnp.arange(num_epochs // eval_every)
    (_, _, best), curve = jax.lax.scan(block, (params0, state, best), blocks)
    return best, curve


def old_tt_train(params0, data, keys, **kw):
    """Old ``tt_sequence_length._train``: ``jit(vmap(_train_one))`` over stacked seeds."""
    return jax.jit(jax.vmap(functools.partial(_old_tt_train_one, **kw)))(params0, data, keys)


def old_train_interpolator(loss_fn, params, batch, *, learning_rate, loss_threshold, max_steps,
                           chunk_steps):  # fmt: skip
    """Old ``train_interpolator`` loop: (params, final loss, steps, reached, chunk-end losses)."""
    optimizer = optax.adam(learning_rate)
    step = make_step(loss_fn, optimizer)

    @jax.jit
    def run(params, state):
        def body(carry, _):
            p, s = carry
            p, s, _ = step(p, s, batch)
            return (p, s), None

        (params, state), _ = jax.lax.scan(body, (params, state), None, length=chunk_steps)
        return params, state, loss_fn(params, batch)

    with jax.numpy_dtype_promotion("standard"):
        state = optimizer.init(params)
    losses, steps, value = [], 0, float(loss_fn(params, batch))
    while steps < max_steps and not value < loss_threshold:
        params, state, current = run(params, state)
        steps += chunk_steps
        value = float(current)
        losses.append(value)
        if not np.isfinite(value):
            break
    return params, value, steps, bool(value < loss_threshold), losses


def old_stacked_gd(per_seed_loss, stacked0, batch, *, learning_rate, num_steps):
    """Old ``shallow_gd.train_seeds``: GD on the sum of S per-seed losses (stacked params).

    Returns the final stacked parameters and the per-seed losses before every step and after
    the last, (T + 1, S).
    """
    params, _, metrics = old_train_gd(
        lambda p, b: jnp.sum(per_seed_loss(p, b)), stacked0, batch, learning_rate=learning_rate,
        num_steps=num_steps, metrics_fn=lambda p, b: {"per_seed": per_seed_loss(p, b)},
    )  # fmt: skip
    return params, metrics["per_seed"]
