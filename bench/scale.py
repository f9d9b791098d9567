"""Benchmark at scale: the curvature and sharpness kernels on a GPT-2-small-sized decoder (CPU).

Model (flax nnx, random weights at initialisation, float32): 12 pre-LayerNorm decoder blocks,
d = 768, 12 heads, MLP 3072 (tanh-GELU), causal hand-written attention, learned positions (128),
GPT-2's vocabulary of 50,257 tokens with the readout tied to the token embedding:
123,751,680 parameters (85.1M in the blocks, 38.6M in the tied embedding). Data: synthetic uniform
tokens, batches of 4 x 128, next-token cross-entropy. The blocks are stacked along a leading
layer axis and run with ``lax.scan`` (one block traced and compiled, not twelve).

Kernels measured (one jitted program each, compiled ahead of time and timed separately):

- ``hessian_trace`` (Hutchinson, 8 probes) on one batch,
- ``top_eigenvalues`` (k = 1, 10 Lanczos steps) of the Hessian on one batch, with the Hessian
  linearised once (``linearize=True``; the default ``"auto"`` does so while the linearisation's
  residuals take at most 1 GiB) and with its products recomputed each step (``linearize=False``),
- ``average_sharpness`` (16 antithetic pairs, Gaussian sigma = 1e-3) on one batch,
- ``worst_case_sharpness`` (l2 ball, radius 0.05, 5 ascent steps) on one batch,
- dataset level, 16 batches (8,192 tokens), one batch of activations in memory at a time:
  ``hutchinson_trace(dataset_hvp(...))`` (2 probes, the minimum: 32 batch quadratic forms) and
  ``average_sharpness`` of ``dataset_loss(loss_fn)`` (2 antithetic pairs, the minimum; the mean
  over the batches, streamed with ``lax.scan``). ``--only dataset_grad`` /
  ``--only dataset_worst_case_sharpness`` add the dataset gradient and worst-case sharpness.

Each kernel runs in a fresh subprocess, so peak RSS (``ru_maxrss``, compiler included) is its
own. That process compiles and runs the kernel once at the measured count while a thread
samples its RSS every 50 ms, reads its peak and XLA's allocation plan
(``memory_analysis().temp_size_in_bytes``), and times one gradient of the same loss (jitted
``value_and_grad``), so the time ratio comes from one process. With ``--twins`` it first
compiles the kernel at a smaller count (or 2 batches) too, only for XLA's allocation plan. The
jobs of a run share a temporary directory: the first job initialises the weights and saves
them, the others read them (~1.5 s instead of ~6 s), and XLA's compilation cache there holds
the one-batch gradient every job times (each kernel is still compiled once, in its job).
The parent records each child's wall time and CPU time (user + sys), so a run on a shared
machine still gives a quiet-machine estimate (about CPU / 2 on 2 cores). Reported per kernel:

- time per probe / sample / step over one gradient (target <= 1.3); dataset-level runs divide by
  the number of batches times one batch gradient;
- peak RSS over the peak RSS of a process that only computes one gradient (target <= 2.0);
- that memory does not grow with the count or the batches: the RSS timeline of the run (its
  peak in the second half, the later probes / samples / batches, against the first half's),
  drawn in ``bench/results/scale_memory.png``, and with ``--twins`` XLA's temporaries at the
  smaller count / 2 batches against the measured run's.

A PyTorch twin of the same model with the same weights (hand-written attention, since
PyTorch's fused attention has no double backward on CPU) runs PyHessian's Hutchinson loop
(``hessian(...).trace``, double backprop) for the per-probe comparison.

Issue 22's ratios (Hutchinson per probe, Lanczos per step and its temporaries beyond the basis,
worst case per ascent step and its peak memory, PyHessian per probe over ours, each with its
target) are collected in the summary's ``issue22`` record and the table's last line.

On an accelerator nothing changes in the commands: memory is read from the device
(``memory_stats()``: bytes in use sampled over the run, its peak) instead of the process's RSS,
and the PyTorch twin and PyHessian run on ``cuda`` when PyTorch sees a GPU. ``main(argv)``
returns the summary, for ``bench/accelerator.py``.

Run:  python bench/scale.py            (full model; see the README for the measured time)
      python bench/scale.py --quick    (2 layers, d = 64, vocab 512: seconds per job)
      python bench/scale.py --twins    (also XLA's allocation plan at smaller counts)
      python bench/scale.py --summarize   (tables from the records of a run cut short)
      python bench/scale.py --mid --costs   (compile only, one process: XLA's GFLOP, bytes
                                            accessed and temporaries of every job's program
                                            against the gradient's, on the 26.4M decoder;
                                            ``--only JOB`` to pick, e.g. hessian_trace_forms,
                                            hessian_trace_products, top_eigenvalues_float16_basis,
                                            decomposition_forms, decomposition_products)
Prints one JSON record per job (also appended to ``bench/results/scale[_quick].jsonl`` as each
job ends, with the conditions of the machine during the job), then a JSON summary and a
markdown table, written to ``bench/results/scale[_quick].{json,md}`` (and the figure) through the
quiet-machine guard (``bench/_quiet.py``): only when the machine was quiet over the jobs, unless
``--allow-load``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import _quiet as quiet  # noqa: E402  (standard library only: no JAX at import)

SIGMA = 1e-3  # Gaussian perturbation of average_sharpness
RADIUS = 0.05  # l2 ball of worst_case_sharpness
LN_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int
    dim: int
    heads: int
    hidden: int
    layers: int
    seq: int
    batch: int
    num_batches: int  # batches of the dataset-level runs


FULL = Config(vocab=50257, dim=768, heads=12, hidden=3072, layers=12, seq=128, batch=4,
              num_batches=16)  # fmt: skip
QUICK = Config(vocab=512, dim=64, heads=4, hidden=256, layers=2, seq=32, batch=4, num_batches=16)
# the mid-size decoder of the README's profile (26.4M parameters): --mid, mostly with --costs
MID = Config(vocab=50257, dim=384, heads=6, hidden=1536, layers=4, seq=128, batch=4, num_batches=16)


def config(args) -> Config:
    return QUICK if args.quick else MID if args.mid else FULL


def num_params(cfg: Config) -> int:
    d, h = cfg.dim, cfg.hidden
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d)
    return cfg.vocab * d + cfg.seq * d + cfg.layers * block + 2 * d


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# --------------------------------------------------------------------------- JAX model


def build_jax(cfg: Config, seed: int = 0, weights: str | None = None):
    """The nnx model split into ``(loss_fn, params)`` plus the data (token arrays).

    ``weights``: an ``.npz`` of the parameter leaves shared by the jobs of one run: read when
    it exists (the model is built abstractly, ``nnx.eval_shape``, and filled: ~1.5 s instead
    of ~6 s of initialisers at 124M), written after initialising when it does not."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    init = nnx.initializers.normal(0.02)
    init_out = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.layers))  # GPT-2's residual scaling

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            d, h = cfg.dim, cfg.hidden
            self.ln1 = nnx.LayerNorm(d, epsilon=LN_EPS, rngs=rngs)
            self.qkv = nnx.Linear(d, 3 * d, kernel_init=init, rngs=rngs)
            self.proj = nnx.Linear(d, d, kernel_init=init_out, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, epsilon=LN_EPS, rngs=rngs)
            self.fc = nnx.Linear(d, h, kernel_init=init, rngs=rngs)
            self.out = nnx.Linear(h, d, kernel_init=init_out, rngs=rngs)

        def __call__(self, x):
            b, t, d = x.shape
            nh, hd = cfg.heads, d // cfg.heads
            q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
            q, k, v = (a.reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for a in (q, k, v))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
            mask = jnp.tril(jnp.ones((t, t), dtype=bool))
            scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
            out = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + self.proj(out)
            return x + self.out(jax.nn.gelu(self.fc(self.ln2(x)), approximate=True))

    class Decoder(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.wte = nnx.Embed(cfg.vocab, cfg.dim, embedding_init=init, rngs=rngs)
            self.wpe = nnx.Embed(cfg.seq, cfg.dim, embedding_init=nnx.initializers.normal(0.01),
                                 rngs=rngs)  # fmt: skip
            blocks = [nnx.split(Block(rngs)) for _ in range(cfg.layers)]
            stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *[s for _, s in blocks])
            self.blocks = nnx.merge(blocks[0][0], stacked)  # params with a leading layer axis
            self.lnf = nnx.LayerNorm(cfg.dim, epsilon=LN_EPS, rngs=rngs)

        def __call__(self, tokens):
            x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))[None]
            graphdef, state = nnx.split(self.blocks)
            x = jax.lax.scan(lambda x, s: (nnx.merge(graphdef, s)(x), None), x, state)[0]
            return self.wte.attend(self.lnf(x))  # tied readout

    if weights is not None and os.path.exists(weights):
        graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(nnx.Rngs(seed))), nnx.Param)
        treedef = jax.tree_util.tree_structure(abstract)
        with np.load(weights) as saved:
            leaves = [jnp.asarray(saved[f"arr_{i}"]) for i in range(treedef.num_leaves)]
        params = jax.tree_util.tree_unflatten(treedef, leaves)
    else:
        graphdef, params = nnx.split(Decoder(nnx.Rngs(seed)), nnx.Param)
        if weights is not None:  # write then rename: a reader never sees half a file
            part = weights + ".part.npz"
            try:
                np.savez(part, *(np.asarray(x) for x in jax.tree_util.tree_leaves(params)))
                os.replace(part, weights)
            except OSError as err:  # e.g. a full temporary disk: every job initialises instead
                sys.stderr.write(f"scale: weights not shared between jobs ({err})\n")
                if os.path.exists(part):
                    os.remove(part)

    def loss_fn(params, batch):
        """Mean next-token cross-entropy on one batch ``(inputs, targets)``."""
        inputs, targets = batch
        logits = nnx.merge(graphdef, params)(inputs)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(0, cfg.vocab, size=(cfg.num_batches, cfg.batch, cfg.seq + 1))
    batches = (jnp.asarray(tokens[..., :-1], jnp.int32), jnp.asarray(tokens[..., 1:], jnp.int32))
    return loss_fn, params, batches


