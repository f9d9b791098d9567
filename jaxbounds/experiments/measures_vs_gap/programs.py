"""The measure programs of ``measures-vs-gap``: vmapped over models, compiled ahead of time."""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

import kernels
from jaxbounds.experiments.measures_vs_gap.grid import FAMILIES, MNIST, SPARSE
from jaxbounds.experiments.measures_vs_gap.training import _family_fns, _Fns, _pick, _stack
from jaxbounds.training import accuracy

# ------------------------------------------------------------------------------- the measures


@dataclasses.dataclass(frozen=True)
class MeasureSpec:
    """One measure: its column, kind, program (for its cost) and families.

    Attributes:
      name: the column of results.csv.
      kind: ``curvature``, ``sharpness``, ``pac-bayes``, ``norm``, ``bound``, ``rademacher``.
      program: the program that computes it (its ``seconds_<program>`` column).
      families: the families it is defined on.
      stderr: whether results.csv has ``<name>_stderr``.
    """

    name: str
    kind: str
    program: str
    families: tuple[str, ...] = FAMILIES
    stderr: bool = False


def _tag(x: float) -> str:
    return f"{x:g}"


def measure_specs(cfg: Mapping[str, Any]) -> list[MeasureSpec]:
    """Every measure of a unit configuration (the sharpness scales come from it).

    >>> from jaxbounds.experiments.measures_vs_gap.grid import SCALES
    >>> [m.name for m in measure_specs(SCALES["smoke"])][:4]
    ['hessian_trace', 'hessian_top_eigenvalue', 'avg_sharpness_0.01', 'adaptive_sharpness_0.05']
    """
    M = MeasureSpec
    out = [M("hessian_trace", "curvature", "hessian_trace", stderr=True),
           M("hessian_top_eigenvalue", "curvature", "hessian_top")]  # fmt: skip
    out += [M(f"avg_sharpness_{_tag(s)}", "sharpness", f"avg_sharpness_{_tag(s)}", stderr=True)
            for s in cfg["sharpness_sigmas"]]  # fmt: skip
    out += [M(f"adaptive_sharpness_{_tag(s)}", "sharpness", f"adaptive_sharpness_{_tag(s)}",
              stderr=True) for s in cfg["adaptive_sigmas"]]  # fmt: skip
    out += [
        M("worst_adaptive_linf", "sharpness", "worst_adaptive_linf", stderr=True),
        M("worst_adaptive_l2", "sharpness", "worst_adaptive_l2", stderr=True),
        M("pacbayes_mag_flatness", "pac-bayes", "sigma_mag"),
        M("pacbayes_flatness", "pac-bayes", "sigma_plain"),
        M("pacbayes_kl_init", "pac-bayes", "sigma_plain"),
        M("ggn_trace", "curvature", "ggn_trace", stderr=True),
        M("empirical_fisher_trace", "curvature", "empirical_fisher"),
        M("mc_fisher_trace", "curvature", "mc_fisher", stderr=True),
        M("log_prod_frobenius", "norm", "norms"),
        M("log_prod_spectral", "norm", "norms"),
        M("sum_fro_over_spec", "norm", "norms"),
        M("param_norm", "norm", "norms"),
        M("dist_init", "norm", "norms"),
        M("l1_norm", "norm", "norms"),
        M("path_norm", "norm", "path_norm"),
        M("tt_gap_cor411", "bound", "bounds", (SPARSE,)),
        M("tt_cover_cor421", "bound", "bounds", (SPARSE,)),
        M("edelman_cover", "bound", "bounds", (SPARSE,)),
        M("theorem5", "bound", "bounds", (MNIST,)),
        M("lemma1_rademacher", "bound", "bounds", (MNIST,)),
        M("spectrum_adaptive", "bound", "bounds"),
        M("norm_based_proxy", "bound", "bounds"),
        M("rademacher_lower", "rademacher", "rademacher_search", stderr=True),
    ]
    return out


def _programs(cfg: Mapping[str, Any]) -> list[str]:
    """The programs whose seconds are recorded, in column order."""
    return ["eval", *dict.fromkeys(m.program for m in measure_specs(cfg))]


def _key(seed: int, program: str) -> jax.Array:
    """The PRNG key of a unit's program: from the seed and the program's name only.

    Equal for every configuration of a seed (common random numbers across the grid).
    """
    salt = zlib.crc32(program.encode("ascii")) % (2**31 - 1)
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 7_919), salt)


