"""Calibration of ``mode="auto"`` and ``chunk_size="auto"`` of Hutchinson on the 1B and 8B decoders.

One command (8 forced CPU devices; nothing parameter-sized is allocated; under the shared lock
of the heavy benchmarks)::

    python bench/auto_budget.py                  # the 1B and 8B decoders
    python bench/auto_budget.py --configs tiny   # a quick check

For each decoder of :func:`jaxbounds.models.decoder_config` (bfloat16 weights placed FSDP on an
``("fsdp",)`` mesh of 8 devices by :func:`bench.llm_plan.placed_decoder`, cast to float32 inside
the program, batch 8 x 1024), two things side by side:

- what the kernels' rules estimate, traced only (:mod:`kernels._memory`: one gradient's
  residuals, a quadratic form's probe, a linearised product, the budget, and what
  ``mode="auto"`` and ``chunk_size="auto"`` resolve to, on a CPU and on an accelerator);
- what XLA plans (``jax.jit(f).lower(...).compile().memory_analysis()``, per device): the
  gradient, ``hutchinson_trace`` of :func:`kernels.hvp` with 2 probes one at a time in
  ``mode="forms"`` and in ``mode="products"``.

Estimates are bytes of the whole (global) arrays; XLA's plans are per device, so the two are
compared through their ratios to the gradient's. Records: ``bench/results/auto_budget.json``
(one object per decoder; a run replaces the decoders it ran) and the table
``bench/results/auto_budget.md``. The persistent compilation cache is off (as in
``bench/llm_plan.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import llm_plan  # noqa: E402

OUT = ROOT / "bench" / "results"
CONFIGS = ("1b", "8b")


def estimates(loss, params, batch) -> dict:
    """The kernels' memory rules at the decoder, traced only (global bytes)."""
    import jax

    import kernels
    from kernels import _backend, _memory

    out: dict = {}

    def rules(p, b):
        op = kernels.hvp(loss, llm_plan._to_f32(p), b)
        f32 = op.params
        scalar = op.scalar_loss()
        product = op.linearize()[0]
        out["gradient_bytes"] = _memory.gradient_bytes(scalar, f32)
        out["residual_bytes"] = _memory.linear_residual_bytes(product, f32)
        out["forms_program_bytes"] = _memory.program_bytes(op.form, f32)
        out["forms_bytes"] = _memory.sample_bytes(
            "forms", params=f32, program=out["forms_program_bytes"]
        )
        out["products_bytes"] = _memory.sample_bytes(
            "products", params=f32, residuals=out["residual_bytes"]
        )
        out["budget_bytes"] = _memory.memory_budget("hutchinson", out["gradient_bytes"])
        out["products_fit"] = _memory.products_fit("hutchinson", product, f32, f32, scalar, op.form)
        real = _backend.sample_platform
        try:
            _backend.sample_platform = lambda: "gpu"  # what an accelerator would resolve
            out["accelerator_chunk"] = _memory.hutchinson_chunk("auto", op)
        finally:
            _backend.sample_platform = real
        out["cpu_chunk"] = _memory.hutchinson_chunk("auto", op)
        return 0

    jax.make_jaxpr(rules)(params, batch)
    return out


def plans(loss, shardings, params, batch) -> dict:
    """XLA's per-device plans (GiB) and compile seconds of the gradient and the two modes."""
    import jax

    import kernels

    key = jax.random.key(0)
    fns = {
        "gradient": llm_plan.programs(loss, 1, shardings)["gradient"],
        "forms": lambda p, b, k: kernels.hutchinson_trace(
            kernels.hvp(loss, p, b), p, k, num_samples=2, chunk_size=1, mode="forms"
        ),
        "products": lambda p, b, k: kernels.hutchinson_trace(
            kernels.hvp(loss, p, b), p, k, num_samples=2, chunk_size=1, mode="products"
        ),
    }
    out = {}
    for name, fn in fns.items():
        lowered = jax.jit(lambda p, b, k, fn=fn: fn(llm_plan._to_f32(p), b, k)).lower(
            params, batch, key
        )
        start = time.perf_counter()
        compiled = lowered.compile()
        seconds = time.perf_counter() - start
        mem = compiled.memory_analysis()
        out[name] = {
            "temp_gib": mem.temp_size_in_bytes / 2**30,
            "per_device_gib": (
                mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
            )
            / 2**30,
            "compile_wall_s": round(seconds, 1),
        }
        del compiled, lowered
        jax.clear_caches()
    return out