def params_to_numpy(params) -> dict[str, object]:
    """Flat ``{'path/to/leaf': ndarray}`` of the nnx params (for the PyTorch twin)."""
    import jax
    import numpy as np

    flat = jax.tree_util.tree_leaves_with_path(params)
    out = {}
    for path, v in flat:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        out[name.removesuffix("/value")] = np.asarray(v)
    return out


# --------------------------------------------------------------------------- PyTorch twin


def torch_model(cfg: Config, weights: dict):
    """The same decoder in PyTorch, the same weights (copied from the nnx params)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def param(name):
        return nn.Parameter(torch.tensor(weights[name]))

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = param("wte/embedding")
            self.wpe = param("wpe/embedding")
            self.lnf_g, self.lnf_b = param("lnf/scale"), param("lnf/bias")
            self.blocks = nn.ModuleList()
            for layer in range(cfg.layers):
                block = nn.Module()
                for name in ("ln1/scale", "ln1/bias", "qkv/kernel", "qkv/bias", "proj/kernel",
                             "proj/bias", "ln2/scale", "ln2/bias", "fc/kernel", "fc/bias",
                             "out/kernel", "out/bias"):  # fmt: skip
                    value = torch.tensor(weights[f"blocks/{name}"][layer])
                    block.register_parameter(name.replace("/", "_"), nn.Parameter(value))
                self.blocks.append(block)
            mask = torch.tril(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool))
            self.register_buffer("mask", mask)

        def forward(self, tokens):
            def layer_norm(x, g, b):
                mu = x.mean(-1, keepdim=True)
                var = ((x - mu) ** 2).mean(-1, keepdim=True)
                return (x - mu) / torch.sqrt(var + LN_EPS) * g + b

            b, t = tokens.shape
            d, nh = cfg.dim, cfg.heads
            hd = d // nh
            x = self.wte[tokens] + self.wpe[:t][None]
            for blk in self.blocks:
                h = layer_norm(x, blk.ln1_scale, blk.ln1_bias) @ blk.qkv_kernel + blk.qkv_bias
                q, k, v = (a.reshape(b, t, nh, hd).transpose(1, 2) for a in h.split(d, dim=-1))
                scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~self.mask, -1e9)
                out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
                x = x + out @ blk.proj_kernel + blk.proj_bias
                h = layer_norm(x, blk.ln2_scale, blk.ln2_bias) @ blk.fc_kernel + blk.fc_bias
                x = x + F.gelu(h, approximate="tanh") @ blk.out_kernel + blk.out_bias
            return layer_norm(x, self.lnf_g, self.lnf_b) @ self.wte.T

    return Twin()


def torch_criterion(logits, targets):
    from torch.nn import functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def pyhessian_trace(model, inputs, targets, num_probes: int) -> float:
    """PyHessian's Hutchinson (``hessian(...).trace``: create_graph once, a backward per probe)."""
    from pyhessian import hessian

    for p in model.parameters():  # stale .grad would be added into the graph
        p.grad = None
    h = hessian(model, torch_criterion, data=(inputs, targets), cuda=inputs.device.type == "cuda")
    out = h.trace(maxIter=num_probes, tol=-float("inf"))  # tol=-inf: exactly maxIter probes
    for p in model.parameters():
        p.grad = None
    assert len(out) == num_probes
    return float(sum(out) / len(out))


