"""Where a JAX gradient loses to PyTorch's on a CPU: the 54k reference model, a mid-size decoder.

Every kernel of the project is measured in gradients, so on a CPU the whole engine inherits the
gradient's gap to PyTorch. This script times, interleaved in one process (A B A B ..., medians),
one jitted JAX gradient against one PyTorch ``backward`` of the same model and weights, and
variants of the JAX program that change one thing each:

- ``reference`` (bench/_reference.py, 53,968 parameters, batch 256 x 32, vocabulary 16):
  ``baseline`` (the model as written: an embedding gather, ``take_along_axis`` for the targets,
  hand-written attention), ``onehot`` (embedding and target selection as one-hot matmuls: no
  gather, and no scatter-add in the backward pass), ``onehot_dpa`` (plus
  ``jax.nn.dot_product_attention(..., is_causal=True)``), ``onehot_qkv`` (plus one fused
  q/k/v matmul); the forward pass alone (JAX ``loss`` against torch under ``no_grad``);
- ``mid`` (bench/scale.py's decoder at 4 layers, d = 256, vocabulary 4,096, batch 4 x 128,
  4.24M parameters): ``scan`` (the layers in a ``lax.scan``, as bench/scale.py builds it)
  against ``unrolled`` (the same layers in a Python loop, as the PyTorch twin runs them);
- ``flags``: the reference model's baseline against torch in fresh processes under XLA CPU
  flags (``XLA_FLAGS``), one process per flag set;
- ``profile``: the optimized HLO's op counts of the reference gradient (scatters, gathers,
  fusions, dots, loops) and torch's profiler's top operators of one ``backward``.

Usage::

    python bench/cpu_gradient.py               # every part, a few minutes on 2 cores
    python bench/cpu_gradient.py --only reference --reps 9

Writes ``bench/results/cpu_gradient.{json,md}`` through the quiet-machine guard
(``bench/_quiet.py``); docs/benchmarks/cpu.md reads its findings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench import _quiet as quiet  # noqa: E402
from bench import _reference as ref  # noqa: E402

_RECORDS: list[dict] = []
FLAG_SETS = {
    "default": "",
    "legacy_runtime": "--xla_cpu_use_thunk_runtime=false",
    "single_thread_eigen": "--xla_cpu_multi_thread_eigen=false",
    "no_fusion_emitters": "--xla_cpu_use_fusion_emitters=false",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "xnn_graph_greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_custom_call": "--xla_cpu_experimental_onednn_custom_call=true",
}
# the shapes of the mid-size decoder's matmuls (512 tokens): forward and the weight gradients
GEMM_SHAPES = [
    ("qkv", (512, 256), (256, 768)),
    ("fc", (512, 256), (256, 1024)),
    ("out", (512, 1024), (1024, 256)),
    ("readout", (512, 256), (256, 4096)),
    ("readout_grad_w", (256, 512), (512, 4096)),
    ("fc_grad_w", (256, 512), (512, 1024)),
    ("reference_w1", (8192, 64), (64, 256)),
    ("reference_w1_grad", (64, 8192), (8192, 256)),
]


def emit(record: dict) -> None:
    _RECORDS.append(record)
    print(json.dumps(record), flush=True)


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each zero-argument callable, called in turn ``reps`` times (+1 warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# --------------------------------------------------------------------------- reference model


def reference_loss(params, inputs, targets, *, onehot=False, dpa=False, fused_qkv=False):
    """bench/_reference.py's loss with the variants of the module docstring (same function)."""
    p = params
    dim, heads, seq = ref.DIM, ref.HEADS, ref.SEQ
    hd = dim // heads

    def layer_norm(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + ref.LN_EPS) * g + b

    if onehot:
        x = jax.nn.one_hot(inputs, ref.VOCAB, dtype=p["embed"].dtype) @ p["embed"]
    else:
        x = p["embed"][inputs]
    x = x + p["pos"][None]
    h = layer_norm(x, p["ln1_g"], p["ln1_b"])
    batch = inputs.shape[0]
    if fused_qkv:
        qkv = h @ jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1)
        q, k, v = (a.reshape(batch, seq, heads, hd) for a in jnp.split(qkv, 3, axis=-1))
    else:
        q, k, v = ((h @ p[w]).reshape(batch, seq, heads, hd) for w in ("wq", "wk", "wv"))
    if dpa:
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(batch, seq, dim)
    else:
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
        out = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
    x = x + out @ p["wo"]
    h = layer_norm(x, p["ln2_g"], p["ln2_b"])
    x = x + jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=True) @ p["w2"] + p["b2"]
    logits = layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["wout"] + p["bout"]
    logp = jax.nn.log_softmax(logits, axis=-1)
    if onehot:
        picked = jnp.sum(logp * jax.nn.one_hot(targets, ref.VOCAB, dtype=logp.dtype), axis=-1)
    else:
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)
    return -jnp.mean(picked)


