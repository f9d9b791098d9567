"""Benchmark of the Gauss-Newton and Fisher operators (kernels/gauss_newton.py).

Two parts, each printing one JSON record per measurement and, at the end, a JSON summary of the
ratios against the goals of the issue:

- ``speed`` (the 54k reference Transformer of bench/_reference.py, CPU, float32, batch 256 x 32,
  vocabulary 16): one jitted gradient is the unit. Measured, interleaved (A B A B ...), medians:

  * a GGN Hutchinson probe: ``hutchinson_trace(ggn(...), num_samples=P)`` over P (each probe one
    forward-mode quadratic form; goal <= 0.8 gradients);
  * a GGN matrix-vector product ``ggn(...)(v)`` jitted alone (linearisation included: a forward
    pass, the tangent pass and its transpose; goal <= 1.5 gradients), and the same product
    amortised inside one program of 16 products (the operator linearised once, as Lanczos and
    Hutch++ use it); XLA's flop counts of these programs over the gradient's (load-free: a
    dense layer's tangent and its transpose are two matmuls each, so the product alone is
    about 5/3 of a gradient's flops, 4/3 once linearised);
  * curvlinops-for-pytorch's ``GGNLinearOperator @ v`` on the PyTorch twin with the same
    weights and batch (goal: ours >= 2x faster per product), after checking that both products
    agree to float32 precision;
  * for reference, the empirical-Fisher product and the exact empirical-Fisher trace (per-example
    gradients, 64 examples at a time) in gradients.

- ``memory`` (bench/scale.py's decoder: 12 layers, d = 768, vocabulary 50,257, 124M parameters,
  batch 4 x 128; ``--quick``: its 2-layer d = 64 vocabulary-512 twin): XLA's allocation plan of
  compiled programs (``memory_analysis()``; nothing runs, the parameters are abstract), so the
  numbers do not depend on the machine's load:

  * peak = arguments + outputs + temporaries - aliased bytes of a gradient, of one GGN quadratic
    form ``ggn(...).form(v)`` and of Hutchinson on the GGN (goal: form <= 1.5x the gradient);
  * Hutchinson's temporaries at 2 and at 64 probes (goal: equal: memory does not grow with
    probes).

Run:  .venv/bin/python bench/gauss_newton.py            (both parts; the memory part compiles
                                                         the 124M programs: minutes)
      .venv/bin/python bench/gauss_newton.py --quick    (fewer repeats, the small decoder)
      .venv/bin/python bench/gauss_newton.py --only speed
Needs the ``bench`` extra (torch, curvlinops-for-pytorch).

Writes each part's records, conditions and table to ``bench/results/gauss_newton[_quick].json``
and its tables to ``.md`` through the quiet-machine guard (``bench/_quiet.py``): the timed part
only on a quiet machine unless ``--allow-load``; the memory part (load-free) always.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from bench import _quiet as quiet
from bench import _reference as ref
from kernels.curvature import hutchinson_trace
from kernels.gauss_newton import empirical_fisher, empirical_fisher_trace, ggn

_RECORDS: list[dict] = []  # every record this run printed, for the results file


def emit(record: dict) -> None:
    _RECORDS.append(record)
    print(json.dumps(record), flush=True)


def timed(fn, *args):
    """Seconds for one call, blocking on JAX results."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


# --------------------------------------------------------------------------- 54k: JAX


def jax_logits(params, inputs):
    """The reference model's logits (B, T, V): ``ref.jax_loss`` without its loss."""

    def layer_norm(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + ref.LN_EPS) * g + b

    p = params
    x = p["embed"][inputs] + p["pos"][None]
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    hd = ref.DIM // ref.HEADS
    batch = inputs.shape[0]

    def heads(w):
        return (h @ w).reshape(batch, ref.SEQ, ref.HEADS, hd).transpose(0, 2, 1, 3)

    q, k, v = heads(p["wq"]), heads(p["wk"]), heads(p["wv"])
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((ref.SEQ, ref.SEQ), dtype=bool))
    scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
    attn = jax.nn.softmax(scores, axis=-1)
    out = (attn @ v).transpose(0, 2, 1, 3).reshape(batch, ref.SEQ, ref.DIM)
    x = x + out @ p["wo"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    x = x + jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=True) @ p["w2"] + p["b2"]
    return layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["wout"] + p["bout"]


