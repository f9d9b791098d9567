"""Every kernel family on parameters sharded over a user's mesh, against its unsharded value.

Run as a script in a process whose devices are set up already (8 forced CPU devices, or 2
processes x 4 joined by ``jax.distributed``): prints one ``RESULT {json}`` line with, per
configuration and kernel, the eager and jitted results' leaves, the unsharded reference's
leaves and the shardings of parameter-shaped outputs. ``tests/kernels/test_sharded.py`` reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import jax

if __name__ == "__main__":  # imported by the test for its names only: no global settings
    if os.environ.get("MP_MODE") == "multi":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.config.update("jax_num_cpu_devices", 4)
        index = int(os.environ["MP_PROCESS_ID"])
        jax.distributed.initialize(os.environ["MP_COORDINATOR"], 2, index)
    jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import kernels
from kernels import curvature, gauss_newton, norms, sharpness
from kernels import rademacher as rad
from kernels._devices import resolve_layout

MULTI = os.environ.get("MP_MODE") == "multi"


def model(seed: int = 0):
    """A 2-layer tanh MLP (8 -> 16 -> 4) and a batch of 16 examples with class labels."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": 0.4 * rng.normal(size=(8, 16)),
        "b1": 0.1 * rng.normal(size=(16,)),
        "w2": 0.4 * rng.normal(size=(16, 4)),
    }
    x = rng.normal(size=(16, 8))
    labels = rng.integers(0, 4, size=(16,))
    return params, x, labels


def apply(p, xs):
    return jnp.tanh(xs @ p["w1"] + p["b1"]) @ p["w2"]


def loss(p, batch):
    xs, labels = batch
    logits = apply(p, xs)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def scalar_apply(p, xs):
    return apply(p, xs)[:, 0]


def project(p):
    return norms.tree_project_lp_ball(p, p=2, radius=1.0)


def calls():
    """name -> (params, batch, key) -> result pytree."""
    gauss = sharpness.Perturbation("gaussian", 0.05)
    ball = sharpness.Perturbation("l2_ball", 0.2)
    return {
        "hessian_trace_hutchinson": lambda p, b, k: curvature.hessian_trace(
            loss, p, b, k, num_samples=11, chunk_size=3
        ),
        "hessian_trace_hutchpp": lambda p, b, k: curvature.hessian_trace(
            loss, p, b, k, num_matvecs=13, method="hutchpp", chunk_size=3
        ),
        "hutchinson_dataset": lambda p, b, k: curvature.hutchinson_trace(
            curvature.dataset_hvp(
                loss, p, jax.tree_util.tree_map(lambda a: a.reshape(2, 8, *a.shape[1:]), b)
            ),
            p,
            k,
            num_samples=9,
            chunk_size=2,
        ),
        "top_eigenvalues": lambda p, b, k: curvature.top_eigenvalues(
            curvature.hvp(loss, p, b), p, k, k=2, num_steps=12
        ),
        "top_eigenvalues_recomputed": lambda p, b, k: curvature.top_eigenvalues(
            curvature.hvp(loss, p, b), p, k, k=2, num_steps=12, linearize=False
        ),
        "slq_nodes": lambda p, b, k: curvature.slq_nodes(
            curvature.hvp(loss, p, b), p, k, num_samples=5, num_steps=6, chunk_size=2
        ),
        "ggn_trace": lambda p, b, k: gauss_newton.ggn_trace(
            apply, p, b, k, loss="cross_entropy", num_samples=11, chunk_size=3
        ),
        "mc_fisher_trace": lambda p, b, k: gauss_newton.mc_fisher_trace(
            apply, p, b, k, loss="cross_entropy", num_samples=7, chunk_size=2
        ),
        "empirical_fisher_trace": lambda p, b, k: gauss_newton.empirical_fisher_trace(
            apply, p, b, loss="cross_entropy", example_chunk_size=4
        ),
        "average_sharpness": lambda p, b, k: sharpness.average_sharpness(
            loss, p, b, k, perturbation=gauss, num_samples=13, chunk_size=2
        ),
        "worst_case_sharpness": lambda p, b, k: sharpness.worst_case_sharpness(
            loss, p, b, k, perturbation=ball, num_steps=5, num_restarts=3
        ),
        "sigma_search": lambda p, b, k: sharpness.sigma_search(
            loss,
            p,
            b,
            k,
            perturbation=gauss,
            target_increase=0.01,
            num_samples=6,
            num_steps=6,
            chunk_size=2,
        ),
        "perturbed_hessian_traces": lambda p, b, k: sharpness.perturbed_hessian_traces(
            loss, p, b, k, perturbation=gauss, num_samples=5, num_probes=3, chunk_size=2
        ),
        "sharpness_decomposition": lambda p, b, k: sharpness.sharpness_decomposition(
            loss, p, b, k, perturbation=gauss, num_samples=5, num_probes=4, chunk_size=2
        ),
        "rademacher_linear": lambda p, b, k: rad.rademacher_linear(
            b[0], k, norm=2, radius=1.0, num_samples=21, chunk_size=4
        ),
        "rademacher_finite": lambda p, b, k: rad.rademacher_finite(
            lambda i, w: apply(w, b[0]).T[i], p, k, num_samples=9, num_members=4, chunk_size=2
        ),
        "rademacher_search": lambda p, b, k: rad.rademacher_search(
            scalar_apply,
            p,
            b[0],
            k,
            project=project,
            num_samples=6,
            num_steps=3,
            step_size=0.5,
            num_restarts=2,
            chunk_size=2,
        ),
        "rademacher_readout_search": lambda p, b, k: rad.rademacher_readout_search(
            lambda w, xs: jnp.tanh(xs @ w["w1"] + w["b1"]),
            p,
            b[0],
            k,
            project=project,
            readout_norm=2,
            readout_radius=1.0,
            num_samples=6,
            num_steps=3,
            step_size=0.5,
            chunk_size=2,
        ),
        "tree_project_lp_ball": lambda p, b, k: norms.tree_project_lp_ball(p, p=2, radius=0.5),
        "empirical_ntk": lambda p, b, k: _ntk(p, b),
    }


