"""Kernels on a sharded decoder: per-device memory (XLA's analysis) and time, 1/2/4/8 ways.

One command (CPU with forced devices; the same script on a GPU host)::

    python bench/sharded.py            # GPT-2-small-sized decoder (124M parameters; the
                                       # vocabulary padded to 50304 so that it splits 8 ways)
    python bench/sharded.py --quick    # a small decoder: a smoke test, with timings

A decoder (pre-LN, causal attention, tied readout; the layers stacked and scanned) is placed on
a mesh of 1, 2, 4 or 8 devices in three ways: ``model`` (tensor parallel: qkv and fc split on
their output features, proj and out on their input features, the embedding on the vocabulary),
``fsdp`` (the largest axis of every matrix split, the batch split too) and ``data x model``
(a ``(2, k/2)`` mesh: the batch on ``data``, tensor parallel on ``model``). For each placement
the kernels (a Hutchinson probe of ``hessian_trace``, ``top_eigenvalues`` for 10 Lanczos steps
with and without ``linearize``, ``worst_case_sharpness`` for 2 ascent steps) and one gradient
are compiled from abstract placed arguments (no parameter is allocated) and XLA's
``compiled.memory_analysis()`` gives per-device arguments + temporaries. The ratio of a
kernel's per-device memory at k ways to the same kernel's at 1 way is the number of issue 31
(goal at 4 ways over ``model``: <= 0.35). ``--quick`` (and ``--time``) also run each program
and report seconds per probe / step against one gradient of the same placement.

Records: one JSON line per (placement, ways, program) in ``bench/results/sharded.jsonl`` (or
``sharded_quick.jsonl``) and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

WAYS = (1, 2, 4, 8)
ROOT = Path(__file__).resolve().parents[1]


def _setup_devices(count: int) -> None:
    """Force ``count`` host devices (before jax starts) unless an accelerator host is asked."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


FULL = {"vocab": 50304, "dim": 768, "heads": 12, "hidden": 3072, "layers": 12, "seq": 128,
        "batch": 8}  # fmt: skip
QUICK = {"vocab": 512, "dim": 64, "heads": 4, "hidden": 256, "layers": 2, "seq": 32, "batch": 8}


def num_params(cfg: dict) -> int:
    d, h, n = cfg["dim"], cfg["hidden"], cfg["layers"]
    block = 4 * d + d * 3 * d + d * d + d * h + h * d
    return cfg["vocab"] * d + cfg["seq"] * d + n * block + 2 * d


def shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    d, h, n = cfg["dim"], cfg["hidden"], cfg["layers"]
    return {
        "wte": (cfg["vocab"], d),
        "wpe": (cfg["seq"], d),
        "ln1": (n, 2, d),
        "qkv": (n, d, 3 * d),
        "proj": (n, d, d),
        "ln2": (n, 2, d),
        "fc": (n, d, h),
        "out": (n, h, d),
        "lnf": (2, d),
    }


def specs(placement: str):
    """Partition specs of the leaves (and of the batch) for a placement."""
    from jax.sharding import PartitionSpec as P

    if placement == "model" or placement == "data_model":
        params = {
            "wte": P("model", None),
            "qkv": P(None, None, "model"),
            "proj": P(None, "model", None),
            "fc": P(None, None, "model"),
            "out": P(None, "model", None),
        }
        batch = P("data") if placement == "data_model" else P()
    else:  # fsdp: the largest axis of every matrix, and the batch
        params = {
            "wte": P("fsdp", None),
            "qkv": P(None, None, "fsdp"),
            "proj": P(None, "fsdp", None),
            "fc": P(None, None, "fsdp"),
            "out": P(None, "fsdp", None),
        }
        batch = P("fsdp")
    return params, batch