def jax_inputs():
    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    inputs, targets = (jnp.asarray(a, dtype=jnp.int32) for a in ref.make_batch())
    return params, inputs, targets


@jax.jit
def jax_grad(params, inputs, targets):
    return jax.grad(ref.jax_loss)(params, inputs, targets)


@partial(jax.jit, static_argnames=("num_probes",))
def ggn_hutchinson(params, inputs, targets, key, *, num_probes):
    op = ggn(jax_logits, params, (inputs, targets), loss="cross_entropy")
    return hutchinson_trace(op, params, key, num_samples=num_probes)


@jax.jit
def ggn_product(params, inputs, targets, v):
    return ggn(jax_logits, params, (inputs, targets), loss="cross_entropy")(v)


@partial(jax.jit, static_argnames=("num",))
def ggn_products(params, inputs, targets, vs, *, num):
    """``num`` products of the operator linearised once (a sequential loop, as Lanczos runs)."""
    product, _ = ggn(jax_logits, params, (inputs, targets), loss="cross_entropy").linearize()
    return jax.lax.map(product, vs)


@jax.jit
def ef_product(params, inputs, targets, v):
    return empirical_fisher(jax_logits, params, (inputs, targets), loss="cross_entropy")(v)


@jax.jit
def ef_trace(params, inputs, targets):
    return empirical_fisher_trace(jax_logits, params, (inputs, targets), loss="cross_entropy",
                                  example_chunk_size=64)  # fmt: skip


# --------------------------------------------------------------------------- 54k: PyTorch