def _ntk(p, b):
    from jaxbounds.models.ntk import empirical_ntk

    return empirical_ntk(scalar_apply, p, b[0], tile_size=4)


# configurations: mesh shape and axes, specs of w1/b1/w2, spec of the batch, samples scope
ALL_CONFIGS = {
    "tp_8": ((8,), ("model",), (P(None, "model"), P("model"), P("model", None)), P(), None),
    "fsdp_8": ((8,), ("fsdp",), (P(None, "fsdp"), P("fsdp"), P("fsdp", None)), P(), None),
    "tp_2x4": (
        (2, 4),
        ("data", "model"),
        (P(None, "model"), P("model"), P("model", None)),
        P("data"),
        None,
    ),
    "fsdp_2x4": (
        (2, 4),
        ("data", "fsdp"),
        (P(None, "fsdp"), P("fsdp"), P("fsdp", None)),
        P("data"),
        None,
    ),
    "tp_2x4_named": (
        (2, 4),
        ("data", "model"),
        (P(None, "model"), P("model"), P("model", None)),
        P("data"),
        ("data",),
    ),
    "replicated_2x4": ((2, 4), ("data", "model"), (P(), P(), P()), P("data"), None),
}


CONFIGS = {
    k: ALL_CONFIGS[k] for k in os.environ.get("SHARDED_CONFIGS", ",".join(ALL_CONFIGS)).split(",")
}
# every family eagerly on the (2, 4) tensor-parallel mesh; these on every mesh, eagerly and under
# jax.jit (SHARDED_FULL=1: every family on every mesh, both ways)
CORE = (
    "hessian_trace_hutchinson",
    "ggn_trace",
    "average_sharpness",
    "worst_case_sharpness",
    "tree_project_lp_ball",
)
FULL_CONFIG = "tp_2x4"