def _lane_eval(fns: _Fns) -> Callable:
    def fn(params, train_data, test_data):
        out = {}
        for split, d in (("train", train_data), ("test", test_data)):
            scores = fns.apply(params, d["x"])
            signs = (2 * d["y"] - 1).astype(scores.dtype)
            per_example = jnp.logaddexp(jnp.zeros_like(scores), -signs * scores)
            out[f"{split}_loss"] = jnp.mean(per_example)
            out[f"{split}_accuracy"] = accuracy(scores, d["y"]).astype(scores.dtype)
            out[f"{split}_loss_sd"] = jnp.std(per_example, ddof=1)
        return out

    return fn


def _estimate(e: Any) -> dict:
    return {"mean": e.mean, "stderr": e.stderr}


def _hessian_trace(fns: _Fns, cfg: dict) -> Callable:
    return lambda p, m, k: _estimate(
        kernels.hessian_trace(fns.loss, p, m, k, num_samples=cfg["hessian_probes"])
    )


def _hessian_top(fns: _Fns, cfg: dict) -> Callable:
    return lambda p, m, k: {"mean": kernels.top_eigenvalues(
        kernels.hvp(fns.loss, p, m), p, k, k=1, num_steps=cfg["lanczos_steps"])[0]}  # fmt: skip


def _avg_sharpness(fns: _Fns, cfg: dict, *, adaptive: bool) -> Callable:
    loss = fns.normalized_loss if adaptive else fns.loss  # Andriushchenko et al.'s logits

    def sharp(p, m, k, sigma):
        return _estimate(kernels.average_sharpness(
            loss, p, m, k, perturbation=kernels.Perturbation("gaussian", sigma, adaptive=adaptive),
            num_samples=cfg["sharpness_pairs"]))  # fmt: skip

    return sharp


def _worst_adaptive(fns: _Fns, cfg: dict, *, linf: bool) -> Callable:
    kind, rho = ("linf_ball", cfg["worst_rho_linf"]) if linf else ("l2_ball", cfg["worst_rho_l2"])
    b = cfg["worst_batches"]

    def worst(p, m, k):
        batches = jax.tree_util.tree_map(lambda a: a.reshape(b, -1, *a.shape[1:]), m)

        def one(batch, i):
            return kernels.worst_case_sharpness(
                fns.normalized_loss, p, batch, jax.random.fold_in(k, i),
                perturbation=kernels.Perturbation(kind, jnp.asarray(rho, _dtype(p)), adaptive=True),
                num_steps=cfg["worst_steps"],
            ).value  # fmt: skip

        values = jax.vmap(one)(batches, jnp.arange(b, dtype=jnp.int32))
        return {"mean": jnp.mean(values), "stderr": jnp.std(values, ddof=1) / math.sqrt(b)}

    return worst


def _sigma_mag(fns: _Fns, cfg: dict) -> Callable:
    low, high = cfg["adaptive_sigma_bracket"]

    def search_mag(p, m, k):
        dtype = _dtype(p)
        return mag_sigma_search(
            fns.error, p, m, k, eps=jnp.asarray(MAG_EPS, dtype),
            target_increase=jnp.asarray(cfg["sigma_target"], dtype),
            sigma_lower=jnp.asarray(low, dtype), sigma_upper=jnp.asarray(high, dtype),
            num_samples=cfg["sigma_pairs"], num_steps=cfg["sigma_steps"],
        )  # fmt: skip

    return search_mag


def _sigma_plain(fns: _Fns, cfg: dict) -> Callable:
    low, high = cfg["sigma_bracket"]

    def search(p, m, k):
        dtype = _dtype(p)
        upper = kernels.Perturbation("gaussian", jnp.asarray(high, dtype))
        r = kernels.sigma_search(
            fns.error, p, m, k, perturbation=upper,
            target_increase=jnp.asarray(cfg["sigma_target"], dtype),
            num_samples=cfg["sigma_pairs"], sigma_lower=jnp.asarray(low, dtype),
            num_steps=cfg["sigma_steps"],
        )  # fmt: skip
        return {"sigma": r.sigma, "increase": r.increase.mean,
                "increase_stderr": r.increase.stderr, "bracketed": r.bracketed}  # fmt: skip

    return search


def _ggn_trace(fns: _Fns, cfg: dict) -> Callable:
    return lambda p, m, k: _estimate(
        kernels.ggn_trace(
            fns.apply, p, _float_labels(m), k, loss="logistic", num_samples=cfg["ggn_probes"]
        )
    )


def _empirical_fisher(fns: _Fns, cfg: dict) -> Callable:
    return lambda p, m: {
        "mean": kernels.empirical_fisher_trace(
            fns.apply, p, _float_labels(m), loss="logistic", example_chunk_size=cfg["example_chunk"]
        )
    }