def curvlinops_setup():
    import torch
    from curvlinops import GGNLinearOperator

    torch.manual_seed(0)
    model = ref.torch_model(ref.init_params())

    class Flat(torch.nn.Module):
        """Logits (B*T, V) for ``nn.CrossEntropyLoss`` (mean over all positions, as ours)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, inputs):
            return self.inner(inputs).reshape(-1, ref.VOCAB)

    inputs, targets = (torch.as_tensor(a) for a in ref.make_batch())
    params = [p for p in model.parameters() if p.requires_grad]
    op = GGNLinearOperator(
        Flat(model), torch.nn.CrossEntropyLoss(), params, [(inputs, targets.reshape(-1))],
        check_deterministic=False,
    )  # fmt: skip
    return op, model, inputs, targets


def torch_grad(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    ref.torch_criterion(model(inputs), targets).backward()
    return model.wq.grad


def flat_vector(seed=2):
    rng = np.random.default_rng(seed)
    return {n: rng.choice([-1.0, 1.0], size=s).astype(np.float32) for n, s in ref.SHAPES}


def flop_ratios(params, inputs, targets, v) -> dict:
    """XLA's flop counts (``cost_analysis``) of the programs over the gradient's: load-free."""

    def flops(fn, *fargs):
        cost = jax.jit(fn).lower(*fargs).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return float(cost["flops"])

    def form(p, x, y, v):
        return ggn(jax_logits, p, (x, y), loss="cross_entropy").form(v)

    grad = flops(jax_grad, params, inputs, targets)
    forward = flops(jax_logits, params, inputs)
    product = flops(ggn_product, params, inputs, targets, v)
    out = {
        "flops_gradient": grad,
        "flops_ggn_form_over_grad": flops(form, params, inputs, targets, v) / grad,
        "flops_ggn_product_over_grad": product / grad,
        "flops_ggn_product_linearised_over_grad": (product - forward) / grad,
    }
    emit({"record": "flop_ratios", **out})
    return out


def bench_speed(args) -> dict:
    import torch

    torch.set_num_threads(2)
    params, inputs, targets = jax_inputs()
    # the duplicated forward pass is the reference model: same loss to float32 rounding
    logp = jax.nn.log_softmax(jax_logits(params, inputs), axis=-1)
    ours_loss = -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
    ref_loss = ref.jax_loss(params, inputs, targets)
    assert abs(float(ours_loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    v_np = flat_vector()
    v = {n: jnp.asarray(a) for n, a in v_np.items()}
    key = jax.random.key(0)
    probes, num = args.probes, args.amortised
    vs = jax.tree_util.tree_map(lambda a: jnp.stack([a] * num), v)
    op, model, t_inputs, t_targets = curvlinops_setup()
    v_torch = torch.cat([torch.as_tensor(v_np[n]).reshape(-1) for n, _ in ref.SHAPES])

    # agreement of the two products (float32), against a float64 JAX product
    ours = ggn_product(params, inputs, targets, v)
    ours = np.concatenate([np.asarray(ours[n], np.float64).ravel() for n, _ in ref.SHAPES])
    theirs = (op @ v_torch).detach().double().numpy()
    with jax.enable_x64(True):
        p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params)
        v64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), v)
        exact = ggn(jax_logits, p64, (inputs, targets), loss="cross_entropy")(v64)
        exact = np.concatenate([np.asarray(exact[n]).ravel() for n, _ in ref.SHAPES])

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    agreement = {
        "ours32_vs_jax64": rel(ours, exact),
        "curvlinops32_vs_jax64": rel(theirs, exact),
        "ours32_vs_curvlinops32": rel(ours, theirs),
    }
    emit({"record": "ggn_product_agreement_rel_l2", **agreement})
    flop = flop_ratios(params, inputs, targets, v)

    compile_s = {}
    for name, fn, fargs in [
        ("jax_grad", jax_grad, (params, inputs, targets)),
        ("ggn_hutchinson", partial(ggn_hutchinson, num_probes=probes),
         (params, inputs, targets, key)),
        ("ggn_product", ggn_product, (params, inputs, targets, v)),
        ("ggn_products", partial(ggn_products, num=num), (params, inputs, targets, vs)),
        ("ef_product", ef_product, (params, inputs, targets, v)),
        ("ef_trace", ef_trace, (params, inputs, targets)),
    ]:  # fmt: skip
        compile_s[name] = timed(fn, *fargs)
    emit({"record": "compile_and_first_call_s", **compile_s})
    torch_grad(model, t_inputs, t_targets)
    op @ v_torch

    names = ("jax_grad", "torch_grad", "ggn_hutchinson", "ggn_product", "ggn_products",
             "curvlinops_product", "ef_product", "ef_trace")  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(args.reps):
        k = jax.random.fold_in(key, rep + 1)
        # PyTorch first, then a pause so its spinning OpenMP threads park before XLA runs
        start = time.perf_counter()
        torch_grad(model, t_inputs, t_targets)
        times["torch_grad"].append(time.perf_counter() - start)
        start = time.perf_counter()
        op @ v_torch
        times["curvlinops_product"].append(time.perf_counter() - start)
        time.sleep(0.5)
        times["jax_grad"].append(
            statistics.median(timed(jax_grad, params, inputs, targets) for _ in range(3))
        )
        times["ggn_hutchinson"].append(
            timed(partial(ggn_hutchinson, num_probes=probes), params, inputs, targets, k)
        )
        times["ggn_product"].append(timed(ggn_product, params, inputs, targets, v))
        times["ggn_products"].append(
            timed(partial(ggn_products, num=num), params, inputs, targets, vs)
        )
        times["ef_product"].append(timed(ef_product, params, inputs, targets, v))
        times["ef_trace"].append(timed(ef_trace, params, inputs, targets))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        emit({"record": "time_s", "variant": k, "median": med[k], "all": [round(x, 4) for x in v]})
    grad = med["jax_grad"]
    est = ggn_hutchinson(params, inputs, targets, key, num_probes=probes)
    out = {
        "num_params": ref.num_params(),
        "jax_grad_ms": 1e3 * grad,
        "torch_grad_ms": 1e3 * med["torch_grad"],
        "ggn_trace": float(est.mean),
        "ggn_trace_stderr": float(est.stderr),
        "hutchinson_probes": probes,
        "ggn_probe_over_grad": med["ggn_hutchinson"] / probes / grad,
        "ggn_product_over_grad": med["ggn_product"] / grad,
        "ggn_product_amortised_over_grad": med["ggn_products"] / num / grad,
        "amortised_products": num,
        "ggn_product_ms": 1e3 * med["ggn_product"],
        "curvlinops_product_ms": 1e3 * med["curvlinops_product"],
        "curvlinops_over_ours_product": med["curvlinops_product"] / med["ggn_product"],
        "ef_product_over_grad": med["ef_product"] / grad,
        "ef_trace_over_grad": med["ef_trace"] / grad,
        **{f"agreement_{k}": v for k, v in agreement.items()},
        **flop,
    }
    out["goal_probe_le_0.8"] = out["ggn_probe_over_grad"] <= 0.8
    out["goal_product_le_1.5"] = out["ggn_product_over_grad"] <= 1.5
    out["goal_curvlinops_ge_2"] = out["curvlinops_over_ours_product"] >= 2.0
    return out


# --------------------------------------------------------------------------- 124M: memory


def decoder(cfg):
    """``(apply_fn, abstract params)`` of bench/scale.py's decoder (its architecture, verbatim).

    Built with ``nnx.eval_shape``: the parameters are ``ShapeDtypeStruct`` leaves, nothing is
    allocated. ``tests`` of the equivalence: :func:`check_decoder` (quick configuration).
    """
    from flax import nnx

    init = nnx.initializers.normal(0.02)
    init_out = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.layers))

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            d, h = cfg.dim, cfg.hidden
            self.ln1 = nnx.LayerNorm(d, epsilon=ref.LN_EPS, rngs=rngs)
            self.qkv = nnx.Linear(d, 3 * d, kernel_init=init, rngs=rngs)
            self.proj = nnx.Linear(d, d, kernel_init=init_out, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, epsilon=ref.LN_EPS, rngs=rngs)
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
            self.blocks = nnx.merge(blocks[0][0], stacked)
            self.lnf = nnx.LayerNorm(cfg.dim, epsilon=ref.LN_EPS, rngs=rngs)

        def __call__(self, tokens):
            x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))[None]
            graphdef, state = nnx.split(self.blocks)
            x = jax.lax.scan(lambda x, s: (nnx.merge(graphdef, s)(x), None), x, state)[0]
            return self.wte.attend(self.lnf(x))

    graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(nnx.Rngs(0))), nnx.Param)

    def apply_fn(params, tokens):
        return nnx.merge(graphdef, params)(tokens)

    return apply_fn, params


def check_decoder(cfg) -> float:
    """Our decoder's loss with bench/scale.py's weights equals its ``loss_fn`` (relative gap)."""
    from bench import scale

    loss_fn, params, batches = scale.build_jax(cfg)
    apply_fn, _ = decoder(cfg)
    batch = jax.tree_util.tree_map(lambda a: a[0], batches)
    logits = apply_fn(params, batch[0])
    logp = jax.nn.log_softmax(logits, axis=-1)
    ours = -jnp.mean(jnp.take_along_axis(logp, batch[1][..., None], axis=-1))
    theirs = loss_fn(params, batch)
    return abs(float(ours) - float(theirs)) / abs(float(theirs))


def memory_stats(fn, *args) -> dict:
    compiled = jax.jit(fn).lower(*args).compile()
    stats = compiled.memory_analysis()
    out = {
        "argument_mb": stats.argument_size_in_bytes / 2**20,
        "output_mb": stats.output_size_in_bytes / 2**20,
        "alias_mb": stats.alias_size_in_bytes / 2**20,
        "temp_mb": stats.temp_size_in_bytes / 2**20,
    }
    out["peak_mb"] = out["argument_mb"] + out["output_mb"] + out["temp_mb"] - out["alias_mb"]
    return out


def bench_memory(args) -> dict:
    from bench import scale

    cfg = scale.QUICK if args.quick else scale.FULL
    if args.quick:
        gap = check_decoder(cfg)
        emit({"record": "decoder_matches_scale_py", "relative_loss_gap": gap})
        assert gap < 1e-5, gap
    apply_fn, params = decoder(cfg)
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    key = jax.random.key(0)
    num_params = sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params))

    def loss(p, inputs, targets):
        logp = jax.nn.log_softmax(apply_fn(p, inputs), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    def grad(p, inputs, targets):
        return jax.grad(loss)(p, inputs, targets)

    def form(p, inputs, targets, v):
        return ggn(apply_fn, p, (inputs, targets), loss="cross_entropy").form(v)

    def hutchinson(p, inputs, targets, k, num_probes):
        op = ggn(apply_fn, p, (inputs, targets), loss="cross_entropy")
        return hutchinson_trace(op, p, k, num_samples=num_probes).mean

    records = {}
    for name, fn, fargs in [
        ("gradient", grad, (params, tokens, tokens)),
        ("ggn_form", form, (params, tokens, tokens, params)),
        ("ggn_hutchinson_2", partial(hutchinson, num_probes=2), (params, tokens, tokens, key)),
        ("ggn_hutchinson_64", partial(hutchinson, num_probes=64), (params, tokens, tokens, key)),
    ]:
        start = time.perf_counter()
        rec = memory_stats(fn, *fargs)
        rec["compile_s"] = time.perf_counter() - start
        records[name] = rec
        emit({"record": "memory_analysis", "program": name, **rec})
    g = records["gradient"]
    out = {
        "decoder_params": num_params,
        "decoder_vocab": cfg.vocab,
        "gradient_peak_mb": g["peak_mb"],
        "ggn_form_peak_mb": records["ggn_form"]["peak_mb"],
        "ggn_form_over_gradient_peak": records["ggn_form"]["peak_mb"] / g["peak_mb"],
        "ggn_hutchinson_peak_over_gradient": records["ggn_hutchinson_64"]["peak_mb"] / g["peak_mb"],
        "ggn_hutchinson_temp_mb_2_probes": records["ggn_hutchinson_2"]["temp_mb"],
        "ggn_hutchinson_temp_mb_64_probes": records["ggn_hutchinson_64"]["temp_mb"],
    }
    out["goal_form_peak_le_1.5"] = out["ggn_form_over_gradient_peak"] <= 1.5
    out["goal_no_growth_with_probes"] = (
        records["ggn_hutchinson_64"]["temp_mb"] <= records["ggn_hutchinson_2"]["temp_mb"]
    )
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def speed_table(s: dict) -> str:
    """The speed part's table (54k reference Transformer, CPU)."""
    return "\n".join([
        "| measure (54k reference Transformer) | goal | measured | XLA flops / gradient's "
        "(load-free) |",
        "|---|---|---|---|",
        f"| GGN Hutchinson probe / gradient ({s['hutchinson_probes']} probes) | <= 0.8 | "
        f"**{s['ggn_probe_over_grad']:.2f}**, {_met(s['goal_probe_le_0.8'])} | "
        f"{s['flops_ggn_form_over_grad']:.2f} |",
        f"| GGN product, linearisation included / gradient | <= 1.5 | "
        f"**{s['ggn_product_over_grad']:.2f}**, {_met(s['goal_product_le_1.5'])} | "
        f"{s['flops_ggn_product_over_grad']:.2f} |",
        f"| GGN product inside a program of {s['amortised_products']} (linearised once) / "
        f"gradient | | {s['ggn_product_amortised_over_grad']:.2f} | "
        f"{s['flops_ggn_product_linearised_over_grad']:.2f} |",
        f"| curvlinops-for-pytorch product / ours | >= 2 | {s['curvlinops_product_ms']:.1f} / "
        f"{s['ggn_product_ms']:.1f} ms = **{s['curvlinops_over_ours_product']:.2f}**, "
        f"{_met(s['goal_curvlinops_ge_2'])} | |",
        f"| one JAX gradient (jitted) / one PyTorch `backward` | | {s['jax_grad_ms']:.1f} / "
        f"{s['torch_grad_ms']:.1f} ms | |",
        f"| ours vs curvlinops product, relative l2 difference (float32) | | "
        f"{s['agreement_ours32_vs_curvlinops32']:.1e} (from a float64 product: ours "
        f"{s['agreement_ours32_vs_jax64']:.1e}, curvlinops "
        f"{s['agreement_curvlinops32_vs_jax64']:.1e}) | |",
        f"| empirical Fisher product / gradient | | {s['ef_product_over_grad']:.2f} | |",
        f"| exact empirical Fisher trace (per-example gradients) / gradient | | "
        f"{s['ef_trace_over_grad']:.2f} | |",
    ])  # fmt: skip


