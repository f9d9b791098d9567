"""Time to a given precision: sharpness and Hessian-trace estimates on the reference Transformer.

What a user waits for is an error bar small enough, not draws per second. For each point of the
reference model (``bench/_reference.py``; its initialisation and a trained point, ``--train-steps``
Adam steps on its batch) and each target relative standard error (5% and 1%), this prints the
wall time each estimator needs:

Average sharpness, $E_u L(\\theta+u) - L(\\theta)$, $u \\sim N(0, \\sigma^2 I)$, $\\sigma = 10^{-2}$
(the sharpness benchmark's):

- ``torch_plain``: the plain Monte Carlo PyTorch loop of ``bench/sharpness.py`` (perturb every
  weight in place, loss under ``no_grad``, restore), same weights and sigma; its standard error
  the usual one, sample std / sqrt(n) over its per-sample increases;
- ``ours_antithetic``: ``average_sharpness`` (antithetic pairs $(u, -u)$);
- ``ours_cv_hutchinson``: the Taylor control variate of ``sharpness_decomposition``:
  $\\frac{\\sigma^2}{2}\\widehat{\\mathrm{tr}H} + \\hat P$, the remainder $P$ averaged over pairs
  with $\\frac12 u^\\top H u$ subtracted, the trace by Hutchinson probes; the split between pairs
  and probes is the variance-optimal one (Neyman: $n_i \\propto \\sqrt{v_i / c_i}$, time
  $(\\sum_i \\sqrt{v_i c_i})^2 / \\varepsilon^2$);
- ``ours_cv_hutchpp``: the same with the trace term from Hutch++ (``hessian_trace(...,
  method="hutchpp")``) at the budgets of the trace ladder below.

Hessian trace, $\\mathrm{tr}\\,\\nabla^2 L(\\theta)$:

- ``ours_hutchinson``: ``hessian_trace(..., method="hutchinson")``;
- ``ours_hutchpp``: ``hessian_trace(..., method="hutchpp")`` at a ladder of budgets;
- ``pyhessian``: PyHessian's ``hessian(...).trace`` (Hutchinson, ``tol=-inf`` so it runs exactly
  the requested probes); standard error from its per-probe values.

Precision is the relative standard error, stderr / |estimate|, with the estimate taken as the most
precise one of the run. How the times come about (the same rule for every method):

1. a pilot run of each method measures its per-sample variance $v$ (pooled over repeats with
   different keys; for PyTorch over all its samples) and its wall time per sample $c$ (the timed,
   already compiled pilot's seconds / its samples, so fixed setup costs such as the unperturbed
   loss are counted per sample: a few percent against the bigger method);
2. the samples a target needs, $n = \\max(10, \\lceil v / (\\varepsilon\\mu)^2 \\rceil)$ (a
   standard error from fewer than 10 samples is not one to trust), and the time
   $n c$ (for Hutch++, whose residual variance falls as its sketch grows, the time at the budget
   interpolated log-log on the ladder of measured (budget, relative stderr) points);
3. where that time is short (``--verify-cap`` seconds), the fastest of ours per (quantity,
   target) is run for real at the predicted size (compiled first): its measured wall time and
   achieved relative stderr are printed beside the prediction (the table shows the measured
   time; the ratios use the predictions, the same rule for every method). The control variate
   with Hutch++ is two calls and is not run this way.

Hutch++'s reported stderr is that of its Hutchinson part given the sketch; since its estimate is
unbiased for $\\mathrm{tr}H$ *given* the sketch, that is the right standard error of the whole.
Ours and PyHessian's Hutchinson draw the same random variable ($v^\\top H v$, $v$ Rademacher, on
the same Hessian), so their per-probe variance is pooled and they differ by cost per probe only.
(PyHessian's own ``tol`` stops when two consecutive running means differ by less than ``tol``
relatively, which says nothing about the standard error; here it runs a fixed number of probes.)

Usage:  python bench/precision.py            (default: both points, about 10 min on 2 quiet cores)
        python bench/precision.py --quick    (small pilots, a short training run)
Prints one JSON record per measurement, then the tables (markdown) and the ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import _reference as ref  # noqa: E402

SIGMA = 1e-2


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def batch_loss(params, batch):
    """The reference loss as ``loss_fn(params, batch)``: one callable object for every call."""
    return ref.jax_loss(params, *batch)


def timed(fn, *args, **kwargs):
    """(result, seconds) of one call, blocking on JAX results."""
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - start


MIN_SAMPLES = 10  # a standard error from fewer samples is not one to trust


def needed(variance: float, mean: float, target: float) -> int:
    """Samples of per-sample variance ``variance`` for relative stderr ``target`` of ``mean``."""
    return max(MIN_SAMPLES, math.ceil(variance / (target * abs(mean)) ** 2))


# --------------------------------------------------------------------------- points


def train(params, batch, steps: int, learning_rate: float):
    """``steps`` Adam steps on the reference batch (the trained point)."""
    import jax
    import optax

    opt = optax.adam(learning_rate)

    @jax.jit
    def step(params, state, batch):
        value, grads = jax.value_and_grad(batch_loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    start, first = time.perf_counter(), None
    for _ in range(steps):
        params, state, value = step(params, state, batch)
        first = float(value) if first is None else first
    jax.block_until_ready(params)
    emit(
        {
            "record": "training",
            "steps": steps,
            "learning_rate": learning_rate,
            "loss_first": first,
            "loss_last": float(batch_loss(params, batch)),
            "seconds": time.perf_counter() - start,
        }
    )
    return params


def point_facts(params, batch) -> dict:
    import jax
    import jax.numpy as jnp

    value, grads = jax.value_and_grad(batch_loss)(params, batch)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
    return {"loss": float(value), "grad_norm": float(norm)}


# --------------------------------------------------------------------------- PyTorch


def torch_plain_samples(model, inputs, targets, num: int, seed: int) -> list[float]:
    """The sharpness benchmark's PyTorch loop, returning every increase L(θ+u) - L(θ)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    values = []
    with torch.no_grad():
        base = ref.torch_criterion(model(inputs), targets)
        for _ in range(num):
            noises = []
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=gen) * SIGMA
                p.add_(noise)
                noises.append(noise)
            values.append(float(ref.torch_criterion(model(inputs), targets) - base))
            for p, noise in zip(model.parameters(), noises, strict=True):
                p.sub_(noise)
    return values


