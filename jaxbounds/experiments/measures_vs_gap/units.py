"""The units of ``measures-vs-gap``: train a batch, measure it, one row per model."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxbounds.experiments import runner
from jaxbounds.experiments.measures_vs_gap.grid import measure_size
from jaxbounds.experiments.measures_vs_gap.host import (
    _bound_measures,
    _norm_measures,
    _search_inputs,
)
from jaxbounds.experiments.measures_vs_gap.programs import (
    MeasureSpec,
    _all_finite,
    _finite,
    _key,
    _programs,
    _run_program,
    _tag,
    measure_specs,
)
from jaxbounds.experiments.measures_vs_gap.training import _train_batch, _Trained

# ---------------------------------------------------------------------------------- the units


def _ones_input(cfg: Mapping[str, Any], train_data: dict) -> np.ndarray:
    shape = (1, *np.shape(train_data["x"])[1:])
    return np.ones(shape, np.float32)


def _measure_rows(t: _Trained) -> list[dict]:
    """The measures of every trained unit of a batch (programs vmapped over models)."""
    cfg = t.units[0].config
    specs = measure_specs(cfg)
    n = len(t.units)
    rows: list[dict] = [{} for _ in range(n)]
    seconds = {p: [0.0] * n for p in _programs(cfg)}
    compile_s = {p: [0.0] * n for p in _programs(cfg)}

    def record(program: str, index: list[int], args: list[tuple]) -> list:
        if not index:
            return []
        out, run_s, comp_s = _run_program(program, cfg, args)
        for i, r, c in zip(index, run_s, comp_s, strict=True):
            seconds[program][i] += r
            compile_s[program][i] += c
        return out

    everyone = list(range(n))
    evals = record("eval", everyone, [(t.params[i], t.train[i], t.test[i]) for i in everyone])
    for i, ev in enumerate(evals):
        rows[i] |= {k: _finite(v) for k, v in ev.items()}
    ok = [i for i in everyone if not t.diverged[i] and _all_finite(t.params[i])]
    m = measure_size(cfg)
    meas = {i: {"x": t.train[i]["x"][:m], "y": t.train[i]["y"][:m]} for i in ok}
    keyed = lambda program: [(t.params[i], meas[i], _key(t.units[i].seed, program))  # noqa: E731
                             for i in ok]  # fmt: skip

    def put(column: str, out: list, fields: tuple = ("mean", "stderr")) -> None:
        for i, o in zip(ok, out, strict=True):
            rows[i][column] = _finite(o[fields[0]])
            if len(fields) > 1 and fields[1] in o:
                rows[i][f"{column}_stderr"] = _finite(o[fields[1]])

    put("hessian_trace", record("hessian_trace", ok, keyed("hessian_trace")))
    put("hessian_top_eigenvalue", record("hessian_top", ok, keyed("hessian_top")),
        fields=("mean",))  # fmt: skip
    for kind, sigmas in (("avg", cfg["sharpness_sigmas"]), ("adaptive", cfg["adaptive_sigmas"])):
        for s in sigmas:
            program = f"{kind}_sharpness_{_tag(s)}"
            args = [(*a, np.asarray(s, np.float32)) for a in keyed(program)]
            put(program, record(program, ok, args))
    for norm in ("linf", "l2"):
        program = f"worst_adaptive_{norm}"
        put(program, record(program, ok, keyed(program)))
    for program, column in (("sigma_mag", "pacbayes_mag"), ("sigma_plain", "pacbayes")):
        for i, o in zip(ok, record(program, ok, keyed(program)), strict=True):
            sigma = float(o["sigma"])
            rows[i][f"{column}_sigma"] = _finite(sigma)
            rows[i][f"{column}_bracketed"] = bool(o["bracketed"])
            rows[i][f"{column}_flatness"] = _finite(1.0 / sigma**2)
    put("ggn_trace", record("ggn_trace", ok, keyed("ggn_trace")))
    put(
        "empirical_fisher_trace",
        record("empirical_fisher", ok, [(t.params[i], meas[i]) for i in ok]),
        fields=("mean",),
    )
    put("mc_fisher_trace", record("mc_fisher", ok, keyed("mc_fisher")))
    ones = [(t.params[i], _ones_input(cfg, t.train[i])) for i in ok]
    put("path_norm", record("path_norm", ok, ones), fields=("mean",))
    search = []
    for i in ok:
        theta, inputs, bound = _search_inputs(cfg, t.params[i], t.params0[i], t.train[i],
                                              t.radii[i])  # fmt: skip
        search.append((theta, inputs, _key(t.units[i].seed, "rademacher_search"), bound))
    out = record("rademacher_search", ok, search)
    for i, o in zip(ok, out, strict=True):
        rows[i]["rademacher_lower"] = _finite(o["mean"])
        rows[i]["rademacher_lower_stderr"] = _finite(o["stderr"])
        rows[i]["rademacher_lower_mcdiarmid"] = _finite(o["lower"])
    for i in ok:
        start = time.perf_counter()
        rows[i] |= _norm_measures(cfg, t.params[i], t.params0[i])
        rows[i]["pacbayes_kl_init"] = _kl_init(rows[i], t.params[i], t.params0[i])
        seconds["norms"][i] = time.perf_counter() - start
        start = time.perf_counter()
        rows[i] |= _bound_measures(cfg, t.params[i], t.params0[i], t.train[i], t.radii[i])
        seconds["bounds"][i] = time.perf_counter() - start
    template = _row_template(specs)
    out_rows = []
    for i in everyone:
        row = {**template, **rows[i]}
        row |= {f"seconds_{p}": seconds[p][i] for p in seconds}
        row |= {f"compile_seconds_{p}": compile_s[p][i] for p in compile_s}
        out_rows.append(row)
    return out_rows


def _kl_init(row: Mapping[str, Any], params: Any, params0: Any) -> float | None:
    sigma = row.get("pacbayes_sigma")
    if sigma is None:
        return None
    diff = [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in
            zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params0),
                strict=True)]  # fmt: skip
    return _finite(sum(float(np.sum(d**2)) for d in diff) / (2.0 * sigma**2))


def _row_template(specs: Sequence[MeasureSpec]) -> dict:
    """Every result column in a fixed order (None until measured)."""
    row: dict[str, Any] = dict.fromkeys((
        "steps", "reached", "hit_cap", "diverged", "train_loss", "train_accuracy", "test_loss",
        "test_accuracy", "gap", "gap_stderr", "error_gap", "train_loss_sd", "test_loss_sd",
    ))  # fmt: skip
    for spec in specs:
        row[spec.name] = None
        if spec.stderr:
            row[f"{spec.name}_stderr"] = None
        if spec.kind == "bound":
            row[f"{spec.name}_status"] = None
    for extra in ("pacbayes_mag_sigma", "pacbayes_mag_bracketed", "pacbayes_sigma",
                  "pacbayes_bracketed", "rademacher_lower_mcdiarmid"):  # fmt: skip
        row[extra] = None
    return row


def run_batch(units: Sequence[runner.Unit]) -> list[dict]:
    """The rows of the units of one shape: one training call, then batched measures.

    Row ``i`` does not depend on the other units (fixed vmap widths, keys from the unit).
    """
    t = _train_batch(units)
    rows = _measure_rows(t)
    for i, row in enumerate(rows):
        row["steps"] = int(t.steps[i])
        row["reached"] = bool(t.reached[i])
        row["hit_cap"] = bool(t.hit_cap[i])
        row["diverged"] = bool(t.diverged[i])
        tr, te = row.get("train_loss"), row.get("test_loss")
        row["gap"] = None if tr is None or te is None else te - tr
        sd, n_test = row.get("test_loss_sd"), len(t.test[i]["y"])
        row["gap_stderr"] = None if sd is None else sd / math.sqrt(n_test)
        acc_tr, acc_te = row.get("train_accuracy"), row.get("test_accuracy")
        row["error_gap"] = None if acc_tr is None or acc_te is None else acc_tr - acc_te
        row["seconds_train"] = t.seconds / len(units)
    return rows


def run_unit(unit: runner.Unit) -> dict:
    """One unit: :func:`run_batch` of that unit alone."""
    return run_batch([unit])[0]