REFERENCE_VARIANTS = {
    "baseline": {},
    "onehot": {"onehot": True},
    "onehot_dpa": {"onehot": True, "dpa": True},
    "onehot_qkv": {"onehot": True, "fused_qkv": True},
}


def reference_setup():
    import torch

    torch.manual_seed(0)
    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    inputs, targets = (jnp.asarray(a, dtype=jnp.int32) for a in ref.make_batch())
    model = ref.torch_model(ref.init_params())
    t_inputs, t_targets = (torch.as_tensor(a) for a in ref.make_batch())
    return params, inputs, targets, model, t_inputs, t_targets


def torch_backward(model, inputs, targets, criterion):
    model.zero_grad(set_to_none=True)
    criterion(model(inputs), targets).backward()


def part_reference(reps: int) -> dict:
    import torch

    params, inputs, targets, model, t_inputs, t_targets = reference_setup()
    grads, losses = {}, {}
    for name, kw in REFERENCE_VARIANTS.items():
        loss = jax.jit(lambda p, i, t, kw=kw: reference_loss(p, i, t, **kw))
        grad = jax.jit(jax.grad(lambda p, i, t, kw=kw: reference_loss(p, i, t, **kw)))
        start = time.perf_counter()
        jax.block_until_ready(grad(params, inputs, targets))
        emit({"part": "reference", "variant": name, "compile_s": time.perf_counter() - start})
        grads[name], losses[name] = grad, loss
    # every variant is the same function: check it before timing it
    base = jax.grad(ref.jax_loss)(params, inputs, targets)
    for name, grad in grads.items():
        diff = max(
            float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
            for a, b in zip(
                jax.tree_util.tree_leaves(grad(params, inputs, targets)),
                jax.tree_util.tree_leaves(base),
                strict=True,
            )
        )
        emit({"part": "reference", "variant": name, "max_rel_diff_vs_reference": diff})
    fns = {
        "torch_backward": lambda: torch_backward(model, t_inputs, t_targets, ref.torch_criterion)
    }
    for name, grad in grads.items():
        fns[f"jax_{name}"] = lambda g=grad: jax.block_until_ready(g(params, inputs, targets))

    def torch_forward():
        with torch.no_grad():
            ref.torch_criterion(model(t_inputs), t_targets)

    fns["torch_forward"] = torch_forward
    fns["jax_forward_baseline"] = lambda: jax.block_until_ready(
        losses["baseline"](params, inputs, targets)
    )
    fns["jax_forward_onehot"] = lambda: jax.block_until_ready(
        losses["onehot"](params, inputs, targets)
    )
    med = interleaved(fns, reps)
    out = {"ms": {k: 1e3 * v for k, v in med.items()}, "torch_threads": torch.get_num_threads()}
    out["over_torch"] = {
        k: med[k] / med["torch_backward"]
        for k in med
        if k.startswith("jax_") and "forward" not in k
    }
    out["forward_over_torch"] = {
        k: med[k] / med["torch_forward"] for k in med if k.startswith("jax_forward")
    }
    emit({"part": "reference", **out})
    return out


# --------------------------------------------------------------------------- mid-size decoder


def mid_config():
    from bench.scale import Config

    return Config(vocab=4096, dim=256, heads=4, hidden=1024, layers=4, seq=128, batch=4,
                  num_batches=1)  # fmt: skip