def pyhessian_values(model, inputs, targets, num: int) -> list[float]:
    """PyHessian's Hutchinson: per-probe values v^T H v (exactly ``num`` probes)."""
    from pyhessian import hessian

    for p in model.parameters():  # a stale .grad would be added into its graph
        p.grad = None
    out = hessian(model, ref.torch_criterion, data=(inputs, targets), cuda=False).trace(
        maxIter=num, tol=-float("inf")
    )
    for p in model.parameters():
        p.grad = None
    assert len(out) == num
    return [float(x) for x in out]


def sample_var(values: list[float]) -> float:
    return statistics.variance(values)


# --------------------------------------------------------------------------- measurements


def pilot_jax(run, sizes_keys, per_sample_var) -> dict:
    """Compile with the first key, then time one call per remaining key; pool the variances."""
    import jax

    (num, keys) = sizes_keys
    _, compile_s = timed(run, num, keys[0])
    variances, times, means = [], [], []
    for k in keys[1:]:
        est, seconds = timed(run, num, jax.random.key(k))
        variances.append(per_sample_var(est, num))
        means.append(est)
        times.append(seconds)
    return {
        "num": num,
        "compile_and_first_s": compile_s,
        "times_s": times,
        "per_sample_s": statistics.median(times) / num,
        "variance": statistics.fmean(variances),
        "estimates": means,
    }