# --------------------------------------------------------------------------- one job (child)


def _device_stats() -> dict | None:
    """``memory_stats()`` of JAX's first device on an accelerator; None on a CPU."""
    import jax

    if jax.default_backend() == "cpu":
        return None
    return jax.devices()[0].memory_stats() or None


def _peak_mb() -> float:
    """Peak memory of this process's work: the device's peak bytes in use on an accelerator,
    the process's peak RSS (``ru_maxrss``) on a CPU."""
    stats = _device_stats()
    if stats and "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    """Memory in use now: device bytes in use on an accelerator, else this process's resident
    set size (``/proc/self/statm``, Linux)."""
    stats = _device_stats()
    if stats and "bytes_in_use" in stats:
        return stats["bytes_in_use"] / 2**20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _program(job: str, count: int, num_batches: int, loss_fn):
    """``(params, batches, key) -> result`` of one kernel, and its batch selection."""
    from kernels import (
        Perturbation,
        average_sharpness,
        dataset_hvp,
        dataset_loss,
        hessian_trace,
        hutchinson_trace,
        hvp,
        sharpness_decomposition,
        top_eigenvalues,
        worst_case_sharpness,
    )

    gauss, ball = Perturbation("gaussian", SIGMA), Perturbation("l2_ball", RADIUS)
    streamed = dataset_loss(loss_fn)
    programs = {
        "grad": lambda p, b, k: _value_and_grad(loss_fn)(p, b),
        "hessian_trace": lambda p, b, k: hessian_trace(loss_fn, p, b, k, num_samples=count),
        "top_eigenvalues": lambda p, b, k: top_eigenvalues(
            hvp(loss_fn, p, b), p, k, k=1, num_steps=count, linearize=True
        ),
        "average_sharpness": lambda p, b, k: average_sharpness(
            loss_fn, p, b, k, perturbation=gauss, num_samples=count
        ),
        "worst_case_sharpness": lambda p, b, k: worst_case_sharpness(
            loss_fn, p, b, k, perturbation=ball, num_steps=count
        ),
        "dataset_grad": lambda p, b, k: _value_and_grad(streamed)(p, b),
        "dataset_trace": lambda p, b, k: hutchinson_trace(
            dataset_hvp(loss_fn, p, b), p, k, num_samples=count
        ),
        "dataset_average_sharpness": lambda p, b, k: average_sharpness(
            streamed, p, b, k, perturbation=gauss, num_samples=count
        ),
        "dataset_worst_case_sharpness": lambda p, b, k: worst_case_sharpness(
            streamed, p, b, k, perturbation=ball, num_steps=count
        ),
        # variants of issue 22's choices (with --only, and in --costs)
        "hessian_trace_forms": lambda p, b, k: hutchinson_trace(
            hvp(loss_fn, p, b), p, k, num_samples=count, mode="forms"
        ),
        "hessian_trace_products": lambda p, b, k: hutchinson_trace(
            hvp(loss_fn, p, b), p, k, num_samples=count, mode="products"
        ),
        "top_eigenvalues_float16_basis": lambda p, b, k: top_eigenvalues(
            hvp(loss_fn, p, b), p, k, k=1, num_steps=count, basis_dtype="float16"
        ),
        "top_eigenvalues_recomputed": lambda p, b, k: top_eigenvalues(
            hvp(loss_fn, p, b), p, k, k=1, num_steps=count, linearize=False
        ),
        "decomposition_forms": lambda p, b, k: sharpness_decomposition(
            loss_fn,
            p,
            b,
            k,
            perturbation=gauss,
            num_samples=count,
            num_probes=count,
            mode="forms",
        ),
        "decomposition_products": lambda p, b, k: sharpness_decomposition(
            loss_fn,
            p,
            b,
            k,
            perturbation=gauss,
            num_samples=count,
            num_probes=count,
            mode="products",
        ),
    }
    return programs[job], job.startswith("dataset")


def _value_and_grad(fn):
    import jax

    return jax.value_and_grad(fn)


def _summary_value(out) -> dict:
    """A few scalars of a kernel's result (for the record; not timed)."""
    import jax
    import numpy as np

    if hasattr(out, "mean") and hasattr(out, "stderr"):
        return {"value": float(out.mean), "stderr": float(out.stderr)}
    if hasattr(out, "value"):  # WorstCase
        return {"value": float(out.value)}
    if isinstance(out, tuple):  # value_and_grad
        return {"value": float(out[0])}
    return {"value": [float(x) for x in np.ravel(jax.device_get(out))]}