def unrolled_loss(cfg, params, batch):
    """bench/scale.py's decoder with the layers in a Python loop instead of ``lax.scan``."""
    from flax import nnx

    inputs, targets = batch
    p = params
    ln_eps = 1e-5

    def layer_norm(x, g, b):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + ln_eps) * g + b

    def get(tree, path):
        for key in path.split("/"):
            tree = tree[key]
        return tree[...] if isinstance(tree, nnx.Variable) else tree

    b, t = inputs.shape
    d, nh = cfg.dim, cfg.heads
    hd = d // nh
    wte = get(p, "wte/embedding")
    x = wte[inputs] + get(p, "wpe/embedding")[:t][None]
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    for layer in range(cfg.layers):

        def w(name, layer=layer):
            return get(p, f"blocks/{name}")[layer]

        h = layer_norm(x, w("ln1/scale"), w("ln1/bias")) @ w("qkv/kernel") + w("qkv/bias")
        q, k, v = (a.reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for a in jnp.split(h, 3, -1))
        scores = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), -1e9)
        out = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + out @ w("proj/kernel") + w("proj/bias")
        h = layer_norm(x, w("ln2/scale"), w("ln2/bias")) @ w("fc/kernel") + w("fc/bias")
        x = x + jax.nn.gelu(h, approximate=True) @ w("out/kernel") + w("out/bias")
    logits = layer_norm(x, get(p, "lnf/scale"), get(p, "lnf/bias")) @ wte.T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def mid_setup():
    """The mid-size decoder: ``(cfg, loss_fn, params, batch, torch twin, torch batch)``."""
    from bench.scale import build_jax, params_to_numpy, torch_model

    cfg = mid_config()
    loss_fn, params, batches = build_jax(cfg)
    batch = jax.tree_util.tree_map(lambda a: a[0], batches)
    model = torch_model(cfg, params_to_numpy(params))
    return cfg, loss_fn, params, batch, model, tuple(torch_long(a) for a in batch)


def part_mid(reps: int) -> dict:
    from bench.scale import torch_criterion

    cfg, loss_fn, params, batch, model, (t_inputs, t_targets) = mid_setup()
    scan = jax.jit(jax.grad(loss_fn))
    unrolled = jax.jit(jax.grad(lambda p, b: unrolled_loss(cfg, p, b)))
    for name, fn in (("scan", scan), ("unrolled", unrolled)):
        start = time.perf_counter()
        jax.block_until_ready(fn(params, batch))
        emit({"part": "mid", "variant": name, "compile_s": time.perf_counter() - start})
    a = jax.tree_util.tree_leaves(scan(params, batch))
    b = jax.tree_util.tree_leaves(unrolled(params, batch))
    diff = max(
        float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(y)) + 1e-30))
        for x, y in zip(a, b, strict=True)
    )
    med = interleaved(
        {
            "torch_backward": lambda: torch_backward(model, t_inputs, t_targets, torch_criterion),
            "jax_scan": lambda: jax.block_until_ready(scan(params, batch)),
            "jax_unrolled": lambda: jax.block_until_ready(unrolled(params, batch)),
        },
        reps,
    )
    out = {
        "num_params": sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params)),
        "ms": {k: 1e3 * v for k, v in med.items()},
        "over_torch": {k: med[k] / med["torch_backward"] for k in ("jax_scan", "jax_unrolled")},
        "max_rel_diff_unrolled_vs_scan": diff,
    }
    emit({"part": "mid", **out})
    return out


# --------------------------------------------------------------------------- separate processes


def time_child(framework: str, model: str, reps: int) -> dict:
    """In a fresh process: the median of ``reps`` gradients of one framework alone.

    Only the measured framework computes while it is timed: PyTorch's OpenMP threads spin after
    each operator (libgomp's wait policy) and XLA's Eigen threads likewise, so interleaving the
    two in one process takes cores from whichever runs next.
    """
    if model == "reference":
        np_params, (inputs, targets) = ref.init_params(), ref.make_batch()
    else:
        from bench.scale import build_jax, params_to_numpy

        cfg = mid_config()
        loss_fn, params, batches = build_jax(cfg)
        batch = jax.tree_util.tree_map(lambda a: np.array(a[0]), batches)
        np_params = params_to_numpy(params)
    if framework == "jax":
        if model == "reference":
            p = {k: jnp.asarray(v) for k, v in np_params.items()}
            args = (p, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32))
            grad = jax.jit(jax.grad(ref.jax_loss))
        else:
            args = (params, jax.tree_util.tree_map(jnp.asarray, batch))
            grad = jax.jit(jax.grad(loss_fn))

        def step():
            jax.block_until_ready(grad(*args))
    else:
        import torch

        if model == "reference":
            net, criterion = ref.torch_model(np_params), ref.torch_criterion
            t_in, t_tg = torch.as_tensor(inputs), torch.as_tensor(targets)
        else:
            from bench.scale import torch_criterion, torch_model

            net, criterion = torch_model(cfg, np_params), torch_criterion
            t_in, t_tg = (torch_long(a) for a in batch)
        time.sleep(0.5)  # let the threads that built the model go idle

        def step():
            torch_backward(net, t_in, t_tg, criterion)

    med = interleaved({framework: step}, reps)[framework]
    return {"framework": framework, "model": model, "ms": 1e3 * med}


