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


class _Rows:
    """The measure rows of one batch of trained units, filled program by program."""

    def __init__(self, t: _Trained) -> None:
        self.t = t
        self.cfg = cfg = t.units[0].config
        n = len(t.units)
        self.rows: list[dict] = [{} for _ in range(n)]
        self.seconds = {p: [0.0] * n for p in _programs(cfg)}
        self.compile_s = {p: [0.0] * n for p in _programs(cfg)}
        self.everyone = list(range(n))
        self.ok: list[int] = []
        self.meas: dict[int, dict] = {}

    def record(self, program: str, index: list[int], args: list[tuple]) -> list:
        if not index:
            return []
        out, run_s, comp_s = _run_program(program, self.cfg, args)
        for i, r, c in zip(index, run_s, comp_s, strict=True):
            self.seconds[program][i] += r
            self.compile_s[program][i] += c
        return out

    def keyed(self, program: str) -> list[tuple]:
        t = self.t
        return [(t.params[i], self.meas[i], _key(t.units[i].seed, program)) for i in self.ok]

    def put(self, column: str, out: list, fields: tuple = ("mean", "stderr")) -> None:
        for i, o in zip(self.ok, out, strict=True):
            self.rows[i][column] = _finite(o[fields[0]])
            if len(fields) > 1 and fields[1] in o:
                self.rows[i][f"{column}_stderr"] = _finite(o[fields[1]])

    def evaluate(self) -> None:
        t = self.t
        args = [(t.params[i], t.train[i], t.test[i]) for i in self.everyone]
        for i, ev in enumerate(self.record("eval", self.everyone, args)):
            self.rows[i] |= {k: _finite(v) for k, v in ev.items()}
        self.ok = [i for i in self.everyone if not t.diverged[i] and _all_finite(t.params[i])]
        m = measure_size(self.cfg)
        self.meas = {i: {"x": t.train[i]["x"][:m], "y": t.train[i]["y"][:m]} for i in self.ok}

    def curvature_and_sharpness(self) -> None:
        cfg, record, keyed, put = self.cfg, self.record, self.keyed, self.put
        put("hessian_trace", record("hessian_trace", self.ok, keyed("hessian_trace")))
        put("hessian_top_eigenvalue", record("hessian_top", self.ok, keyed("hessian_top")),
            fields=("mean",))  # fmt: skip
        for kind, sigmas in (
            ("avg", cfg["sharpness_sigmas"]),
            ("adaptive", cfg["adaptive_sigmas"]),
        ):
            for s in sigmas:
                program = f"{kind}_sharpness_{_tag(s)}"
                args = [(*a, np.asarray(s, np.float32)) for a in keyed(program)]
                put(program, record(program, self.ok, args))
        for norm in ("linf", "l2"):
            program = f"worst_adaptive_{norm}"
            put(program, record(program, self.ok, keyed(program)))
        for program, column in (("sigma_mag", "pacbayes_mag"), ("sigma_plain", "pacbayes")):
            for i, o in zip(self.ok, record(program, self.ok, keyed(program)), strict=True):
                sigma = float(o["sigma"])
                self.rows[i][f"{column}_sigma"] = _finite(sigma)
                self.rows[i][f"{column}_bracketed"] = bool(o["bracketed"])
                self.rows[i][f"{column}_flatness"] = _finite(1.0 / sigma**2)

    def fisher_and_norms(self) -> None:
        t, ok, record, put = self.t, self.ok, self.record, self.put
        put("ggn_trace", record("ggn_trace", ok, self.keyed("ggn_trace")))
        put(
            "empirical_fisher_trace",
            record("empirical_fisher", ok, [(t.params[i], self.meas[i]) for i in ok]),
            fields=("mean",),
        )
        put("mc_fisher_trace", record("mc_fisher", ok, self.keyed("mc_fisher")))
        ones = [(t.params[i], _ones_input(self.cfg, t.train[i])) for i in ok]
        put("path_norm", record("path_norm", ok, ones), fields=("mean",))

    def search(self) -> None:
        t, search = self.t, []
        for i in self.ok:
            theta, inputs, bound = _search_inputs(self.cfg, t.params[i], t.params0[i], t.train[i],
                                                  t.radii[i])  # fmt: skip
            search.append((theta, inputs, _key(t.units[i].seed, "rademacher_search"), bound))
        for i, o in zip(self.ok, self.record("rademacher_search", self.ok, search), strict=True):
            self.rows[i]["rademacher_lower"] = _finite(o["mean"])
            self.rows[i]["rademacher_lower_stderr"] = _finite(o["stderr"])
            self.rows[i]["rademacher_lower_mcdiarmid"] = _finite(o["lower"])

    def closed_forms(self) -> None:
        t, cfg = self.t, self.cfg
        for i in self.ok:
            start = time.perf_counter()
            self.rows[i] |= _norm_measures(cfg, t.params[i], t.params0[i])
            self.rows[i]["pacbayes_kl_init"] = _kl_init(self.rows[i], t.params[i], t.params0[i])
            self.seconds["norms"][i] = time.perf_counter() - start
            start = time.perf_counter()
            self.rows[i] |= _bound_measures(cfg, t.params[i], t.params0[i], t.train[i], t.radii[i])
            self.seconds["bounds"][i] = time.perf_counter() - start

    def assemble(self) -> list[dict]:
        template = _row_template(measure_specs(self.cfg))
        out_rows = []
        for i in self.everyone:
            row = {**template, **self.rows[i]}
            row |= {f"seconds_{p}": self.seconds[p][i] for p in self.seconds}
            row |= {f"compile_seconds_{p}": self.compile_s[p][i] for p in self.compile_s}
            out_rows.append(row)
        return out_rows


def _measure_rows(t: _Trained) -> list[dict]:
    """The measures of every trained unit of a batch (programs vmapped over models)."""
    rows = _Rows(t)
    rows.evaluate()
    rows.curvature_and_sharpness()
    rows.fisher_and_norms()
    rows.search()
    rows.closed_forms()
    return rows.assemble()


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