def measure(name: str) -> dict:
    import jax
    import jax.numpy as jnp

    n, loss, mesh, shardings, args, batch, seq = llm_plan.placed_decoder(name)
    params = args(jnp.bfloat16)
    record = {
        "decoder": name,
        "num_params": n,
        "mesh": dict(mesh.shape),
        "batch": [llm_plan.BATCH, seq],
        "platform": jax.devices()[0].platform,
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    record["estimates"] = estimates(loss, params, batch)
    record["plans"] = plans(loss, shardings, params, batch)
    record["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return record


def markdown(records: list[dict]) -> str:
    lines = [
        "Hutchinson's memory rules (kernels/_memory.py) against XLA's plans, Llama-style decoders,"
        " bfloat16 weights cast to float32 inside the program, FSDP over 8 forced CPU devices,"
        " batch 8 x 1024, compiled without running. Estimates: global bytes, traced only;"
        " plans: XLA's temporaries per device; both as multiples of the gradient's. \"rule:"
        ' products?" is `products_fit` (the choice of `mode="auto"` off a mesh; on a mesh'
        " it takes quadratic forms).",
        "",
        "| decoder | gradient est. (GiB) | forms est. | products est. | budget (GiB) |"
        " rule: products? | auto chunk (accelerator) | gradient plan (GiB / device) |"
        " forms plan | products plan | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        e, p = r["estimates"], r["plans"]
        g, gp = e["gradient_bytes"], p["gradient"]["temp_gib"]
        lines.append(
            f"| {r['decoder']} ({r['num_params'] / 1e9:.2f}B) | {g / 2**30:.2f} | "
            f"{e['forms_bytes'] / g:.2f}x | {e['products_bytes'] / g:.2f}x | "
            f"{e['budget_bytes'] / 2**30:.2f} | {'yes' if e['products_fit'] else 'no'} | "
            f"{e['accelerator_chunk']} | {gp:.2f} | {p['forms']['temp_gib'] / gp:.2f}x | "
            f"{p['products']['temp_gib'] / gp:.2f}x | {r['load_start'][0]} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", default=str(OUT / "auto_budget.json"))
    parser.add_argument("--render", action="store_true", help="rewrite the table from --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configs = llm_plan.decoder_names(parser, args.configs)
    out = Path(args.out)
    llm_plan.records_file(parser, out, args.render)
    if args.render:
        out.with_suffix(".md").write_text(markdown(json.loads(out.read_text())))
        return
    if args.child:
        llm_plan._setup()
        print("RECORD " + json.dumps(measure(configs[0])), flush=True)
        return
    records = []
    if out.exists():
        records = [r for r in json.loads(out.read_text()) if r["decoder"] not in configs]
    for name in configs:  # one fresh process per decoder
        cmd = [sys.executable, __file__, "--child", "--configs", name]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = [ln for ln in proc.stdout.splitlines() if ln.startswith("RECORD ")]
        if not got:
            sys.exit(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        record = json.loads(got[0][len("RECORD ") :])
        print(json.dumps(record), flush=True)
        records.append(record)
    order = {n: i for i, n in enumerate(("tiny", "124m", "1b", "8b"))}
    records.sort(key=lambda r: order.get(r["decoder"], 9))
    llm_plan.write_records(out, records, markdown(records))


if __name__ == "__main__":
    main()