def _mc_fisher(fns: _Fns, cfg: dict) -> Callable:
    return lambda p, m, k: _estimate(kernels.mc_fisher_trace(
        fns.apply, p, _float_labels(m), k, loss="logistic",
        num_samples=cfg["fisher_samples"], example_chunk_size=cfg["example_chunk"]))  # fmt: skip


def _path_norm(fns: _Fns, cfg: dict) -> Callable:
    del cfg
    return lambda p, ones: {"mean": jnp.reshape(fns.apply(
        jax.tree_util.tree_map(jnp.square, p), ones), ())}  # fmt: skip


def _rademacher_search(fns: _Fns, cfg: dict) -> Callable:
    def search_rad(theta, inputs, k, bound):
        e = kernels.rademacher_search(
            fns.search_apply, theta, inputs, k, project=fns.project,
            num_samples=cfg["rad_draws"], num_steps=cfg["rad_steps"],
            step_size=jnp.asarray(1.0, bound.dtype), output_bound=bound, delta=cfg["delta"],
        )  # fmt: skip
        return {"mean": e.mean, "stderr": e.stderr, "lower": e.lower}

    return search_rad


#: measure program name -> builder ``(fns, cfg) -> per-model function`` (exact names)
_PROGRAMS: dict[str, Callable[[_Fns, dict], Callable]] = {
    "eval": lambda fns, cfg: _lane_eval(fns),
    "hessian_trace": _hessian_trace,
    "hessian_top": _hessian_top,
    "sigma_mag": _sigma_mag,
    "sigma_plain": _sigma_plain,
    "ggn_trace": _ggn_trace,
    "empirical_fisher": _empirical_fisher,
    "mc_fisher": _mc_fisher,
    "path_norm": _path_norm,
    "rademacher_search": _rademacher_search,
}
#: name prefix -> builder, for the families of programs one per sigma or radius
_PREFIXED: tuple[tuple[str, Callable[[_Fns, dict, str], Callable]], ...] = (
    ("avg_sharpness_", lambda fns, cfg, name: _avg_sharpness(fns, cfg, adaptive=False)),
    ("adaptive_sharpness_", lambda fns, cfg, name: _avg_sharpness(fns, cfg, adaptive=True)),
    (
        "worst_adaptive_",
        lambda fns, cfg, name: _worst_adaptive(fns, cfg, linf=name.endswith("linf")),
    ),
)


def _lane_program(name: str, fns: _Fns, cfg_items: tuple) -> Callable:
    """The per-model function of a measure program (vmapped by :func:`_run_program`)."""
    cfg = dict(cfg_items)
    if name in _PROGRAMS:
        return _PROGRAMS[name](fns, cfg)
    for prefix, build in _PREFIXED:
        if name.startswith(prefix):
            return build(fns, cfg, name)
    raise ValueError(f"unknown measure program {name!r}")


#: The floor of the magnitude-aware perturbation, ``N(0, s^2 w_i^2 + eps^2)`` (SPEC section 8).
MAG_EPS = 1e-3