class _RssSampler:
    """Samples this process's resident set size every ``period`` seconds in a thread (the
    compiled program runs with the GIL released), so a run's memory can be read over time."""

    def __init__(self, period: float = 0.05):
        import threading

        self.period, self.samples = period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - start, _rss_mb()))
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """Peak RSS over the run and the timeline thinned to at most 200 points (for the first
        vs second half of the run, :func:`_halves`, and the figure)."""
        if not self.samples:
            return {}
        step = max(1, len(self.samples) // 200)
        return {
            "rss_run_peak_mb": max(r for _, r in self.samples),
            "rss_timeline": [(round(t, 2), round(r)) for t, r in self.samples[::step]],
        }


def _compile(fn, params, data, key) -> tuple[object, dict]:
    """Compile ahead of time: the executable, its compile time and XLA's temporaries."""
    import jax

    from bench._reference import xla_costs

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(params, data, key).compile()
    rec = {"compile_s": time.perf_counter() - start}
    # XLA's allocation plan (temporaries beside arguments and outputs) and its cost analysis
    # (GFLOP and bytes accessed; a loop body counted once): load-independent evidence
    rec.update(xla_costs(compiled))
    return compiled, rec


def _run_once(fn, params, data, key) -> dict:
    """Compile ahead of time, run once (timed, RSS sampled), then read this process's peak."""
    import jax

    compiled, rec = _compile(fn, params, data, key)
    with _RssSampler() as sampler:
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(params, data, key))
        rec["run_s"] = time.perf_counter() - start
    rec["peak_rss_mb"] = _peak_mb()
    rec.update(sampler.summary())
    rec.update(_summary_value(out))
    return rec


def run_job(
    cfg: Config, job: str, variants: list[tuple[int, int]], grad_reps: int, weights: str | None
) -> dict:
    """Compile the kernel at each (count, num_batches); the last is run (timed, its RSS sampled
    over time, then the process's peak read), the others only compiled, for XLA's allocation
    plan at a smaller count or fewer batches (does memory depend on the count?). Then time
    ``grad_reps`` gradients of one batch in the same process (time ratios from one process)."""
    import jax

    start = time.perf_counter()
    loss_fn, params, batches = build_jax(cfg, weights=weights)
    key = jax.random.key(0)
    jax.block_until_ready((params, batches))
    rec = {"job": job, "setup_s": time.perf_counter() - start, "rss_after_setup_mb": _rss_mb()}
    dataset = job.startswith("dataset")
    runs = []
    for i, (count, num_batches) in enumerate(variants):
        fn, _ = _program(job, count, num_batches, loss_fn)
        data = jax.tree_util.tree_map(
            (lambda a, n=num_batches: a[:n]) if dataset else (lambda a: a[0]), batches
        )
        if i < len(variants) - 1:
            run = {**_compile(fn, params, data, key)[1], "compile_only": True}
        else:
            run = _run_once(fn, params, data, key)
        runs.append({"count": count, "num_batches": num_batches, **run})
    rec["runs"] = runs
    if grad_reps:  # the one-batch gradient, timed in the kernel's own process
        fn, _ = _program("grad", 0, 1, loss_fn)
        data = jax.tree_util.tree_map(lambda a: a[0], batches)
        rec["grad_s"], rec["grad_all_s"] = _time_grad(fn, params, data, key, grad_reps)
    return rec


def _time_grad(fn, params, data, key, reps: int) -> tuple[float, list[float]]:
    """Median seconds of ``reps`` calls of the compiled gradient (no warm-up call, like the
    kernels' single timed run: both are compiled ahead of time)."""
    import jax

    grad = jax.jit(fn).lower(params, data, key).compile()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(grad(params, data, key))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), [round(t, 4) for t in times]