def measure_point(name: str, params, batch, args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from kernels.curvature import hessian_trace
    from kernels.sharpness import Perturbation, average_sharpness, sharpness_decomposition

    pert = Perturbation("gaussian", jnp.asarray(SIGMA, jnp.float32))
    facts = point_facts(params, batch)
    emit({"record": "point", "point": name, **facts})
    out = {"point": name, **facts}

    def anti(num, key):
        key = key if not isinstance(key, int) else jax.random.key(key)
        return average_sharpness(batch_loss, params, batch, key, perturbation=pert, num_samples=num)

    def dec(num, key, num_probes=2):
        key = key if not isinstance(key, int) else jax.random.key(key)
        return sharpness_decomposition(
            batch_loss,
            params,
            batch,
            key,
            perturbation=pert,
            num_samples=num,
            num_probes=num_probes,
        )

    def hutch(num, key):
        key = key if not isinstance(key, int) else jax.random.key(key)
        return hessian_trace(batch_loss, params, batch, key, num_samples=num)

    def hpp(num, key):
        key = key if not isinstance(key, int) else jax.random.key(key)
        return hessian_trace(batch_loss, params, batch, key, num_matvecs=num, method="hutchpp")

    def var_of(est, num):
        return float(est.stderr) ** 2 * num

    keys = list(range(args.repeats + 1))
    params_np = {k: np.asarray(v) for k, v in params.items()}
    model = ref.torch_model(params_np)
    t_inputs, t_targets = (torch.as_tensor(np.array(a), dtype=torch.int64) for a in batch)

    # ---- PyTorch first (then a pause so its OpenMP threads park before XLA runs)
    torch_plain_samples(model, t_inputs, t_targets, 2, seed=99)  # warm-up
    tp_values, tp_times = [], []
    for r in range(args.repeats):
        start = time.perf_counter()
        tp_values += torch_plain_samples(model, t_inputs, t_targets, args.torch_samples, seed=r)
        tp_times.append(time.perf_counter() - start)
    pyhessian_values(model, t_inputs, t_targets, 2)  # warm-up
    start = time.perf_counter()
    ph_values = pyhessian_values(model, t_inputs, t_targets, args.probes)
    ph_time = time.perf_counter() - start
    time.sleep(0.5)
    torch_plain = {
        "num": args.torch_samples,
        "times_s": tp_times,
        "per_sample_s": statistics.median(tp_times) / args.torch_samples,
        "variance": sample_var(tp_values),
        "mean": statistics.fmean(tp_values),
        "num_pooled": len(tp_values),
    }
    pyh = {
        "num": args.probes,
        "times_s": [ph_time],
        "per_sample_s": ph_time / args.probes,
        "variance": sample_var(ph_values),
        "mean": statistics.fmean(ph_values),
    }

    # ---- ours
    ours_anti = pilot_jax(anti, (args.pairs, keys), var_of)
    ours_dec = pilot_jax(dec, (args.cv_pairs, keys), lambda e, n: var_of(e.remainder, n))
    ours_hutch = pilot_jax(hutch, (args.probes, keys), var_of)
    ladder = []
    for m in args.ladder:
        rec = pilot_jax(hpp, (m, keys), lambda e, n: float(e.stderr) ** 2)
        rec["rel_stderr"] = [float(e.stderr) / abs(float(e.mean)) for e in rec["estimates"]]
        rec["seconds"] = statistics.median(rec["times_s"])
        ladder.append(rec)

    # reference values: the most precise estimates of the run
    anti_means = [float(e.mean) for e in ours_anti["estimates"]]
    sharp_mu = statistics.fmean(anti_means)
    # the trace: inverse-variance weighted over every trace estimate of the run
    pool = [(float(e.mean), float(e.stderr) ** 2) for e in ours_hutch["estimates"]]
    pool += [(float(e.mean), float(e.stderr) ** 2) for r in ladder for e in r["estimates"]]
    pool.append((pyh["mean"], pyh["variance"] / pyh["num"]))
    weights = [1 / v for _, v in pool]
    trace_mu = sum(m * w for (m, _), w in zip(pool, weights, strict=True)) / sum(weights)
    # ours and PyHessian's Hutchinson draw from one distribution (Rademacher v, v^T H v on the
    # same Hessian): their per-probe variance is pooled, so the two differ by cost per probe only
    v_hutch = (ours_hutch["variance"] * args.repeats + pyh["variance"]) / (args.repeats + 1)
    half = 0.5 * SIGMA**2
    cost_probe = ours_hutch["per_sample_s"]
    # a decomposition pilot pair costs (time - 2 probes) / pairs (its fixed gradient counted)
    dec_time = statistics.median(ours_dec["times_s"])
    cost_cv_pair = max(dec_time - 2 * cost_probe, 0.0) / ours_dec["num"]
    v_rem = ours_dec["variance"]
    v_probe = half**2 * v_hutch
    remainder_mu = statistics.fmean(float(e.remainder.mean) for e in ours_dec["estimates"])

    for label, rec in [
        ("torch_plain", torch_plain),
        ("ours_antithetic", ours_anti),
        ("ours_cv_remainder", ours_dec),
        ("ours_hutchinson", ours_hutch),
        ("pyhessian", pyh),
    ]:
        emit(
            {
                "record": "pilot",
                "point": name,
                "method": label,
                **{k: v for k, v in rec.items() if k != "estimates"},
            }
        )
    for rec in ladder:
        emit(
            {
                "record": "pilot",
                "point": name,
                "method": "ours_hutchpp",
                **{k: v for k, v in rec.items() if k != "estimates"},
            }
        )
    emit(
        {
            "record": "variances",
            "point": name,
            "sharpness_mean": sharp_mu,
            "torch_mean": torch_plain["mean"],
            "remainder_mean": remainder_mu,
            "trace_mean": trace_mu,
            "var_plain_per_eval": torch_plain["variance"],
            "var_antithetic_per_pair": ours_anti["variance"],
            "var_antithetic_per_eval": ours_anti["variance"] * 2,
            "var_cv_remainder_per_pair": v_rem,
            "var_cv_trace_term_per_probe": v_probe,
            "rel_std_hutchinson_per_probe": math.sqrt(ours_hutch["variance"]) / abs(trace_mu),
            "rel_std_hutchinson_pooled": math.sqrt(v_hutch) / abs(trace_mu),
            "rel_std_pyhessian_per_probe": math.sqrt(pyh["variance"]) / abs(trace_mu),
        }
    )

    def hpp_time(rel_target: float) -> tuple[float, float] | None:
        """(budget, seconds) of Hutch++ at relative stderr ``rel_target`` (log-log on the ladder;
        a target the smallest budget already meets is given that budget's time)."""
        pts = [(r["num"], statistics.fmean(r["rel_stderr"]), r["seconds"]) for r in ladder]
        for m, rel, secs in pts:
            if rel <= rel_target and m == pts[0][0]:
                return m, secs
        for (m0, r0, s0), (m1, r1, s1) in itertools.pairwise(pts):
            if r1 <= rel_target < r0:
                slope = math.log(r1 / r0) / math.log(m1 / m0)
                m = m0 * (rel_target / r0) ** (1 / slope)
                return m, s0 + (s1 - s0) * (m - m0) / (m1 - m0)
        # beyond the ladder: 1/sqrt(m) from its last point (Hutch++ falls like 1/m only while
        # its sketch still removes dominant eigenvalues; a bulk spectrum brings back 1/sqrt(m))
        m1, r1, s1 = pts[-1]
        m = m1 * (r1 / rel_target) ** 2
        return m, s1 * m / m1

    rows = []
    for target in args.targets:
        eps = target * abs(sharp_mu)
        n_plain = needed(torch_plain["variance"], sharp_mu, target)
        n_anti = needed(ours_anti["variance"], sharp_mu, target)
        sharp = {
            "torch_plain": (n_plain, n_plain * torch_plain["per_sample_s"]),
            "ours_antithetic": (n_anti, n_anti * ours_anti["per_sample_s"]),
        }
        # CV with Hutchinson: Neyman split between remainder pairs and trace probes
        a, b = math.sqrt(v_rem * cost_cv_pair), math.sqrt(v_probe * cost_probe)
        n_pairs = max(MIN_SAMPLES, math.ceil(math.sqrt(v_rem / cost_cv_pair) * (a + b) / eps**2))
        n_probes = max(MIN_SAMPLES, math.ceil(math.sqrt(v_probe / cost_probe) * (a + b) / eps**2))
        t_cv = n_pairs * cost_cv_pair + n_probes * cost_probe
        sharp["ours_cv_hutchinson"] = ((n_pairs, n_probes), t_cv)
        # CV with Hutch++: the trace term to a share of the error, the pairs to the rest
        cv_best = None
        for share in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95):
            found = hpp_time(share * eps / (half * abs(trace_mu)))
            if found is None:
                continue
            m, t_trace = found
            rest2 = eps**2 * (1 - share**2)
            n_r = max(MIN_SAMPLES, math.ceil(v_rem / rest2))
            total = t_trace + n_r * cost_cv_pair
            if cv_best is None or total < cv_best[1]:
                cv_best = ((round(m), n_r), total)
        if cv_best is not None:
            sharp["ours_cv_hutchpp"] = cv_best
        n_h = n_p = needed(v_hutch, trace_mu, target)
        trace = {
            "ours_hutchinson": (n_h, n_h * ours_hutch["per_sample_s"]),
            "pyhessian": (n_p, n_p * pyh["per_sample_s"]),
        }
        found = hpp_time(target)
        if found is not None:
            trace["ours_hutchpp"] = (round(found[0]), found[1])
        for quantity, table in [("sharpness", sharp), ("trace", trace)]:
            for method, (num, seconds) in table.items():
                row = {
                    "record": "time_to_precision",
                    "point": name,
                    "quantity": quantity,
                    "target_rel_stderr": target,
                    "method": method,
                    "samples": num,
                    "predicted_s": seconds,
                }
                emit(row)
                rows.append(row)
    out["rows"] = rows
    out["sharpness_mean"], out["trace_mean"] = sharp_mu, trace_mu

    # ---- verification: the best of ours per (quantity, target), run for real where short
    best: dict = {}
    for row in rows:
        slot = (row["quantity"], row["target_rel_stderr"])
        if row["method"].startswith("ours") and (
            slot not in best or row["predicted_s"] < best[slot]["predicted_s"]
        ):
            best[slot] = row
    for row in best.values():
        if row["predicted_s"] > args.verify_cap:
            continue
        if row["method"] == "ours_antithetic":
            run = lambda k, n=row["samples"]: anti(n, k)  # noqa: E731
            mean_se = lambda e: (float(e.mean), float(e.stderr))  # noqa: E731
        elif row["method"] == "ours_hutchinson":
            run = lambda k, n=row["samples"]: hutch(n, k)  # noqa: E731
            mean_se = lambda e: (float(e.mean), float(e.stderr))  # noqa: E731
        elif row["method"] == "ours_hutchpp":
            run = lambda k, n=row["samples"]: hpp(max(4, n), k)  # noqa: E731
            mean_se = lambda e: (float(e.mean), float(e.stderr))  # noqa: E731
        elif row["method"] == "ours_cv_hutchinson":
            run = lambda k, n=row["samples"]: dec(n[0], k, num_probes=n[1])  # noqa: E731

            def mean_se(e):
                mean = float(e.trace_term.mean) + float(e.remainder.mean)
                return mean, math.hypot(float(e.trace_term.stderr), float(e.remainder.stderr))
        else:
            continue  # CV with Hutch++ is two calls; its parts are verified above
        _, compile_s = timed(run, 1000)
        est, seconds = timed(run, 1001)
        mean, se = mean_se(est)
        row.update(
            measured_s=seconds,
            measured_compile_s=compile_s,
            achieved_rel_stderr=se / abs(mean),
        )
        emit({**row, "record": "verified"})
    return out