def memory_table(s: dict) -> str:
    """The memory part's table (XLA's allocation plan of bench/scale.py's decoder)."""
    g = s["gradient_peak_mb"]
    return "\n".join([
        f"| measure ({s['decoder_params']:,} parameters, vocabulary {s['decoder_vocab']:,}) | "
        "goal | XLA's allocation plan |",
        "|---|---|---|",
        f"| GGN quadratic form peak / gradient peak | <= 1.5 | {s['ggn_form_peak_mb']:,.0f} / "
        f"{g:,.0f} MB = **{s['ggn_form_over_gradient_peak']:.2f}**, "
        f"{_met(s['goal_form_peak_le_1.5'])} |",
        f"| Hutchinson on the GGN (64 probes): peak / gradient peak | | "
        f"{s['ggn_hutchinson_peak_over_gradient']:.2f} |",
        f"| Hutchinson temporaries at 2 and at 64 probes | equal | "
        f"{s['ggn_hutchinson_temp_mb_2_probes']:,.0f} MB and "
        f"{s['ggn_hutchinson_temp_mb_64_probes']:,.0f} MB, "
        f"{_met(s['goal_no_growth_with_probes'])} |",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, the small decoder")
    parser.add_argument("--only", choices=["speed", "memory"], action="append")
    quiet.add_arguments(parser)
    args = parser.parse_args()
    monitor = quiet.Monitor()
    args.reps = 3 if args.quick else 7
    args.probes = 16 if args.quick else 64
    args.amortised = 16
    sections = args.only or ["speed", "memory"]
    emit(
        {
            "record": "setup",
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "cpu_count": os.cpu_count(),
            "load_avg_1min": os.getloadavg()[0],
            "quick": args.quick,
        }
    )
    summary, parts = {}, {}
    if "speed" in sections:
        start = len(_RECORDS)
        speed = bench_speed(args)
        summary.update(speed)
        parts["speed"] = quiet.Section(speed, speed_table(speed), _RECORDS[start:])
    if "memory" in sections:
        start = len(_RECORDS)
        memory = bench_memory(args)
        summary.update(memory)
        parts["memory"] = quiet.Section(memory, memory_table(memory), _RECORDS[start:],
                                        timed=False)  # fmt: skip
    summary["load_avg_1min_end"] = os.getloadavg()[0]
    conditions = monitor.stop()
    summary["conditions"] = conditions.to_dict()
    print(json.dumps({"record": "summary", **summary}, indent=1), flush=True)
    for part in parts.values():
        print(part.table, flush=True)
    quiet.finish("gauss_newton", parts, conditions, args)


if __name__ == "__main__":
    main()