def part_separate(reps: int, rounds: int = 3) -> dict:
    """Each framework's gradient timed alone in its own process, processes alternated."""
    out = {}
    for model in ("reference", "mid"):
        times: dict[str, list[float]] = {"jax": [], "torch": []}
        for _ in range(rounds):
            for framework in ("torch", "jax"):
                cmd = [sys.executable, os.path.abspath(__file__), "--child-time",
                       f"{framework}:{model}", "--reps", str(reps)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
                rec = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
                times[framework].append(rec["ms"])
        med = {k: statistics.median(v) for k, v in times.items()}
        out[model] = {"ms": med, "runs_ms": times, "jax_over_torch": med["jax"] / med["torch"]}
        emit({"part": "separate", "model": model, **out[model]})
    return out


# --------------------------------------------------------------------------- XLA flags


def flag_child(reps: int) -> dict:
    """In a fresh process (XLA_FLAGS set by the parent): gradients over torch's ``backward``."""
    from bench.scale import torch_criterion

    params, inputs, targets, model, t_inputs, t_targets = reference_setup()
    grad = jax.jit(jax.grad(ref.jax_loss))
    onehot = jax.jit(jax.grad(lambda p, i, t: reference_loss(p, i, t, onehot=True)))
    _, loss_fn, mid_params, batch, mid_model, (m_inputs, m_targets) = mid_setup()
    mid_grad = jax.jit(jax.grad(loss_fn))
    med = interleaved(
        {
            "torch_backward": lambda: torch_backward(
                model, t_inputs, t_targets, ref.torch_criterion
            ),
            "jax_baseline": lambda: jax.block_until_ready(grad(params, inputs, targets)),
            "jax_onehot": lambda: jax.block_until_ready(onehot(params, inputs, targets)),
            "torch_mid": lambda: torch_backward(mid_model, m_inputs, m_targets, torch_criterion),
            "jax_mid": lambda: jax.block_until_ready(mid_grad(mid_params, batch)),
        },
        reps,
    )
    return {
        "ms": {k: 1e3 * v for k, v in med.items()},
        "over_torch": med["jax_baseline"] / med["torch_backward"],
        "onehot_over_torch": med["jax_onehot"] / med["torch_backward"],
        "mid_over_torch": med["jax_mid"] / med["torch_mid"],
    }


def torch_long(a):
    import torch

    return torch.as_tensor(np.array(a)).long()


def part_flags(reps: int) -> dict:
    out = {}
    for name, flags in FLAG_SETS.items():
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
        cmd = [sys.executable, os.path.abspath(__file__), "--child-flags", "--reps", str(reps)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            rec = {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
        else:
            rec = json.loads(lines[-1])
        rec["xla_flags"] = flags
        emit({"part": "flags", "flag_set": name, **rec})
        out[name] = rec
    return out


# --------------------------------------------------------------------------- matmuls


def part_gemm(reps: int) -> dict:
    """One float32 matmul of each shape: jitted ``jnp.dot`` (XLA CPU) against ``torch.mm``."""
    import torch

    rng = np.random.default_rng(0)
    out = {}
    total_jax = total_torch = 0.0
    for name, sa, sb in GEMM_SHAPES:
        a, b = (rng.standard_normal(s).astype(np.float32) for s in (sa, sb))
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        dot = jax.jit(jnp.dot)
        med = interleaved(
            {
                "jax": lambda dot=dot, ja=ja, jb=jb: jax.block_until_ready(dot(ja, jb)),
                "torch": lambda ta=ta, tb=tb: torch.mm(ta, tb),
            },
            reps,
        )
        gflop = 2 * sa[0] * sa[1] * sb[1] / 1e9
        out[name] = {
            "shape": f"{sa[0]}x{sa[1]} @ {sb[0]}x{sb[1]}",
            "jax_gflops": gflop / med["jax"],
            "torch_gflops": gflop / med["torch"],
            "jax_over_torch": med["jax"] / med["torch"],
        }
        total_jax += med["jax"]
        total_torch += med["torch"]
        emit({"part": "gemm", "name": name, **out[name]})
    out["all"] = {"jax_over_torch": total_jax / total_torch}
    return out


# --------------------------------------------------------------------------- profiles


def part_profile() -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    params, inputs, targets, model, t_inputs, t_targets = reference_setup()
    out = {}
    for name, kw in (("baseline", {}), ("onehot", {"onehot": True})):
        grad = jax.jit(jax.grad(lambda p, i, t, kw=kw: reference_loss(p, i, t, **kw)))
        hlo = grad.lower(params, inputs, targets).compile().as_text()
        ops = re.findall(r"=\s*\S+\s+([a-z][\w-]*)\(", hlo)
        counts = {op: ops.count(op) for op in sorted(set(ops))}
        keep = ("scatter", "gather", "fusion", "dot", "while", "custom-call", "reduce", "copy",
                "transpose", "call")  # fmt: skip
        out[f"hlo_{name}"] = {k: counts.get(k, 0) for k in keep}
        out[f"hlo_{name}"]["instructions"] = len(ops)
    for _ in range(3):
        torch_backward(model, t_inputs, t_targets, ref.torch_criterion)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            torch_backward(model, t_inputs, t_targets, ref.torch_criterion)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    out["torch_top_ops"] = [
        {"op": e.key, "self_share": e.self_cpu_time_total / total, "calls": e.count // 5}
        for e in rows[:10]
    ]
    out["torch_threads"] = torch.get_num_threads()
    emit({"part": "profile", **out})
    return out


# --------------------------------------------------------------------------- tables


def table(results: dict) -> str:
    lines = []
    if "separate" in results:
        lines += [
            "One gradient, each framework alone in its own process (processes alternated, "
            "medians), as a user runs it:",
            "",
            "| model | PyTorch `backward` ms | JAX `jit(grad)` ms | JAX over PyTorch |",
            "|---|---|---|---|",
        ]
        for model, rec in results["separate"].items():
            label = "54k reference" if model == "reference" else "mid-size decoder (4.24M)"
            lines.append(f"| {label} | {rec['ms']['torch']:.1f} | {rec['ms']['jax']:.1f} | "
                         f"**{rec['jax_over_torch']:.2f}** |")  # fmt: skip
        lines.append("")
    if "reference" in results:
        r = results["reference"]
        lines += [
            "Interleaved in one process (54k reference model, batch 256 x 32, medians; see the "
            "text for why these ratios are not the frameworks' own):",
            "",
            "| JAX program | ms | over PyTorch |",
            "|---|---|---|",
            f"| PyTorch `backward` | {r['ms']['torch_backward']:.1f} | 1 |",
        ]
        for name in REFERENCE_VARIANTS:
            key = f"jax_{name}"
            lines.append(f"| {name} | {r['ms'][key]:.1f} | {r['over_torch'][key]:.2f} |")
        lines.append(
            f"| forward only: JAX baseline / onehot over torch `no_grad` | "
            f"{r['ms']['jax_forward_baseline']:.1f} / {r['ms']['jax_forward_onehot']:.1f} | "
            f"{r['forward_over_torch']['jax_forward_baseline']:.2f} / "
            f"{r['forward_over_torch']['jax_forward_onehot']:.2f} |"
        )
        lines.append("")
    if "mid" in results:
        r = results["mid"]
        lines += [
            f"Mid-size decoder ({r['num_params'] / 1e6:.2f}M parameters, 4 layers, batch 4 x 128):",
            "",
            "| JAX program | ms | over PyTorch |",
            "|---|---|---|",
            f"| PyTorch `backward` | {r['ms']['torch_backward']:.1f} | 1 |",
            f"| layers in `lax.scan` | {r['ms']['jax_scan']:.1f} | "
            f"{r['over_torch']['jax_scan']:.2f} |",
            f"| layers unrolled | {r['ms']['jax_unrolled']:.1f} | "
            f"{r['over_torch']['jax_unrolled']:.2f} |",
            "",
        ]
    if "flags" in results:
        lines += ["XLA CPU flags (a fresh process each; JAX gradient over PyTorch's `backward`):",
                  "", "| flags | reference, baseline | reference, onehot | mid-size decoder |",
                  "|---|---|---|---|"]  # fmt: skip
        for name, rec in results["flags"].items():
            if "over_torch" in rec:
                cells = [f"{rec[k]:.2f}" for k in ("over_torch", "onehot_over_torch",
                                                    "mid_over_torch")]  # fmt: skip
            else:
                cells = [rec.get("error", ""), "", ""]
            lines.append(f"| {name} (`{rec['xla_flags'] or 'none'}`) | " + " | ".join(cells) + " |")
        lines.append("")
    if "gemm" in results:
        lines += ["One float32 matmul, jitted `jnp.dot` (XLA CPU) against `torch.mm`, interleaved:",
                  "", "| matmul | shape | XLA GFLOP/s | torch GFLOP/s | XLA time over torch's |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, rec in results["gemm"].items():
            if name == "all":
                continue
            lines.append(f"| {name} | {rec['shape']} | {rec['jax_gflops']:.0f} | "
                         f"{rec['torch_gflops']:.0f} | {rec['jax_over_torch']:.2f} |")  # fmt: skip
        lines.append(f"| all together | | | | {results['gemm']['all']['jax_over_torch']:.2f} |")
        lines.append("")
    if "profile" in results:
        r = results["profile"]
        lines += ["Optimized HLO of the reference gradient (op counts):", "",
                  "| program | " + " | ".join(r["hlo_baseline"]) + " |",
                  "|---|" + "---|" * len(r["hlo_baseline"])]  # fmt: skip
        for name in ("baseline", "onehot"):
            lines.append(
                f"| {name} | " + " | ".join(str(v) for v in r[f"hlo_{name}"].values()) + " |"
            )
        lines += ["", f"PyTorch profiler, one `backward` ({r['torch_threads']} threads), top "
                  "operators by self CPU time:", "", "| operator | share | calls |",
                  "|---|---|---|"]  # fmt: skip
        for row in r["torch_top_ops"]:
            lines.append(f"| `{row['op']}` | {row['self_share']:.1%} | {row['calls']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=["separate", "reference", "mid", "flags", "gemm", "profile"],
    )
    parser.add_argument("--reps", type=int, default=9, help="interleaved repeats (>= 1)")
    parser.add_argument("--child-flags", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-time", help=argparse.SUPPRESS)
    quiet.add_arguments(parser)
    args = parser.parse_args()
    if args.reps < 1:
        parser.error(f"--reps: expected an int >= 1, got {args.reps}")
    if args.child_flags:
        print(json.dumps(flag_child(args.reps)), flush=True)
        return
    if args.child_time:
        framework, model = args.child_time.split(":")
        print(json.dumps(time_child(framework, model, args.reps)), flush=True)
        return
    parts = args.only or ["separate", "reference", "mid", "flags", "gemm", "profile"]
    monitor = quiet.Monitor()
    emit({"record": "setup", "jax": jax.__version__, "backend": jax.default_backend(),
          "cpu_count": os.cpu_count()})  # fmt: skip
    results = {}
    if "separate" in parts:
        results["separate"] = part_separate(args.reps)
    if "reference" in parts:
        results["reference"] = part_reference(args.reps)
    if "mid" in parts:
        results["mid"] = part_mid(max(3, args.reps // 2))
    if "flags" in parts:
        results["flags"] = part_flags(args.reps)
    if "gemm" in parts:
        results["gemm"] = part_gemm(args.reps)
    if "profile" in parts:
        results["profile"] = part_profile()
    conditions = monitor.stop()
    section = quiet.Section(results, table(results), list(_RECORDS), interleaved=True)
    key = "+".join(parts) if args.only else "gradient"
    quiet.finish("cpu_gradient", {key: section}, conditions, args)


if __name__ == "__main__":
    main()