def value(leaf):
    """The leaf's value as a nested list, from this process's replicas (multi-process) or all."""
    leaf = jnp.asarray(leaf)
    if MULTI and not leaf.is_fully_addressable:
        if leaf.sharding.is_fully_replicated:
            return np.asarray(leaf.addressable_data(0)).tolist()
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True)).tolist()
    return np.asarray(leaf).tolist()


def leaves(result):
    return [value(leaf) for leaf in jax.tree_util.tree_leaves(result)]


def same_sharding(leaf, like):
    """Whether ``leaf`` is laid out as ``like`` (equivalent shardings)."""
    return bool(leaf.sharding.is_equivalent_to(like.sharding, leaf.ndim))


def place(mesh, params, specs, x, labels, batch_spec):
    named = dict(zip(("w1", "b1", "w2"), specs, strict=True))
    sharded = {
        k: jax.device_put(jnp.asarray(v), NamedSharding(mesh, named[k])) for k, v in params.items()
    }
    batch = tuple(
        jax.device_put(jnp.asarray(a), NamedSharding(mesh, batch_spec)) for a in (x, labels)
    )
    return sharded, batch


PARAM_SHAPED = {"worst_case_sharpness": lambda r: r.u, "tree_project_lp_ball": lambda r: r}


def modes(name: str, full: bool) -> tuple[str, ...]:
    """How a family runs on a mesh: eagerly (the kernel sees the placed arrays and maps its
    samples over the free axes) and under ``jax.jit`` (the partitioner places the program).

    Outside the core set the default run takes the eager call only: under jit every family's
    program is placed by the same propagation, which the core families check on every mesh.
    """
    return ("eager", "jit") if full or name in CORE else ("eager",)


def main(only: list[str] | None = None) -> dict:
    params, x, labels = model()
    key = jax.random.key(3)
    out = {
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "reference": {},
        "configs": {},
    }
    table = calls()
    names = [n for n in table if only is None or n in only]
    full = os.environ.get("SHARDED_FULL") == "1"
    if not MULTI:
        plain = jax.tree_util.tree_map(jnp.asarray, params)
        batch = (jnp.asarray(x), jnp.asarray(labels))
        with kernels.using_devices(jax.devices()[:1]):
            for name in names:
                out["reference"][name] = leaves(table[name](plain, batch, key))
    devices = np.asarray(jax.devices())
    for config, (shape, axes, specs, batch_spec, samples) in CONFIGS.items():
        mesh = Mesh(devices.reshape(shape), axes)
        sharded, batch = place(mesh, params, specs, x, labels, batch_spec)
        record = out["configs"][config] = {}
        scope = kernels.using_mesh(mesh, samples=samples) if samples is not None else None
        with scope or contextlib.nullcontext():
            layout = resolve_layout(jax.tree_util.tree_leaves(sharded), list(batch))
        record["samples_axes"] = list(layout.axes)
        for name in names:
            if not (full or config == FULL_CONFIG or name in CORE):
                continue
            entry = record[name] = {}
            for mode in modes(name, full):
                call = table[name] if mode == "eager" else jax.jit(table[name])
                try:
                    if samples is not None:
                        with kernels.using_mesh(mesh, samples=samples):
                            result = call(sharded, batch, key)
                    else:
                        result = call(sharded, batch, key)
                    entry[mode] = leaves(result)
                    if name in PARAM_SHAPED:
                        got = PARAM_SHAPED[name](result)
                        entry[mode + "_kept"] = {
                            k: same_sharding(v, sharded[k]) for k, v in got.items()
                        }
                except Exception as err:
                    entry[mode] = f"{type(err).__name__}: {str(err)[:600]}"
        if full:  # every family on every mesh: hundreds of 8-device programs, each holding
            jax.clear_caches()  # its memory mappings; past ~65k mappings LLVM cannot allocate
    if not MULTI:
        out["errors"] = errors(params, x, labels, key)
        out["gathers"] = gathers()
        out["explicit"] = explicit_lanczos(params, x, key, full)
        if full:  # every family, on the MLP and on the tiny decoder
            out["fsdp_gathers"] = {}
            for m in ("mlp", "decoder"):
                jax.clear_caches()
                out["fsdp_gathers"][m] = fsdp_gathers(m)
        else:
            out["fsdp_gathers"] = {"mlp": fsdp_gathers("mlp", FSDP_FAST)}
    return out