def mesh_for(placement: str, ways: int):
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = np.asarray(jax.devices()[:ways])
    if placement == "data_model":
        data = 2 if ways >= 2 else 1
        return Mesh(devices.reshape(data, ways // data), ("data", "model"))
    return Mesh(devices, ("fsdp",) if placement == "fsdp" else ("model",))


def loss_fn(cfg: dict):
    import jax
    import jax.numpy as jnp

    heads = cfg["heads"]

    def norm(x, scale_shift):
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.var(x, -1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * (1 + scale_shift[0]) + scale_shift[1]

    def block(x, p):
        b, t, d = x.shape
        hd = d // heads
        q, k, v = jnp.split(norm(x, p["ln1"]) @ p["qkv"], 3, axis=-1)
        q, k, v = (a.reshape(b, t, heads, hd).transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
        att = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + att @ p["proj"]
        return x + jax.nn.gelu(norm(x, p["ln2"]) @ p["fc"], approximate=True) @ p["out"]

    def loss(params, batch):
        inputs, targets = batch
        x = params["wte"][inputs] + params["wpe"][None, : inputs.shape[1]]
        layers = {k: params[k] for k in ("ln1", "qkv", "proj", "ln2", "fc", "out")}
        x = jax.lax.scan(lambda x, p: (block(x, p), None), x, layers)[0]
        logits = norm(x, params["lnf"]) @ params["wte"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    return loss


def programs(loss):
    """name -> (params, batch, key) -> output: one gradient and the kernels measured."""
    import jax

    from kernels import curvature, sharpness

    ball = sharpness.Perturbation("l2_ball", 0.05)
    return {
        "gradient": lambda p, b, k: jax.value_and_grad(loss)(p, b),
        "hessian_trace_probe": lambda p, b, k: (
            curvature.hessian_trace(loss, p, b, k, num_samples=2, chunk_size=1).mean
        ),
        "top_eigenvalues_10": lambda p, b, k: curvature.top_eigenvalues(
            curvature.hvp(loss, p, b), p, k, num_steps=10
        ),
        "top_eigenvalues_10_recomputed": lambda p, b, k: curvature.top_eigenvalues(
            curvature.hvp(loss, p, b), p, k, num_steps=10, linearize=False
        ),
        "worst_case_sharpness_2": lambda p, b, k: (
            sharpness.worst_case_sharpness(loss, p, b, k, perturbation=ball, num_steps=2).value
        ),
    }


# units of work per program run (for the time per probe / step / pair)
UNITS = {"hessian_trace_probe": 2, "top_eigenvalues_10": 10, "top_eigenvalues_10_recomputed": 10,
         "worst_case_sharpness_2": 3, "gradient": 1}  # fmt: skip


def measure(
    cfg: dict, placement: str, ways: int, timing: bool, only: list[str] | None = None
) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = mesh_for(placement, ways)
    param_specs, batch_spec = specs(placement)
    leaf_shapes = shapes(cfg)
    abstract = {
        k: jax.ShapeDtypeStruct(
            s, jnp.float32, sharding=NamedSharding(mesh, param_specs.get(k, P()))
        )
        for k, s in leaf_shapes.items()
    }
    tok = (cfg["batch"], cfg["seq"])
    batch_sharding = NamedSharding(mesh, batch_spec)
    abstract_batch = tuple(
        jax.ShapeDtypeStruct(tok, jnp.int32, sharding=batch_sharding) for _ in range(2)
    )
    key = jax.random.key(0)
    loss = loss_fn(cfg)
    records = []
    concrete = None
    for name, fn in programs(loss).items():
        if only is not None and name not in only:
            continue
        record = {"placement": placement, "ways": ways, "program": name,
                  "num_params": num_params(cfg), "mesh": dict(mesh.shape),
                  "platform": jax.devices()[0].platform}  # fmt: skip
        start = time.perf_counter()
        try:
            compiled = jax.jit(fn).lower(abstract, abstract_batch, key).compile()
        except Exception as err:  # recorded: a program that does not compile is a result
            record["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            records.append(record)
            continue
        record["compile_s"] = round(time.perf_counter() - start, 2)
        mem = compiled.memory_analysis()
        record["argument_mb"] = mem.argument_size_in_bytes / 2**20
        record["temp_mb"] = mem.temp_size_in_bytes / 2**20
        record["per_device_mb"] = record["argument_mb"] + record["temp_mb"]
        if timing:
            if concrete is None:
                rng = np.random.default_rng(0)
                concrete = (
                    {k: jax.device_put((0.02 * rng.normal(size=s)).astype(np.float32),
                                       a.sharding) for k, s, a in
                     ((k, s, abstract[k]) for k, s in leaf_shapes.items())},
                    tuple(jax.device_put(rng.integers(0, cfg["vocab"], size=tok).astype(np.int32),
                                         batch_sharding) for _ in range(2)),
                )  # fmt: skip
            jax.block_until_ready(compiled(*concrete, key))
            start = time.perf_counter()
            jax.block_until_ready(compiled(*concrete, key))
            record["seconds_per_unit"] = (time.perf_counter() - start) / UNITS[name]
            record["timing_note"] = "one run on a shared, loaded 2-core machine"
        records.append(record)
    return records


def summarize(records: list[dict]) -> list[dict]:
    """Ratios: per-device memory against the same program at 1 way; time against a gradient."""
    # the unsharded reference: the program on 1 device (the first placement run at 1 way)
    base: dict = {}
    for r in records:
        if r["ways"] == 1:
            base.setdefault(r["program"], r.get("per_device_mb"))
    grads = {(r["placement"], r["ways"]): r for r in records if r["program"] == "gradient"}
    for r in records:
        if r.get("per_device_mb") and base.get(r["program"]):
            r["memory_vs_unsharded"] = round(r["per_device_mb"] / base[r["program"]], 3)
        grad = grads.get((r["placement"], r["ways"]), {})
        if r.get("temp_mb") is not None and grad.get("temp_mb"):
            r["temp_vs_gradient"] = round(r["temp_mb"] / grad["temp_mb"], 3)
        if r.get("seconds_per_unit") and grad.get("seconds_per_unit"):
            r["time_vs_gradient"] = round(r["seconds_per_unit"] / grad["seconds_per_unit"], 3)
    return records


def markdown(records: list[dict], cfg: dict) -> str:
    lines = [
        f"Decoder of {num_params(cfg) / 1e6:.1f}M parameters, batch {cfg['batch']} x "
        f"{cfg['seq']} tokens, float32; per-device arguments + temporaries from XLA's memory "
        "analysis (compile only); ratio: against the same program unsharded (1 way).",
        "",
        "| placement | ways | program | per device (MB) | vs 1 way | temporaries vs gradient |"
        " s / unit | vs gradient |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['placement']} | {r['ways']} | {r['program']} | {r['error'][:60]}"
                         " | | | | |")  # fmt: skip
            continue
        secs = r.get("seconds_per_unit")
        lines.append(
            f"| {r['placement']} | {r['ways']} | {r['program']} | {r['per_device_mb']:.1f} | "
            f"{r.get('memory_vs_unsharded', '')} | {r.get('temp_vs_gradient', '')} | "
            f"{'' if secs is None else f'{secs:.3f}'} | {r.get('time_vs_gradient', '')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small decoder, with timings")
    parser.add_argument("--time", action="store_true", help="also time the full-size programs")
    parser.add_argument("--placements", default="model,fsdp,data_model")
    parser.add_argument("--ways", default=",".join(map(str, WAYS)))
    parser.add_argument("--programs", default=None, help="comma-separated subset (default: all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    ways = [int(w) for w in args.ways.split(",")]
    _setup_devices(max(ways))
    import jax

    sys.path.insert(0, str(ROOT))
    if len(jax.devices()) < max(ways):
        ways = [w for w in ways if w <= len(jax.devices())]
    cfg = QUICK if args.quick else FULL
    records: list[dict] = []
    for placement in args.placements.split(","):
        for k in ways:
            if placement == "data_model" and k < 2:
                continue  # the unsharded reference is the model placement's 1 way
            only = None if args.programs is None else args.programs.split(",")
            records.extend(measure(cfg, placement, k, args.quick or args.time, only))
    records = summarize(records)
    stem = "sharded_quick" if args.quick else "sharded"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    table = markdown(records, cfg)
    (out / f"{stem}.md").write_text(table)
    print(table)
    return records


if __name__ == "__main__":
    main()