def mag_sigma_search(
    error_fn: Callable,
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    eps: Any,
    target_increase: Any,
    sigma_lower: Any,
    sigma_upper: Any,
    num_samples: int,
    num_steps: int,
) -> dict:
    r"""Largest $s$ with $\mathbb E_u\,\mathrm{err}(w + u) - \mathrm{err}(w) \le$ target.

    The magnitude-aware PAC-Bayes search of Jiang et al. 2020 as SPEC section 8 writes it:
    $u_i \sim N(0, s^2 w_i^2 + \epsilon^2)$ (the $\epsilon$ floor keeps weights near 0
    perturbed), $u = \sqrt{s^2 w^2 + \epsilon^2} \odot z$ with the same antithetic draws
    $\pm z$ at every $s$ (common random numbers), bisection on $\log s$ between the bracket's
    ends, as :func:`kernels.sigma_search` does without the floor.

    Returns:
      ``{"sigma", "increase", "increase_stderr", "bracketed"}``: the largest $s$ found below
      the target, its estimated increase and standard error (over the ``num_samples``
      antithetic pairs), and whether the bracket's ends straddle the target.

    >>> err = lambda w, b: jnp.mean(jnp.abs(w) > 1.0).astype(w.dtype)
    >>> r = mag_sigma_search(err, jnp.ones(4) * 0.5, None, jax.random.key(0), eps=0.0,
    ...                      target_increase=0.1, sigma_lower=1e-3, sigma_upper=10.0,
    ...                      num_samples=64, num_steps=30)
    >>> bool(r["bracketed"]), bool(r["increase"] <= 0.1)
    (True, True)
    """
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    keys = jax.random.split(key, num_samples)
    z = jax.vmap(lambda k: jax.random.normal(k, flat.shape, flat.dtype))(keys)
    base = error_fn(params, batch)

    def increase(s):
        std = jnp.sqrt(jnp.square(s * flat) + jnp.square(eps))

        def pair(zi):
            up = error_fn(unravel(flat + std * zi), batch)
            down = error_fn(unravel(flat - std * zi), batch)
            return 0.5 * (up + down) - base

        pairs = jax.lax.map(pair, z)
        bad = ~jnp.all(jnp.isfinite(pairs))
        mean = jnp.where(bad, jnp.inf, jnp.mean(pairs))
        return mean, jnp.std(pairs, ddof=1) / math.sqrt(num_samples)

    def step(_, bracket):
        lo, hi = bracket
        mid = jnp.sqrt(lo * hi)
        above = increase(mid)[0] > target_increase
        return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

    lo, _ = jax.lax.fori_loop(0, num_steps, step, (sigma_lower, sigma_upper))
    inc, se = increase(lo)
    bracketed = (increase(sigma_lower)[0] <= target_increase) & (
        increase(sigma_upper)[0] > target_increase)  # fmt: skip
    return {"sigma": lo, "increase": inc, "increase_stderr": se, "bracketed": bracketed}


def _dtype(params: Any) -> Any:
    """The dtype of a parameter pytree's first leaf."""
    return jax.tree_util.tree_leaves(params)[0].dtype


def _float_labels(m: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(inputs, labels in {0., 1.})`` for the kernels' logistic loss."""
    return m["x"], m["y"].astype(m["x"].dtype)


#: Compiled measure programs: (program, static settings, argument shapes) -> executable.
_COMPILED: dict = {}

#: The settings a program's compilation depends on (the rest of a unit's config does not).
_PROGRAM_KEYS = (
    "family", "width", "num_heads", "hessian_probes", "lanczos_steps", "sharpness_pairs",
    "worst_steps", "worst_batches", "worst_rho_linf", "worst_rho_l2", "sigma_pairs",
    "sigma_steps", "sigma_target", "sigma_bracket", "adaptive_sigma_bracket", "ggn_probes",
    "fisher_samples", "example_chunk", "rad_draws", "rad_steps", "delta", "measure_opt_level",
)  # fmt: skip


def _signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((np.shape(a), str(jnp.asarray(a).dtype) if not hasattr(a, "dtype")
                            else str(a.dtype)) for a in leaves))  # fmt: skip


def _run_program(name: str, cfg: Mapping[str, Any], args: list[tuple]) -> tuple[list, list, list]:
    """Run program ``name`` on every model's arguments, ``measure_lanes`` models at a time.

    Returns per model: its outputs (host numpy), its share of the run seconds of its group
    and of the compile seconds (nonzero in the group that compiled the program).
    """
    width = cfg["measure_lanes"]
    cfg_items = tuple((k, _freeze(cfg[k])) for k in _PROGRAM_KEYS)
    outputs, run_s, compile_s = [], [], []
    for g0 in range(0, len(args), width):
        group = args[g0 : g0 + width]
        real = len(group)
        stacked = _stack([*group, *[group[0]] * (width - real)])
        sig = (name, cfg_items, _signature(stacked))
        compiled, spent = _COMPILED.get(sig), 0.0
        if compiled is None:
            start = time.perf_counter()
            fn = _lane_program(name, _family_fns(cfg), cfg_items)
            level = cfg["measure_opt_level"]
            options = None if level is None else {"xla_backend_optimization_level": level}
            with kernels.runtime_checks(False):
                compiled = jax.jit(jax.vmap(fn)).lower(*stacked).compile(compiler_options=options)
            spent = time.perf_counter() - start
            _COMPILED[sig] = compiled
        start = time.perf_counter()
        out = jax.device_get(jax.block_until_ready(compiled(*stacked)))
        elapsed = time.perf_counter() - start
        for i in range(real):
            outputs.append(_pick(out, i))
            run_s.append(elapsed / real)
            compile_s.append(spent / real)
    return outputs, run_s, compile_s


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _finite(value: Any) -> float | None:
    x = float(value)
    return x if math.isfinite(x) else None


def _all_finite(tree: Any) -> bool:
    return all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(tree))