def errors(params, x, labels, key):
    """The ValueErrors of samples axes that cannot work (message, or what happened instead)."""
    devices = np.asarray(jax.devices())
    mesh = Mesh(devices.reshape(2, -1), ("data", "model"))
    sharded, batch = place(
        mesh, params, (P(None, "model"), P("model"), P("model", None)), x, labels, P("data")
    )
    got = {}

    def attempt(name, fn):
        try:
            fn()
            got[name] = "no error"
        except ValueError as err:
            got[name] = str(err)

    def trace():
        return curvature.hessian_trace(loss, sharded, batch, key, num_samples=4)

    def scoped(samples, jit=False):
        def run():
            with kernels.using_mesh(mesh, samples=samples):
                return (
                    jax.jit(lambda p: curvature.hessian_trace(loss, p, batch, key, num_samples=4))(
                        sharded
                    )
                    if jit
                    else trace()
                )

        return run

    attempt("missing_axis", scoped(("batch",)))
    attempt("param_axis", scoped(("model",)))
    attempt("param_axis_jit_explicit", lambda: _explicit_param_axis(params, x, labels, key))
    return got


def all_gathers(text: str) -> list[str]:
    """The result shapes (``f32[16384]``) of the all-gathers in a compiled program's HLO text."""
    import re

    found = []
    for line in text.splitlines():
        if re.search(r"\ball-gather(-start)?\(", line):
            match = re.search(r"=\s*\(?\s*([a-z0-9]+\[[0-9,]*\])", line)
            found.append(match.group(1) if match else line.strip()[:80])
    return found


def gathers():
    """All-gathers of a 4-way model-sharded Hutchinson probe and of one gradient (issue point 4).

    A tensor-parallel MLP (w1 (64, 256) ``P(None, "model")``, w2 (256, 64) ``P("model", None)``)
    on 4 devices; the probe's program is compiled under ``jax.jit`` from the placed arguments.
    """
    mesh = Mesh(np.asarray(jax.devices()[:4]), ("model",))
    rng = np.random.default_rng(0)
    shapes = {"w1": (64, 256), "w2": (256, 64)}
    specs = {"w1": P(None, "model"), "w2": P("model", None)}
    params = {
        k: jax.device_put(
            (0.1 * rng.normal(size=shape)).astype(np.float32), NamedSharding(mesh, specs[k])
        )
        for k, shape in shapes.items()
    }
    xs = jnp.asarray(rng.normal(size=(32, 64)).astype(np.float32))

    def mse(p, b):
        return jnp.mean((jnp.tanh(b @ p["w1"]) @ p["w2"] - b) ** 2)

    grad = jax.jit(jax.value_and_grad(mse)).lower(params, xs).compile().as_text()
    out = {"grad": all_gathers(grad), "param_sizes": [64 * 256, 256 * 64]}
    for chunk in (1, 2):
        probe = jax.jit(
            lambda p, b, k, c=chunk: curvature.hessian_trace(
                mse, p, b, k, num_samples=2, chunk_size=c
            )
        )
        text = probe.lower(params, xs, jax.random.key(0)).compile().as_text()
        out[f"probe_chunk{chunk}"] = all_gathers(text)
    return out


# the families of the default run's all-gather check (each compile takes seconds): Lanczos and
# Hutch++, whose flat bases gathered every leaf (Hutch++: its whole flat sketch) before they
# were kept leaf by leaf, and average and worst-case sharpness, whose perturbations were one
# flat vector split into the leaves before they were drawn leaf by leaf; the slow run compiles
# every family
FSDP_FAST = ("top_eigenvalues", "hutchpp", "average_sharpness", "worst_case_sharpness")
# the families whose Rademacher probes unpack each leaf's signs from its words (a leaf's
# sign_vector, reshaped): the unpacking may gather one leaf's signs (never more)
FSDP_UNPACKED_SIGNS = ("perturbed_hessian_traces",)