# --------------------------------------------------------------------------- report


def table(results: list[dict], quantity: str, methods: list[str], baseline: str, targets) -> str:
    head = "| point | target | " + " | ".join(methods) + f" | {baseline} / best ours |"
    lines = [head, "|" + "---|" * (len(methods) + 3)]
    for res in results:
        for target in targets:
            cells, ours = [], []
            rows = {
                r["method"]: r
                for r in res["rows"]
                if r["quantity"] == quantity and r["target_rel_stderr"] == target
            }
            for m in methods:
                r = rows.get(m)
                if r is None:
                    cells.append("n/a")
                    continue
                secs = r.get("measured_s", r["predicted_s"])
                tag = f" ({r['achieved_rel_stderr']:.1%} measured)" if "measured_s" in r else ""
                cells.append(f"{secs:,.1f} s, n={r['samples']}{tag}")
                if m.startswith("ours"):
                    ours.append(r["predicted_s"])
            ratio = rows[baseline]["predicted_s"] / min(ours)
            lines.append(
                f"| {res['point']} | {target:.0%} | " + " | ".join(cells) + f" | **{ratio:.1f}x** |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small pilots, short training")
    parser.add_argument("--points", default="init,trained")
    parser.add_argument("--train-steps", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--repeats", type=int, default=None, help="timed pilot calls per method")
    parser.add_argument("--targets", default="0.05,0.01", help="relative stderrs")
    parser.add_argument("--verify-cap", type=float, default=None, help="seconds")
    args = parser.parse_args()
    q = args.quick
    args.targets = [float(t) for t in args.targets.split(",")]
    args.train_steps = args.train_steps if args.train_steps is not None else (50 if q else 200)
    args.repeats = args.repeats or (1 if q else 2)
    args.torch_samples = 24 if q else 64
    args.pairs = 16 if q else 48
    args.cv_pairs = 8 if q else 16
    args.probes = 12 if q else 32
    args.ladder = [30] if q else [30, 90]
    args.verify_cap = args.verify_cap if args.verify_cap is not None else (5.0 if q else 30.0)

    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(2)
    emit(
        {
            "record": "setup",
            "jax": jax.__version__,
            "torch": torch.__version__,
            "backend": jax.default_backend(),
            "cpu_count": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "num_params": ref.num_params(),
            "sigma": SIGMA,
            **{k: v for k, v in vars(args).items()},
        }
    )
    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    batch = tuple(jnp.asarray(a, dtype=jnp.int32) for a in ref.make_batch())
    start = time.perf_counter()
    results = []
    for point in args.points.split(","):
        if point == "trained":
            params = train(params, batch, args.train_steps, args.learning_rate)
        results.append(measure_point(point, params, batch, args))
    sharp_methods = ["torch_plain", "ours_antithetic", "ours_cv_hutchinson", "ours_cv_hutchpp"]
    trace_methods = ["pyhessian", "ours_hutchinson", "ours_hutchpp"]
    print("\nAverage sharpness, sigma = 1e-2 (wall time to the target relative stderr):")
    print(table(results, "sharpness", sharp_methods, "torch_plain", args.targets))
    print("\nHessian trace (wall time to the target relative stderr):")
    print(table(results, "trace", trace_methods, "pyhessian", args.targets))
    emit(
        {
            "record": "end",
            "wall_s": time.perf_counter() - start,
            "load_avg": os.getloadavg(),
            "means": {r["point"]: [r["sharpness_mean"], r["trace_mean"]] for r in results},
        }
    )


if __name__ == "__main__":
    main()