def run_torch(cfg: Config, num_probes: int, grad_reps: int, weights: str | None) -> dict:
    """PyTorch twin: one backward (median) and PyHessian's trace loop, same weights and batch."""
    import numpy as np
    import torch

    from bench._reference import torch_device, torch_sync

    torch.set_num_threads(2)
    start = time.perf_counter()
    _, params, batches = build_jax(cfg, weights=weights)
    device = torch_device()  # "cuda" when PyTorch sees a GPU
    model = torch_model(cfg, params_to_numpy(params)).to(device)
    del params
    inputs, targets = (torch.as_tensor(np.array(a[0])).long().to(device) for a in batches)
    rec = {"job": "torch_pyhessian", "count": num_probes, "setup_s": time.perf_counter() - start}
    times = []
    for _ in range(grad_reps + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = torch_criterion(model(inputs), targets)
        loss.backward()
        torch_sync(device)
        times.append(time.perf_counter() - t0)
    rec["loss"] = float(loss.detach())
    rec["grad_s"] = statistics.median(times[1:])
    rec["grad_all_s"] = [round(t, 4) for t in times[1:]]
    start = time.perf_counter()
    rec["value"] = pyhessian_trace(model, inputs, targets, num_probes)
    torch_sync(device)
    rec["run_s"] = time.perf_counter() - start
    if device == "cuda":
        rec["peak_rss_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        rec["peak_rss_mb"] = _peak_mb()
    rec["device"] = device
    return rec


# --------------------------------------------------------------------------- parent


def plan() -> list[tuple[str, list[tuple[int, int]]]]:
    """(job, [(count, num_batches), ...]): the measured run last, compile-only twins before it.

    Ordered by importance (a run cut short still has the single-batch kernels). The twins are
    only compiled, and only with ``--twins`` (XLA's allocation plan at a smaller count or 2
    batches); growth during the measured run itself is read from its RSS timeline. The
    dataset-level runs use the kernels' minimum count (2 probes / 2 antithetic pairs): over 16
    batches one probe is 16 quadratic forms. ``dataset_grad`` and
    ``dataset_worst_case_sharpness`` run only with ``--only``.
    """
    nb = 16
    return [
        ("grad", [(0, 1)]),
        ("hessian_trace", [(2, 1), (8, 1)]),
        ("average_sharpness", [(2, 1), (16, 1)]),
        ("worst_case_sharpness", [(1, 1), (5, 1)]),
        ("torch_pyhessian", [(2, 1)]),
        ("top_eigenvalues", [(3, 1), (10, 1)]),
        ("top_eigenvalues_recomputed", [(3, 1), (10, 1)]),
        ("dataset_average_sharpness", [(2, 2), (2, nb)]),
        ("dataset_trace", [(2, 2), (2, nb)]),
    ]


_MIN_GRAD_REPS = {"grad": 3, "torch_pyhessian": 2}  # timed gradients (torch: after a warm-up)

OPTIONAL = {  # run only when named with --only
    "dataset_grad": [(0, 16)],
    "dataset_worst_case_sharpness": [(1, 2), (1, 16)],
    "hessian_trace_forms": [(2, 1), (8, 1)],
    "hessian_trace_products": [(2, 1), (8, 1)],
    "top_eigenvalues_float16_basis": [(3, 1), (10, 1)],
    "decomposition_forms": [(2, 1), (4, 1)],
    "decomposition_products": [(2, 1), (4, 1)],
}


def child(args) -> dict:
    cfg = config(args)
    weights = None
    if args.cache:  # shared by the jobs of one run: the weights and compiled programs
        import jax

        weights = os.path.join(args.cache, "weights.npz")
        jax.config.update("jax_compilation_cache_dir", os.path.join(args.cache, "xla"))
    if args.job == "torch_pyhessian":
        return run_torch(cfg, json.loads(args.variants)[0][0], args.grad_reps, weights)
    return run_job(cfg, args.job, json.loads(args.variants), args.grad_reps, weights)


def spawn(args, job: str, variants: list[tuple[int, int]]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--job", job, "--variants",
           json.dumps(variants), "--grad-reps",
           str(max(_MIN_GRAD_REPS.get(job, 0), args.grad_reps))]  # fmt: skip
    if args.quick:
        cmd.append("--quick")
    if args.mid:
        cmd.append("--mid")
    if args.cache:
        cmd += ["--cache", args.cache]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monitor = quiet.Monitor()
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:  # report and go on: the other jobs still measure something
        sys.stderr.write(proc.stderr[-4000:])
        emit({"record": "failed", "job": job, "variants": variants, "rc": proc.returncode})
        return None
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["wall_s"] = time.perf_counter() - start
    # CPU seconds of the child (user + sys): on a shared machine wall time is inflated by the
    # other processes, CPU time much less (quiet-machine wall ~ cpu_s / 2 on 2 cores)
    rec["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rec["load_avg_1min"] = os.getloadavg()[0]
    rec["conditions"] = monitor.stop().to_dict()
    emit({"record": "job", **rec})
    with open(_stem(args.quick, bool(args.only), args.mid, args.out) + ".jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


UNITS = {  # what one "count" is, and how many gradient-equivalents the kernel calls it
    "hessian_trace": "probe",
    "top_eigenvalues": "Lanczos step",
    "top_eigenvalues_recomputed": "Lanczos step (products recomputed, linearize=False)",
    "average_sharpness": "antithetic pair (2 forwards)",
    "worst_case_sharpness": "ascent step (value and grad; steps + 1 in all)",
    "dataset_trace": "probe over all batches",
    "dataset_average_sharpness": "antithetic pair over all batches",
    "dataset_worst_case_sharpness": "ascent step over all batches (steps + 1 in all)",
    "hessian_trace_forms": "probe (quadratic forms)",
    "hessian_trace_products": "probe (linearised products)",
    "top_eigenvalues_float16_basis": "Lanczos step (float16 basis)",
    "decomposition_forms": "pair or probe (quadratic forms)",
    "decomposition_products": "pair or probe (linearised products)",
    "torch_pyhessian": "probe (PyHessian, incl. its create_graph setup)",
}


def _per_unit(job: str, count: int) -> int:
    if "decomposition" in job:
        return 2 * count  # count pairs and count probes
    return count + 1 if "worst_case" in job else count


def summarize(recs: list[dict]) -> dict:
    by = {r["job"]: r for r in recs}
    grad = by["grad"]["runs"][-1]
    rows = []
    for job in UNITS:
        if job == "torch_pyhessian" or job not in by:
            continue
        rec = by[job]
        main, twins = rec["runs"][-1], rec["runs"][:-1]
        dataset = job.startswith("dataset")
        count, nb = main["count"], main["num_batches"]
        # time base: gradients of one batch timed in the job's own process, times the batches
        grad_s = rec.get("grad_s", by["grad"]["grad_s"]) * (nb if dataset else 1)
        rows.append({
            "job": job,
            "count": count,
            "unit": UNITS[job],
            "num_batches": nb,
            "run_s": main["run_s"],
            "compile_s": main["compile_s"],
            "grad_s": grad_s,
            "per_unit_over_grad": main["run_s"] / _per_unit(job, count) / grad_s,
            "peak_rss_mb": main["peak_rss_mb"],
            "peak_over_grad_peak": main["peak_rss_mb"] / grad["peak_rss_mb"],
            **_halves(main.get("rss_timeline")),
            "rss_timeline": main.get("rss_timeline"),
            "value": main.get("value"),
            "stderr": main.get("stderr"),
            "xla_temp_mb": main.get("xla_temp_mb"),
            "job_wall_s": rec.get("wall_s"),
            "job_cpu_s": rec.get("cpu_s"),
            "memory_twins": [
                {k: t.get(k) for k in ("count", "num_batches", "peak_rss_mb", "xla_temp_mb")}
                for t in twins
            ],
        })  # fmt: skip
    out = {
        "grad_s": by["grad"]["grad_s"],
        "grad_peak_rss_mb": grad["peak_rss_mb"],
        "grad_xla_temp_mb": grad.get("xla_temp_mb"),
        "rows": rows,
        "missing": [job for job, _ in plan() if job not in by],
        "jobs_wall_s": sum(r.get("wall_s", 0.0) for r in recs),
        "jobs_cpu_s": sum(r.get("cpu_s", 0.0) for r in recs),
    }
    if "dataset_grad" in by:
        dgrad = by["dataset_grad"]["runs"][-1]
        out.update(dataset_grad_s=dgrad["run_s"], dataset_grad_peak_rss_mb=dgrad["peak_rss_mb"])
    if "torch_pyhessian" not in by or "hessian_trace" not in by:
        return out
    torch = by["torch_pyhessian"]
    ours = next(r for r in rows if r["job"] == "hessian_trace")
    return {
        **out,
        "torch_grad_s": torch["grad_s"],
        "pyhessian_per_probe_s": torch["run_s"] / torch["count"],
        "pyhessian_trace": torch["value"],
        "pyhessian_peak_rss_mb": torch["peak_rss_mb"],
        "ours_per_probe_s": ours["run_s"] / ours["count"],
        "pyhessian_per_probe_over_ours": (torch["run_s"] / torch["count"])
        / (ours["run_s"] / ours["count"]),
        # each over its own framework's gradient, measured in its own process: robust to the
        # load changing between the two processes
        "pyhessian_per_probe_over_torch_grad": torch["run_s"] / torch["count"] / torch["grad_s"],
        "ours_per_probe_over_jax_grad": ours["per_unit_over_grad"],
    }


def lanczos_basis_mb(num_steps: int, num_params: int, itemsize: int = 4) -> float:
    """MB of the Lanczos basis: ``num_steps`` stored rows of the parameters."""
    return num_steps * num_params * itemsize / 2**20


def _issue22(out: dict, rows: list[dict], grad: dict) -> dict:
    """Issue 22's ratios from a run's rows: time per unit and memory against one gradient."""
    by = {r["job"]: r for r in rows}
    res = {}
    targets = {"hessian_trace": 1.3, "top_eigenvalues": 1.3, "worst_case_sharpness": 1.1}
    for job, target in targets.items():
        if job in by:
            res[f"{job}_per_unit_over_grad"] = by[job]["per_unit_over_grad"]
            res[f"{job}_time_target"] = target
    if "worst_case_sharpness" in by:
        res["worst_case_sharpness_peak_over_grad_peak"] = by["worst_case_sharpness"][
            "peak_over_grad_peak"
        ]
        res["worst_case_sharpness_memory_target"] = 1.3
    if "top_eigenvalues_recomputed" in by:
        res["top_eigenvalues_recomputed_per_unit_over_grad"] = by["top_eigenvalues_recomputed"][
            "per_unit_over_grad"
        ]
    grad_temp = grad.get("xla_temp_mb")
    for job in ("top_eigenvalues", "top_eigenvalues_recomputed"):
        lanczos = by.get(job)
        if lanczos and lanczos.get("xla_temp_mb") is not None and grad_temp:
            basis = lanczos_basis_mb(lanczos["count"], out.get("num_params", 0))
            res[f"{job}_basis_mb"] = basis
            res[f"{job}_temp_beyond_basis_over_grad_temp"] = (
                lanczos["xla_temp_mb"] - basis
            ) / grad_temp
    if "top_eigenvalues_basis_mb" in res:
        res["top_eigenvalues_memory_target"] = "basis + 2 gradients"
    return res


def _halves(timeline: list | None) -> dict:
    """Peak RSS in the first and the second half of a run (from its sampled timeline): with
    memory independent of the count, the second half (later probes / samples / batches) needs
    no more than the first."""
    if not timeline:
        return {}
    mid = timeline[-1][0] / 2
    first = [r for t, r in timeline if t <= mid]
    second = [r for t, r in timeline if t > mid] or first
    return {"rss_first_half_mb": max(first), "rss_second_half_mb": max(second)}


def _memory_cell(r: dict) -> str:
    """XLA's temporaries at the smaller count / fewer batches vs the measured run, and the peak
    RSS in the first vs the second half of the run."""
    parts = [
        f"XLA temp {t['count']} x {t['num_batches']} b: {t['xla_temp_mb']:.0f} MB"
        for t in r["memory_twins"]
        if t.get("xla_temp_mb") is not None
    ]
    if r.get("xla_temp_mb") is not None:
        parts.append(f"measured: {r['xla_temp_mb']:.0f} MB")
    if r.get("rss_first_half_mb") is not None:
        parts.append(
            f"RSS peak 1st / 2nd half of the run {r['rss_first_half_mb']:.0f} / "
            f"{r['rss_second_half_mb']:.0f} MB"
        )
    return "; ".join(parts) or "-"


def markdown(summary: dict, cfg: Config, wall_s: float) -> str:
    lines = [
        f"{num_params(cfg):,} parameters, batches of {cfg.batch} x {cfg.seq} tokens, float32, "
        f"{summary.get('device', 'CPU')}; one gradient {summary['grad_s']:.2f} s (peak memory "
        "of a gradient-only process "
        f"{summary['grad_peak_rss_mb']:.0f} MB); whole run {wall_s / 60:.1f} min.",
        "",
        "| kernel | per unit / one gradient (target <= 1.3) | peak RSS / gradient's "
        "(target <= 2.0) | memory vs count (XLA plan; RSS over the run) | job wall / CPU |",
        "|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        nb = r["num_batches"]
        base = f"{nb} x {r['grad_s'] / nb:.2f} s" if nb > 1 else f"{r['grad_s']:.2f} s"
        lines.append(
            f"| `{r['job']}`, {r['count']} ({r['unit']}), {nb} batch(es) | "
            f"{r['run_s']:.1f} s / {_per_unit(r['job'], r['count'])} / {base} = "
            f"**{r['per_unit_over_grad']:.2f}** | {r['peak_rss_mb']:.0f} MB = "
            f"**{r['peak_over_grad_peak']:.2f}** | {_memory_cell(r)} | "
            f"{(r['job_wall_s'] or math.nan) / 60:.1f} / "
            f"{(r['job_cpu_s'] or math.nan) / 60:.1f} min |"
        )
    if summary.get("issue22"):
        lines += ["", "Issue 22's ratios: " + ", ".join(
            f"{k} = {v:.3g}" if isinstance(v, float) else f"{k} = {v}"
            for k, v in summary["issue22"].items()
        ) + "."]  # fmt: skip
    lines += [
        "",
        f"All jobs: wall {summary['jobs_wall_s'] / 60:.1f} min, CPU (user + sys of the child "
        f"processes) {summary['jobs_cpu_s'] / 60:.1f} min; on 2 free cores the wall time is "
        f"about CPU / 2 = {summary['jobs_cpu_s'] / 120:.1f} min.",
    ]
    if summary["missing"]:
        lines += ["", "Not measured in this run: " + ", ".join(summary["missing"]) + "."]
    if "torch_grad_s" not in summary:
        return "\n".join(lines)
    lines += [
        "",
        f"PyTorch twin: one backward {summary['torch_grad_s']:.2f} s; PyHessian trace per probe "
        f"{summary['pyhessian_per_probe_s']:.2f} s vs ours {summary['ours_per_probe_s']:.2f} s: "
        f"PyHessian / ours = **{summary['pyhessian_per_probe_over_ours']:.2f}**; each over its "
        f"own framework's gradient: PyHessian {summary['pyhessian_per_probe_over_torch_grad']:.2f}"
        f", ours {summary['ours_per_probe_over_jax_grad']:.2f} (traces: "
        f"PyHessian {summary['pyhessian_trace']:.4g}, ours "
        f"{summary['rows'][0]['value']:.4g} +- {summary['rows'][0]['stderr']:.2g}); PyHessian "
        f"process peak RSS {summary['pyhessian_peak_rss_mb']:.0f} MB.",
    ]
    return "\n".join(lines)


def figure(summary: dict, path: str) -> None:
    """RSS over time of each measured run (one panel per kernel), the gradient's peak marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in summary["rows"] if r.get("rss_timeline")]
    if not rows:
        return
    cols = min(4, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.8 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, rows, strict=False):
        t, rss = zip(*r["rss_timeline"], strict=True)
        ax.plot(t, [x / 1024 for x in rss], lw=1.2)
        ax.axhline(summary["grad_peak_rss_mb"] / 1024, color="k", ls="--", lw=0.8,
                   label="gradient's peak")  # fmt: skip
        ax.axhline(2 * summary["grad_peak_rss_mb"] / 1024, color="r", ls=":", lw=0.8,
                   label="2x (target)")  # fmt: skip
        ax.set_title(f"{r['job']} ({r['count']}, {r['num_batches']} b)", fontsize=8)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.set_ylabel("RSS (GB)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stem(quick: bool, partial: bool = False, mid: bool = False, out: str | None = None) -> str:
    """``bench/results/scale[_quick][_partial]``: runs with ``--only`` write their own files, so
    they never replace the records of a full run."""
    out = out or os.path.join(ROOT, "bench", "results")
    os.makedirs(out, exist_ok=True)
    name = "scale" + ("_quick" if quick else "") + ("_mid" if mid else "")
    name += "_partial" if partial else ""
    return os.path.join(out, name)


def main(argv: list[str] | None = None) -> dict | None:
    """Run the benchmark (see the module docstring); returns the summary of a run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model (seconds per job)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--variants", default="[[0, 1]]", help=argparse.SUPPRESS)
    parser.add_argument(
        "--grad-reps",
        type=int,
        default=1,
        help="timed one-batch gradients in each kernel's process (the grad job times >= 3)",
    )
    parser.add_argument(
        "--only",
        action="append",
        help="run only these jobs (and grad); records and tables go to scale[_quick]_partial.*",
    )
    parser.add_argument(
        "--summarize", action="store_true", help="only rebuild the tables from the .jsonl records"
    )
    parser.add_argument(
        "--twins",
        action="store_true",
        help="also compile each kernel at a smaller count / 2 batches for XLA's allocation plan "
        "(does memory depend on the count?); ~45 s more on the full model",
    )
    parser.add_argument(
        "--mid",
        action="store_true",
        help="the mid-size decoder (4 layers, d = 384, 26.4M parameters), e.g. with --costs",
    )
    parser.add_argument(
        "--costs",
        action="store_true",
        help="only compile each job's program (one process) and print XLA's cost and memory "
        "analysis against the gradient's: load-independent, minutes",
    )
    parser.add_argument("--cache", help=argparse.SUPPRESS)  # set by the parent for its children
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick and args.mid:
        parser.error("--quick and --mid: choose one size")
    if args.grad_reps < 0:
        parser.error(f"--grad-reps: expected an integer >= 0, got {args.grad_reps}")
    known = [job for job, _ in plan()] + list(OPTIONAL)
    for job in args.only or ():
        if job not in known:
            parser.error(f"--only: unknown job {job!r}; choose from {', '.join(known)}")
    if args.job:
        print(json.dumps(child(args)), flush=True)
        return None
    cfg = config(args)
    if args.costs:
        return costs_main(args, cfg)
    if args.summarize:
        path = _stem(args.quick, bool(args.only), args.mid, args.out) + ".jsonl"
        if not os.path.exists(path):
            parser.error(f"--summarize: no records at {path}; run the benchmark first")
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        if not any(r.get("job") == "grad" for r in recs):
            parser.error(f"--summarize: {path} has no 'grad' record (the base of every ratio)")
        return report(args, cfg, recs, sum(r["wall_s"] for r in recs))
    import jax

    emit({"record": "setup", "jax": jax.__version__, "cpu_count": os.cpu_count(),
          "load_avg_1min": os.getloadavg()[0], "quick": args.quick,
          "num_params": num_params(cfg), "config": dataclasses.asdict(cfg)})  # fmt: skip
    start = time.perf_counter()
    recs = []
    records = _stem(args.quick, bool(args.only), args.mid, args.out) + ".jsonl"
    if os.path.exists(records):  # a new run starts new records; the last run's are kept aside
        os.replace(records, records + ".prev")
    jobs = plan() + [(job, v) for job, v in OPTIONAL.items() if job in (args.only or ())]
    # one directory for the run: the model's weights, initialised by the first job and read by
    # the others, and XLA's compilation cache (the one-batch gradient that every job times is
    # compiled once); removed at the end, also when the run is interrupted
    with tempfile.TemporaryDirectory(prefix="jaxbounds-scale-") as cache:
        args.cache = cache
        for job, variants in jobs:
            if args.only and job not in args.only and job != "grad":
                continue
            rec = spawn(args, job, variants if args.twins else variants[-1:])
            if rec is not None:
                recs.append(rec)
    wall = time.perf_counter() - start
    if any(r["job"] == "grad" for r in recs):
        return report(args, cfg, recs, wall)
    return None


def report(args, cfg: Config, recs: list[dict], wall: float) -> dict:
    """Print and write the summary (JSON) and the markdown table."""
    summary = summarize(recs)
    summary.update(wall_s=wall, load_avg_1min_end=os.getloadavg()[0], quick=args.quick,
                   num_params=num_params(cfg))  # fmt: skip
    import jax

    summary["device"] = str(jax.devices()[0])
    grad_run = next(r for r in recs if r["job"] == "grad")["runs"][-1]
    summary["issue22"] = _issue22(summary, summary["rows"], grad_run)
    if "pyhessian_per_probe_over_ours" in summary:
        summary["issue22"]["pyhessian_per_probe_over_ours"] = summary[
            "pyhessian_per_probe_over_ours"
        ]
        summary["issue22"]["pyhessian_target"] = 3.0
    conditions = run_conditions(recs)
    summary["conditions"] = conditions.to_dict()
    emit({"record": "summary", **summary})
    table = markdown(summary, cfg, wall)
    print(table)
    stem = _stem(args.quick, bool(args.only), args.mid, args.out)
    section = quiet.Section(summary, table, recs)
    code = quiet.save(os.path.basename(stem), {"kernels": section}, conditions,
                      allow_load=args.allow_load, out=os.path.dirname(stem))  # fmt: skip
    if code:
        raise SystemExit(code)
    figure(summary, stem + "_memory.png")
    return summary


def run_conditions(recs: list[dict]):
    """The machine's conditions over a run's jobs (each job's record carries its own); records
    written before the jobs recorded them give only the load average at each job's end."""
    parts = [quiet.Conditions.from_dict(r["conditions"]) for r in recs if "conditions" in r]
    if len(parts) == len(recs):
        return quiet.combine(parts)
    first = recs[0].get("load_avg_1min", math.inf)
    load = (first, first)
    return quiet.Conditions(cpu_count=os.cpu_count(), wall_s=sum(r["wall_s"] for r in recs),
                            load_start=load, load_end=load, others_cores=None, own_cores=0.0,
                            machine=quiet.machine())  # fmt: skip


# --------------------------------------------------------------------------- --costs


def costs_main(args, cfg: Config) -> dict:
    """Compile every job's program at its measured count (and the gradient) in this process;
    print XLA's GFLOP, bytes accessed and temporaries against the gradient's (no run)."""
    import jax

    from bench._reference import xla_costs

    loss_fn, params, batches = build_jax(cfg)
    key = jax.random.key(0)
    n = num_params(cfg)
    jobs = [(job, v[-1]) for job, v in plan() if job != "torch_pyhessian"]
    jobs += [(job, v[-1]) for job, v in OPTIONAL.items() if job != "dataset_grad"]
    if args.only:
        jobs = [(job, v) for job, v in jobs if job in args.only or job == "grad"]
    rows = []
    for job, (count, num_batches) in jobs:
        fn, dataset = _program(job, count, num_batches, loss_fn)
        data = jax.tree_util.tree_map(
            (lambda a, nb=num_batches: a[:nb]) if dataset else (lambda a: a[0]), batches
        )
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(params, data, key).compile()
        row = {"job": job, "count": count, "num_batches": num_batches,
               "compile_s": time.perf_counter() - start, **xla_costs(compiled)}  # fmt: skip
        emit({"record": "costs", **row})
        rows.append(row)
    grad = rows[0]
    for row in rows[1:]:
        for field in ("gflop", "gb_accessed", "xla_temp_mb"):
            if row.get(field) is not None and grad.get(field):
                row[f"{field}_over_grad"] = row[field] / grad[field]
        if row["job"].startswith("top_eigenvalues") and row.get("xla_temp_mb") is not None:
            itemsize = 2 if "float16" in row["job"] else 4
            basis = lanczos_basis_mb(row["count"], n, itemsize)
            row["basis_mb"] = basis
            row["temp_beyond_basis_over_grad"] = (row["xla_temp_mb"] - basis) / grad["xla_temp_mb"]
    lines = [
        f"XLA's analysis of each compiled program, {n:,} parameters, batches of {cfg.batch} x "
        f"{cfg.seq}, {jax.default_backend()}; a loop body is counted once, so a program's "
        "figures are its setup plus one iteration (one probe, step or pair).",
        "",
        "| program | count | GFLOP / gradient's | GB accessed / gradient's | temporaries MB "
        "(/ gradient's) |",
        "|---|---|---|---|---|",
        f"| gradient | 1 | {grad.get('gflop', 0):.1f} GFLOP | {grad.get('gb_accessed', 0):.2f} GB "
        f"| {grad.get('xla_temp_mb', 0):.0f} |",
    ]
    for row in rows[1:]:
        extra = ""
        if "basis_mb" in row:
            extra = (f"; basis {row['basis_mb']:.0f} MB, beyond it "
                     f"{row['temp_beyond_basis_over_grad']:.2f} gradients")  # fmt: skip
        lines.append(
            f"| `{row['job']}` | {row['count']} x {row['num_batches']} b | "
            f"{row.get('gflop_over_grad', math.nan):.2f} | "
            f"{row.get('gb_accessed_over_grad', math.nan):.2f} | "
            f"{row.get('xla_temp_mb', math.nan):.0f} "
            f"({row.get('xla_temp_mb_over_grad', math.nan):.2f}){extra} |"
        )
    table = "\n".join(lines)
    print(table)
    stem = _stem(args.quick, bool(args.only), args.mid, args.out) + "_costs"
    with open(stem + ".json", "w") as f:
        json.dump({"rows": rows, "num_params": n, "config": dataclasses.asdict(cfg)}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    return {"rows": rows}


if __name__ == "__main__":
    main()