def fsdp_kernels(loss, apply, split):
    """name -> (params, batch, key) -> result: one call of every kernel family (issue 40).

    ``split``: batch -> the ``(inputs, targets)`` of the Gauss-Newton kernels.
    """
    gauss = sharpness.Perturbation("gaussian", 0.05)
    ball = sharpness.Perturbation("l2_ball", 0.2)

    def stacked(b):
        return jax.tree_util.tree_map(lambda a: a.reshape(2, -1, *a.shape[1:]), b)

    return {
        "hutchinson_rademacher": lambda p, b, k: curvature.hessian_trace(
            loss, p, b, k, num_samples=2
        ),
        "hutchinson_gaussian": lambda p, b, k: curvature.hutchinson_trace(
            curvature.hvp(loss, p, b), p, k, num_samples=2, probe="gaussian"
        ),
        "hutchpp": lambda p, b, k: curvature.hessian_trace(
            loss, p, b, k, num_matvecs=6, method="hutchpp"
        ),
        "top_eigenvalues": lambda p, b, k: curvature.top_eigenvalues(
            curvature.hvp(loss, p, b), p, k, k=1, num_steps=3
        ),
        "slq": lambda p, b, k: curvature.slq_nodes(
            curvature.hvp(loss, p, b), p, k, num_samples=2, num_steps=3
        ),
        "ggn_trace": lambda p, b, k: gauss_newton.ggn_trace(
            apply, p, split(b), k, loss="cross_entropy", num_samples=2
        ),
        "dataset_hutchinson": lambda p, b, k: curvature.hutchinson_trace(
            curvature.dataset_hvp(loss, p, stacked(b)), p, k, num_samples=2
        ),
        "average_sharpness": lambda p, b, k: sharpness.average_sharpness(
            loss, p, b, k, perturbation=gauss, num_samples=2
        ),
        "worst_case_sharpness": lambda p, b, k: sharpness.worst_case_sharpness(
            loss, p, b, k, perturbation=ball, num_steps=2
        ),
        "perturbed_hessian_traces": lambda p, b, k: sharpness.perturbed_hessian_traces(
            loss, p, b, k, perturbation=gauss, num_samples=2, num_probes=2
        ),
    }


def _fsdp_mlp(mesh):
    """A float32 tanh MLP (16 -> 64 -> 8) split 8 ways FSDP-style, its loss, apply and batch."""
    rng = np.random.default_rng(1)
    specs = {"w1": P(None, "fsdp"), "b1": P("fsdp"), "w2": P("fsdp", None)}
    shapes = {"w1": (16, 64), "b1": (64,), "w2": (64, 8)}
    params = {
        k: jax.device_put(
            (0.3 * rng.normal(size=shape)).astype(np.float32), NamedSharding(mesh, specs[k])
        )
        for k, shape in shapes.items()
    }
    x = jax.device_put(rng.normal(size=(16, 16)).astype(np.float32), NamedSharding(mesh, P()))
    labels = jax.device_put(rng.integers(0, 8, size=(16,)), NamedSharding(mesh, P()))
    return params, (x, labels), loss, apply, lambda b: b


def _fsdp_decoder(mesh):
    """The tiny decoder in float32 placed by ``decoder_shardings``, its loss, apply and tokens."""
    from flax import nnx

    from jaxbounds.models import (
        Decoder,
        as_pure,
        decoder_batch_sharding,
        decoder_config,
        decoder_shardings,
        next_token_loss,
    )

    config = decoder_config("tiny", param_dtype=jnp.float32)
    apply_fn, params = as_pure(Decoder(config, rngs=nnx.Rngs(0)))
    params = jax.device_put(params, decoder_shardings(params, mesh))
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(8, 9))
    tokens = jax.device_put(jnp.asarray(tokens, jnp.int32), decoder_batch_sharding(mesh))

    def last_logits(p, xs):  # the Gauss-Newton kernels: the next token after each sequence
        return apply_fn(p, xs)[:, -1, :]

    def split(t):
        return t[:, :-1], t[:, -1]

    return params, tokens, next_token_loss(apply_fn), last_logits, split


def fsdp_gathers(model="mlp", only=None):
    """All-gathers of every kernel family compiled on an 8-way FSDP mesh (issue 40, point 3).

    ``model``: ``"mlp"`` (a small MLP, every leaf split) or ``"decoder"`` (the tiny decoder
    placed by ``decoder_shardings``, scanned and rematerialised layers). Each kernel is
    compiled (not run) under ``jax.jit`` from the placed arguments. Returns the largest leaf's
    size, the number of parameters, and the result shapes of the all-gathers of the gradient's
    program and of each kernel's (or the error a kernel raised).
    """
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("fsdp",))
    build = _fsdp_mlp if model == "mlp" else _fsdp_decoder
    params, batch, model_loss, model_apply, split = build(mesh)
    key = jax.random.key(0)
    sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params)]
    grad = jax.jit(jax.grad(model_loss)).lower(params, batch).compile().as_text()
    out = {
        "largest_leaf": max(sizes),
        "smallest_leaf": min(sizes),
        "num_params": sum(sizes),
        "grad": all_gathers(grad),
    }
    for name, fn in fsdp_kernels(model_loss, model_apply, split).items():
        if only is not None and name not in only:
            continue
        try:
            text = jax.jit(fn).lower(params, batch, key).compile().as_text()
            out[name] = all_gathers(text)
        except Exception as err:
            out[name] = f"{type(err).__name__}: {str(err)[:400]}"
    return out


def explicit_lanczos(params, x, key, full=False):
    """Lanczos and Hutch++ on Explicit mesh axes (sharding in types), eagerly and under jit.

    A tanh model whose loss contracts no sharded axis (``w1`` split on its output axis, ``v``
    alike), on an 8-way Explicit ``("fsdp",)`` mesh: the bases and probes are placed with
    ``reshard`` and their contractions name their outputs' sharding. Returns, per kernel, the
    unplaced reference and the two placed results (Hutch++ with ``full`` only).
    """
    from jax.sharding import AxisType

    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Explicit,))
    plain = {"w1": jnp.asarray(params["w1"]), "v": jnp.asarray(params["b1"])}
    xs = jnp.asarray(x)

    def tanh_loss(p, b):
        return jnp.mean((jnp.tanh(b @ p["w1"]) * p["v"]) ** 2)

    table = {
        "top_eigenvalues": lambda p: curvature.top_eigenvalues(
            curvature.hvp(tanh_loss, p, xs), p, key, k=2, num_steps=6
        ),
        "hutchpp": lambda p: (
            curvature.hessian_trace(tanh_loss, p, xs, key, num_matvecs=9, method="hutchpp").mean
        ),
    }
    if not full:
        del table["hutchpp"]
    out = {name: {"reference": leaves(fn(plain))} for name, fn in table.items()}
    use = jax.sharding.use_mesh if hasattr(jax.sharding, "use_mesh") else jax.set_mesh
    with use(mesh):
        placed = {
            "w1": jax.device_put(plain["w1"], NamedSharding(mesh, P(None, "fsdp"))),
            "v": jax.device_put(plain["v"], NamedSharding(mesh, P("fsdp"))),
        }
        for name, fn in table.items():
            for mode, call in (("eager", fn), ("jit", jax.jit(fn))):
                try:
                    out[name][mode] = leaves(call(placed))
                except Exception as err:
                    out[name][mode] = f"{type(err).__name__}: {str(err)[:400]}"
    return out


def _explicit_param_axis(params, x, labels, key):
    """Explicit axes: the specs are visible under jit, so a named parameter axis is refused."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh(
        (2, jax.device_count() // 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2
    )
    sharded, batch = place(
        mesh, params, (P(None, "model"), P("model"), P("model", None)), x, labels, P("data")
    )
    with (
        jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(mesh),
        kernels.using_mesh(mesh, samples=("model",)),
    ):
        return jax.jit(lambda p: curvature.hessian_trace(loss, p, batch, key, num_samples=4))(
            sharded
        )


if __name__ == "__main__":
    selected = sys.argv[1:] or None
    print("RESULT " + json.dumps(main(selected)), flush=True)
